"""Request decoding for Chopper's gRPC servers that answers garbage clearly instead of failing inside gRPC.

A servicer registered with ``decoder(Message.FromString)`` receives a ``Garbled`` in place of a
message that is not valid protobuf, counts it and aborts with ``INVALID_ARGUMENT`` and a message
naming the expected type; gRPC's own failure would be a generic internal error.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Garbled:
    """Stands in for a request that did not decode, so the handler can answer it clearly."""

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
