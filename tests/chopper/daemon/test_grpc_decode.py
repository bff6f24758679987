"""``checked_service``: every method the ``.proto`` declares is behind the one malformed-message check.

The servicers here are stand-ins that record what reached them; the real daemons' answers over
real gRPC are in tests/fuzz/test_servers.py and tests/agent/test_server.py.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from chopper.daemon.grpc_decode import checked_service
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb

SERVICES = [pb.DESCRIPTOR.services_by_name["Agent"], apb.DESCRIPTOR.services_by_name["Aggregator"]]
GARBAGE = b"\xff\xff\xff\x07garbage"


class Aborted(Exception):
    pass


class Context:
    """The part of ``grpc.ServicerContext`` the check uses: ``abort`` raises, as gRPC's does."""

    def __init__(self) -> None:
        self.status: tuple[grpc.StatusCode, str] | None = None

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        raise Aborted


class Recorder:
    """A servicer with every method of a service, each recording the requests it read."""

    def __init__(self, service: Any) -> None:
        self.seen: list[tuple[str, Any]] = []
        for method in service.methods:
            setattr(self, method.name, self._method(method.name))

    def _method(self, name: str) -> Any:
        def behaviour(request: Any, context: Any) -> str:
            for item in request if isinstance(request, Iterator) else [request]:
                self.seen.append((name, item))
            return "served"

        return behaviour


def _call(handlers: grpc.GenericRpcHandler, service: Any, method: Any, messages: list[bytes]) -> tuple[Any, Context]:
    handler = handlers.service(SimpleNamespace(method=f"/{service.full_name}/{method.name}"))
    decoded = [handler.request_deserializer(m) for m in messages]
    behaviour = next(getattr(handler, kind) for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                     if getattr(handler, kind) is not None)
    context = Context()
    try:
        return behaviour(iter(decoded) if method.client_streaming else decoded[0], context), context
    except Aborted:
        return None, context


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_every_declared_method_refuses_and_counts_garbage(service: Any) -> None:
    garbled: Counter[str] = Counter()
    recorder = Recorder(service)
    first = service.methods[0].name
    handlers = checked_service(service, recorder, lambda method: garbled.update([method]),
                               fixes={first: "upgrade the client"}, unread={"GetInfo"})
    for method in service.methods:
        # A stream sends a good message (the empty one is valid for every type) before the garbage.
        result, context = _call(handlers, service, method, [b"", GARBAGE] if method.client_streaming else [GARBAGE])
        if method.name == "GetInfo":  # nothing in its request is read: served, not counted
            assert result == "served" and context.status is None and garbled[method.name] == 0
            continue
        assert result is None and garbled[method.name] == 1, method.name
        assert context.status is not None
        code, details = context.status
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith(f"message is not a {method.input_type.full_name} ("), details
        assert details.endswith("; upgrade the client") == (method.name == first), details
    # The servicer read decoded messages only: each stream's good one, and GetInfo's empty request.
    assert all(isinstance(item, Message) for _, item in recorder.seen)
    reached = {m.name for m in service.methods if m.client_streaming or m.name == "GetInfo"}
    assert sorted(name for name, _ in recorder.seen) == sorted(reached)


def test_a_servicer_without_a_declared_method_is_refused_when_built() -> None:
    class Partial:
        def GetInfo(self, request: Any, context: Any) -> None: ...

    with pytest.raises(AttributeError, match="PushMarkers"):
        checked_service(SERVICES[0], Partial(), lambda method: None)
