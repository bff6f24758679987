"""Request decoding for Chopper's gRPC servers: one malformed-message check for every method of a service.

``checked_service`` registers every method that the service's ``.proto`` declares, so a new RPC
gets the check by being declared. Each request is decoded by our own deserializer
(``decoder``): bytes that are not a valid message become a ``Garbled``, and the check in front of
the servicer's method counts it (``garbled(method)``) and aborts the call with
``INVALID_ARGUMENT`` and ``message is not a <full name> (<error>)``, plus the fix for that method
where one is given; gRPC's own failure would be a generic internal error. For a client stream
the check runs on each message as the servicer reads it, so the messages before a garbled one
are taken in. The servicer's methods only ever see decoded messages. A response may be the message or
its wire bytes (a servicer that frames items it holds encoded, ``agent.wire``).
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

Behaviour = Callable[[Any, grpc.ServicerContext], Any]
# grpc's handler factory for each (client streaming, server streaming).
_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


class Garbled:
    """Stands in for a request that did not decode, so the check can answer it clearly."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def decoder(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """Wrap a protobuf parser so that garbage yields ``Garbled`` instead of raising in gRPC."""

    def decode(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # protobuf raises DecodeError and others on garbage
            return Garbled(exc)

    return decode


def checked_service(service: ServiceDescriptor, servicer: object, garbled: Callable[[str], None], *,
                    fixes: Mapping[str, str] | None = None,
                    unread: Collection[str] = ()) -> grpc.GenericRpcHandler:
    """gRPC's handler for every method of ``service``, each behind the module docstring's check.

    Args:
        service: The service as the ``.proto`` declares it (``agent_pb2.DESCRIPTOR.services_by_name[...]``).
        servicer: Has a method of each RPC's name, taking ``(request or request iterator, context)``.
        garbled: Counts one garbled request of the method named.
        fixes: Per method, what the refusal tells the client to do (appended after ``"; "``).
        unread: Methods whose request carries nothing the servicer reads (``GetInfo``): a garbled
            one is served as the empty message, neither refused nor counted.

    Raises:
        AttributeError: ``servicer`` lacks a method the service declares.
    """
    fixes = fixes or {}
    handlers = {}
    for method in service.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        behaviour: Behaviour = getattr(servicer, method.name)
        if method.name in unread:
            deserializer = _lenient(request_type)
        else:
            behaviour = _checked(method, behaviour, garbled, fixes.get(method.name, ""))
            deserializer = decoder(request_type.FromString)
        kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = kind(behaviour, request_deserializer=deserializer,
                                     response_serializer=_serializer(response_type))
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _serializer(response_type: Any) -> Callable[[Any], bytes]:
    """Serialises a response message; a response that is already ``bytes`` (a servicer that framed
    the message's wire form itself, ``agent.wire``) goes as it is."""
    serialize = response_type.SerializeToString

    def serialized(response: Any) -> bytes:
        return response if response.__class__ is bytes else serialize(response)

    return serialized


def _checked(method: MethodDescriptor, behaviour: Behaviour, garbled: Callable[[str], None], fix: str) -> Behaviour:
    """``behaviour`` behind the check: a ``Garbled`` request is counted and refused before it sees it."""
    name, expected = method.name, method.input_type.full_name
    suffix = f"; {fix}" if fix else ""

    def refuse(request: Garbled, context: grpc.ServicerContext) -> None:
        garbled(name)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"message is not a {expected} ({request.error}){suffix}")

    if method.client_streaming:
        def checked_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            def decoded() -> Iterator[Any]:
                for request in requests:
                    if isinstance(request, Garbled):
                        refuse(request, context)
                    yield request

            return behaviour(decoded(), context)

        return checked_stream

    def checked(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Garbled):
            refuse(request, context)
        return behaviour(request, context)

    return checked


def _lenient(request_type: Any) -> Callable[[bytes], Any]:
    """A parser for a request that is never read: garbage is the empty message."""

    def parse(data: bytes) -> Any:
        try:
            return request_type.FromString(data)
        except Exception:  # unread: what was sent does not matter
            return request_type()

    return parse
