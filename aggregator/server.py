"""The aggregator's gRPC surface: a thin ``chopper.v1.Aggregator`` servicer over ``Aggregator``, plus health.

Servicers only decode and encode; logic lives in ``aggregator.service.Aggregator``. Every method
the ``.proto`` declares is registered through ``chopper.daemon.grpc_decode.checked_service``, so a
garbled message is counted (``chopper_aggregator_messages_undecodable_total{method}``) and
answered with a clear ``INVALID_ARGUMENT`` before the servicer sees it, instead of gRPC's generic
internal error. A batch whose ``seq`` and
``summaries`` differ in length, or without agent or incarnation, is answered the same way
(``chopper_aggregator_batches_invalid_total``).

With a write-ahead log, ``Aggregator.deliver`` returns only once the batch is fsynced, so the
acknowledgement is yielded after the commit; the stream's worker thread waits, not the others
(one group commit releases every waiting stream). A log that cannot write ends the stream with
``UNAVAILABLE``: the agent keeps the batch and resends it after reconnecting.

Every RPC passes ``chopper.daemon.access`` (size and per-client rate limits); ``listen`` speaks TLS, or
mutual TLS with ``tls_client_ca``, when ``tls_cert`` is set (docs/SECURITY.md). ``listen`` is
bound once with a plain socket before gRPC binds it (``chopper.daemon.listen_check``), so that a port in use, an
address of another machine or a name that does not resolve is refused in words naming the
setting and the fix, not in gRPC's text.
"""
from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc

from aggregator.config import AggregatorSettings
from aggregator.service import Aggregator
from aggregator.wal import WalError
from chopper.daemon.grpc_decode import checked_service
from chopper.daemon.serving import SecureServer, server_tls
from chopper.proto.chopper.v1 import aggregator_pb2 as apb

AGGREGATOR_SERVICE = apb.DESCRIPTOR.services_by_name["Aggregator"]
SERVICE = AGGREGATOR_SERVICE.full_name
# What a refusal of a garbled message tells the client to do, by method.
GARBLED_FIXES = {"Deliver": "deliver with a chopper-agent of a matching version"}
# Every agent holds one Deliver stream to each replica that owns one of its jobs (agent/delivery.py), and
# each stream holds a worker thread, about 56 KiB resident (benchmarks/bench_fleet.py): 2,048 serve one
# 10,000-GPU job's 1,250 nodes with room for more.
MAX_WORKERS = 2048


class AggregatorServicer:
    """Implements ``chopper.v1.Aggregator`` over an ``Aggregator``."""

    def __init__(self, core: Aggregator) -> None:
        self.core = core

    def Deliver(self, requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[apb.DeliveryAck]:
        core = self.core
        with core.lock:
            core.delivery_streams += 1
        try:
            for batch in requests:
                problem = _batch_problem(batch)
                if problem:
                    with core.lock:
                        core.invalid_batches_total += 1
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                try:
                    acked = core.deliver(batch)
                except WalError as exc:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"aggregator cannot make deliveries durable: {exc}")
                yield apb.DeliveryAck(incarnation=batch.incarnation, acked_seq=acked)
        finally:
            with core.lock:
                core.delivery_streams -= 1

    def QuerySteps(self, request: Any, context: grpc.ServicerContext) -> apb.QueryStepsResponse:
        if not request.job:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job is empty; name the job whose steps you want")
        return apb.QueryStepsResponse(steps=self.core.query(request.job, request.last),
                                      positions=self.core.where(request.job))


def _batch_problem(batch: apb.SummaryBatch) -> str:
    """Why a decoded batch cannot be taken in, or ''."""
    if not batch.agent or not batch.incarnation:
        return "SummaryBatch needs agent and incarnation; they make delivery idempotent"
    if len(batch.seq) != len(batch.summaries):
        return (f"SummaryBatch has {len(batch.seq)} sequence numbers for {len(batch.summaries)} summaries; "
                "send one per summary")
    return ""


def build_server(core: Aggregator, listen: str, max_message_bytes: int = 64 * 1024 * 1024,
                 settings: AggregatorSettings | None = None) -> tuple[SecureServer, int]:
    """A started gRPC server on ``listen`` (``host:port``; port 0 picks one), with health.

    ``settings`` supplies TLS (``tls_cert``, ``tls_key``, ``tls_client_ca``) and the rate limits;
    None: plaintext with the default limits.

    Returns:
        The server and the bound port.

    Raises:
        OSError: The address cannot be bound; the message names ``listen``, the cause and the fix.
    """
    settings = settings or AggregatorSettings()
    server = SecureServer(
        [checked_service(AGGREGATOR_SERVICE, AggregatorServicer(core), partial(core.count, core.undecodable),
                         fixes=GARBLED_FIXES)],
        [SERVICE], core.refusals, max_workers=MAX_WORKERS,
        max_message_bytes=max_message_bytes, max_send_bytes=max_message_bytes,
        calls_per_s=settings.rate_limit_calls_per_s, messages_per_s=settings.rate_limit_messages_per_s,
    )
    port = server.add_tcp(listen, server_tls(settings))
    server.start()
    return server, port


