"""Markers as the agent holds them between a batch and its buffers: rows, and their wire form.

A ``MarkerRow`` is one marker as a plain tuple, in the order of ``MarkerColumns``: ``(ts_ns,
kind, step, name, flops, tokens, bytes, clock)`` (ns since the epoch, the wire value of
``MarkerKind``, the step number, the name itself rather than its index, model FLOPs, tokens,
bytes moved, the wire value of ``ClockSource``). A batch in column form becomes rows with a few
calls in C (``zip`` over its columns); a ``Marker`` message each cost the agent 1.2-1.7 µs of CPU
per marker to make, and 0.3 µs more to encode for the buffers.

``marker_bytes`` writes rows in ``Marker``'s wire form, byte for byte what protobuf's
``SerializeToString`` writes for the same values (fields in number order, a field at its
default left out, ``-0.0`` kept, a negative integer as ten bytes). Algorithm: each field is a tag
byte and a varint (a double: eight bytes); what repeats (a step number, a kind with its name, the
payload fields together, the high bits of a timestamp) is encoded once and looked up after, from
one batch to the next. A timestamp of this century is at least 2^28 ns, so its low 28 bits are
always the varint's first four bytes, each 7 bits with the continuation bit set: one integer
expression; the rest, which changes every 0.27 s, comes from the lookup.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from typing import Any

from chopper.proto.chopper.v1 import agent_pb2 as pb

MarkerRow = tuple[int, int, int, str, float, int, int, int]

_DOUBLE = struct.Struct("<d").pack
_LOW_28 = (1 << 28) - 1
_INT64_END = 1 << 63
# The tag of MarkerRecord.marker (field 5, length-delimited) on the wire.
_RECORD_MARKER_TAG = b"\x2a"
_ZERO_SIGN = ("+0", "-0")  # in a payload lookup key, which 0.0 == -0.0 would otherwise merge
# Pieces kept from one batch to the next (a step's markers span several small batches): the high
# bits of timestamps, step numbers, (kind, name) pairs and payloads. Each starts again when it holds
# this many; the values are pure functions of their keys, so threads sharing them at worst
# encode a piece twice.
CACHE_ENTRIES = 4096
_HIGHS: dict[int, bytes] = {}
_STEPS: dict[int, bytes] = {}
_LABELS: dict[tuple[int, str], tuple[bytes, bytes]] = {}
_PAYLOADS: dict[tuple[object, int, int, int], bytes] = {}


def varint(n: int) -> bytes:
    """``n`` as a protobuf varint: 7 bits a byte, low first, the high bit set on all but the last;
    a negative ``n`` as its 64-bit two's complement (ten bytes), as protobuf writes int64 and enums."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, n: int) -> bytes:
    """A varint field, or nothing at its default 0."""
    return bytes((tag,)) + varint(n) if n else b""


def marker_bytes(rows: Iterable[MarkerRow]) -> list[bytes]:
    """Each row's ``Marker`` in wire form (module docstring)."""
    highs, steps, labels, payloads = _HIGHS, _STEPS, _LABELS, _PAYLOADS
    copysign = math.copysign
    out = []
    for ts, kind, step, name, flops, tokens, nbytes, clock in rows:
        if _LOW_28 < ts < _INT64_END:
            high = highs.get(ts >> 28)
            if high is None:
                high = _remember(highs, ts >> 28, varint(ts >> 28))
            low = ts & _LOW_28
            stamp = b"\x08" + (0x80808080 | (low & 0x7F) | (low & 0x3F80) << 1 | (low & 0x1FC000) << 2
                               | (low & 0xFE00000) << 3).to_bytes(4, "little") + high
        else:
            stamp = _field(0x08, ts)
        counter = steps.get(step)
        if counter is None:
            counter = _remember(steps, step, _field(0x18, step))
        label = labels.get((kind, name))
        if label is None:
            encoded = name.encode()
            label = _remember(labels, (kind, name),
                              (_field(0x10, kind), b"\x22" + varint(len(encoded)) + encoded if encoded else b""))
        if flops or tokens or nbytes or clock:
            key = (flops if flops else _ZERO_SIGN[copysign(1.0, flops) < 0], tokens, nbytes, clock)
            payload = payloads.get(key)
            if payload is None:
                payload = _remember(payloads, key, (b"\x29" + _DOUBLE(flops) if flops or copysign(1.0, flops) < 0
                                                    else b"")
                                    + _field(0x30, tokens) + _field(0x38, nbytes) + _field(0x40, clock))
        elif copysign(1.0, flops) < 0:  # -0.0, which protobuf writes
            payload = b"\x29" + _DOUBLE(flops)
        else:
            payload = b""
        out.append(stamp + label[0] + counter + label[1] + payload)
    return out


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    """Put ``value`` in ``cache`` under ``key`` and return it; a cache at ``CACHE_ENTRIES`` starts again."""
    if len(cache) >= CACHE_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


def record_bytes(prefix: bytes, rows: Iterable[MarkerRow]) -> list[bytes]:
    """Each row as a ``MarkerRecord`` in wire form: ``prefix`` (the record's other fields, encoded) then the marker.

    A message's encoding is the concatenation of its fields', so the marker is field 5: its tag,
    its length, its bytes.
    """
    heads: dict[int, bytes] = {}
    out = []
    for body in marker_bytes(rows):
        n = len(body)
        head = heads.get(n)
        if head is None:
            head = heads[n] = prefix + _RECORD_MARKER_TAG + varint(n)
        out.append(head + body)
    return out


def marker_message(row: MarkerRow) -> pb.Marker:
    """The ``Marker`` message of a row (for readers that want messages; the hot path never makes one)."""
    ts, kind, step, name, flops, tokens, nbytes, clock = row
    return pb.Marker(ts_ns=ts, kind=kind, step=step, name=name, flops=flops, tokens=tokens, bytes=nbytes,  # type: ignore[arg-type]  # wire values
                     clock=clock)  # type: ignore[arg-type]


def message_row(m: pb.Marker) -> MarkerRow:
    """The row of a ``Marker`` message."""
    return (m.ts_ns, m.kind, m.step, m.name, m.flops, m.tokens, m.bytes, m.clock)
