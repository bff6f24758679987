"""Protobuf wire-format pieces the agent writes by hand on its hot paths.

Protobuf's encoding is public and stable (https://protobuf.dev/programming-guides/encoding/): a
field is its key (``field_number << 3 | wire_type`` as a varint) and its value; a message's
encodings concatenated parse as one merged message (repeated fields append). So a message whose
repeated items the agent already holds encoded (``agent.buffers``) can be framed without decoding
them, and its other fields serialised by the generated class and joined on.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable

WIRE_VARINT, WIRE_64BIT, WIRE_LENGTH = 0, 1, 2


# Cached: the same few timestamps, indices, lengths and keys come again and again.
@functools.lru_cache(maxsize=1024)
def varint(value: int) -> bytes:
    """``value`` as a protobuf varint; a negative one as its 64-bit two's complement (10 bytes)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def key(field_number: int, wire_type: int) -> bytes:
    """A field's key."""
    return varint(field_number << 3 | wire_type)


def length_delimited(field_number: int, payloads: Iterable[bytes]) -> bytes:
    """Each payload (an encoded message, UTF-8 text) as one entry of a length-delimited field."""
    head = key(field_number, WIRE_LENGTH)
    return b"".join([head + varint(len(p)) + p for p in payloads])
