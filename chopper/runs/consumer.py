"""Reading from a running agent: its info and its live stream (used by the CLI and the demo).

Targets are gRPC addresses: ``unix:///run/chopper/agent.sock`` or ``host:port``; ``security``
adds TLS and a bearer token (``chopper.runs.connect``). grpc is imported here, not in
``chopper/__init__``, so ``import chopper`` stays light.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc

from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import agent_pb2_grpc

if TYPE_CHECKING:
    from chopper.runs.connect import ClientSecurity


class AgentUnreachable(ConnectionError):
    """No agent answered at the target; the message says where we looked and what to check."""


def connect(target: str, security: ClientSecurity | None = None) -> tuple[grpc.Channel, Any]:
    """A channel and an Agent stub for ``target`` (plaintext without ``security``)."""
    channel = security.channel(target) if security is not None else grpc.insecure_channel(target)
    return channel, agent_pb2_grpc.AgentStub(channel)


def wait_for_info(target: str, timeout_s: float = 10.0, security: ClientSecurity | None = None) -> pb.AgentInfo:
    """``GetInfo`` from the agent, retrying until it answers or ``timeout_s`` passes.

    Raises:
        AgentUnreachable: Nothing answered in time.
    """
    channel, stub = connect(target, security)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                return stub.GetInfo(pb.GetInfoRequest(), timeout=max(0.1, min(2.0, deadline - time.monotonic())))
            except grpc.RpcError as exc:
                if time.monotonic() >= deadline:
                    raise AgentUnreachable(
                        f"no Chopper agent answered at {target} within {timeout_s:g} s ({exc.code().name}: "
                        f"{exc.details()}); is chopper-agent running, and is this its --socket-path?"
                    ) from None
                time.sleep(0.1)
    finally:
        channel.close()


def subscribe(target: str, request: pb.SubscribeRequest,
              security: ClientSecurity | None = None) -> tuple[grpc.Channel, Iterator[pb.TelemetryBatch]]:
    """Open a ``Subscribe`` stream; close the returned channel to end it."""
    channel, stub = connect(target, security)
    return channel, stub.Subscribe(request)
