"""Deliver step summaries to a running aggregator over real gRPC, as an agent's sender does."""
from __future__ import annotations

import grpc

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc


def deliver(address: str, agent: str, incarnation: str, batches: list[list[pb.StepSummary]],
            first_seq: int = 1) -> list[int]:
    """Send ``batches`` on one ``Deliver`` stream, numbered from ``first_seq``; the acks received, one per batch."""
    requests = []
    seq = first_seq
    for summaries in batches:
        requests.append(apb.SummaryBatch(agent=agent, incarnation=incarnation, seq=range(seq, seq + len(summaries)),
                                         summaries=summaries))
        seq += len(summaries)
    with grpc.insecure_channel(address) as channel:
        return [ack.acked_seq for ack in apb_grpc.AggregatorStub(channel).Deliver(iter(requests), timeout=60)]
