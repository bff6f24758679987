"""An in-process fake agent for client tests: a gRPC ``Agent`` servicer on a unix socket that keeps every batch."""
from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from agent.markers import batch_markers
from chopper.proto.chopper.v1 import agent_pb2, agent_pb2_grpc


def as_messages(batch: agent_pb2.MarkerBatch) -> agent_pb2.MarkerBatch:
    """``batch`` with the markers of its ``columns`` as ``Marker`` messages, the agent's way, so tests read one form."""
    if not batch.columns.ts_ns:
        return batch
    copy = agent_pb2.MarkerBatch()
    copy.CopyFrom(batch)
    copy.ClearField("columns")
    del copy.markers[:]
    copy.markers.extend(batch_markers(batch))
    return copy


class Recorder(agent_pb2_grpc.AgentServicer):
    """A minimal agent: keeps every batch it receives, answers with the count when a stream ends."""

    def __init__(self) -> None:
        self.batches: list[agent_pb2.MarkerBatch] = []  # as_messages of each
        self.wire: list[agent_pb2.MarkerBatch] = []  # each batch as sent
        self.cond = threading.Condition()
        self.streams = 0

    def PushMarkers(self, request_iterator: Iterator[agent_pb2.MarkerBatch], context: grpc.ServicerContext):
        with self.cond:
            self.streams += 1
        n = 0
        for received in request_iterator:
            batch = as_messages(received)
            with self.cond:
                self.batches.append(batch)
                self.wire.append(received)
                self.cond.notify_all()
            n += len(batch.markers)
        return agent_pb2.PushMarkersResponse(accepted=n)

    def markers(self) -> list[agent_pb2.Marker]:
        """Every marker received so far, in arrival order."""
        with self.cond:
            return [m for b in self.batches for m in b.markers]

    def wait_for(self, pred: Callable[[list[agent_pb2.Marker]], bool], timeout: float = 30.0) -> bool:
        """Whether ``pred(markers received)`` came true within ``timeout`` seconds."""
        with self.cond:
            return self.cond.wait_for(lambda: pred([m for b in self.batches for m in b.markers]), timeout)


def start_server(path: Path, servicer: agent_pb2_grpc.AgentServicer,
                 options: Sequence[tuple[str, Any]] = ()) -> grpc.Server:
    """``servicer`` served on the unix socket ``path``, started; ``options`` are gRPC channel arguments."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=list(options))
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    assert server.add_insecure_port(f"unix://{path}") != 0
    server.start()
    return server


def short_socket_path(tmp_path: Path) -> Iterator[Path]:
    """A socket path in ``tmp_path``, or in /tmp where that is too long for a unix socket."""
    path = tmp_path / "agent.sock"
    if len(str(path)) < 100:  # sun_path holds 108 bytes
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="chp", dir="/tmp") as d:
        yield Path(d) / "agent.sock"
