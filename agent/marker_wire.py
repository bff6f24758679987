"""Markers as the agent holds them between a batch and its buffers: rows, and their wire form.

A ``MarkerRow`` is one marker as a plain tuple, in the order of ``MarkerColumns``: ``(ts_ns,
kind, step, name, flops, tokens, bytes, clock)`` (ns since the epoch, the wire value of
``MarkerKind``, the step number, the name itself rather than its index, model FLOPs, tokens,
bytes moved, the wire value of ``ClockSource``). A batch in column form becomes rows with a few
calls in C (``zip`` over its columns); a ``Marker`` message each cost the agent 1.2-1.7 µs of CPU
per marker to make, and 0.3 µs more to encode for the buffers.

``marker_bytes`` writes rows in ``Marker``'s wire form with ``agent.wire``'s pieces, byte for byte
what protobuf's ``SerializeToString`` writes for the same values (fields in number order, a field
at its default left out, ``-0.0`` kept, a negative integer as ten bytes). Algorithm: each field is
its key and a varint (a double: eight bytes); what repeats (a step number, a kind with its name, the
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

from agent.wire import WIRE_64BIT, WIRE_LENGTH, WIRE_VARINT, key, varint
from chopper.proto.chopper.v1 import agent_pb2 as pb

MarkerRow = tuple[int, int, int, str, float, int, int, int]

_FIELDS = pb.Marker.DESCRIPTOR.fields_by_name
_TS, _KIND, _STEP, _TOKENS, _BYTES, _CLOCK = (key(_FIELDS[name].number, WIRE_VARINT) for name in (
    "ts_ns", "kind", "step", "tokens", "bytes", "clock"))
_NAME = key(_FIELDS["name"].number, WIRE_LENGTH)
_FLOPS = key(_FIELDS["flops"].number, WIRE_64BIT)
_RECORD_MARKER = key(pb.MarkerRecord.DESCRIPTOR.fields_by_name["marker"].number, WIRE_LENGTH)
_DOUBLE = struct.Struct("<d").pack
_LOW_28 = (1 << 28) - 1
_INT64_END = 1 << 63
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


def _field(tag: bytes, n: int) -> bytes:
    """A varint field, or nothing at its default 0."""
    return tag + varint(n) if n else b""


def _payload(flops: float, tokens: int, nbytes: int, clock: int) -> bytes:
    """The fields after the name; ``flops`` written unless it is +0.0 (protobuf writes -0.0)."""
    return ((_FLOPS + _DOUBLE(flops) if flops or math.copysign(1.0, flops) < 0 else b"")
            + _field(_TOKENS, tokens) + _field(_BYTES, nbytes) + _field(_CLOCK, clock))


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
            stamp = _TS + (0x80808080 | (low & 0x7F) | (low & 0x3F80) << 1 | (low & 0x1FC000) << 2
                               | (low & 0xFE00000) << 3).to_bytes(4, "little") + high
        else:
            stamp = _field(_TS, ts)
        counter = steps.get(step)
        if counter is None:
            counter = _remember(steps, step, _field(_STEP, step))
        label = labels.get((kind, name))
        if label is None:
            encoded = name.encode()
            label = _remember(labels, (kind, name),
                              (_field(_KIND, kind), _NAME + varint(len(encoded)) + encoded if encoded else b""))
        if flops or tokens or nbytes or clock or copysign(1.0, flops) < 0:
            wanted = (flops if flops else _ZERO_SIGN[copysign(1.0, flops) < 0], tokens, nbytes, clock)
            payload = payloads.get(wanted)
            if payload is None:
                payload = _remember(payloads, wanted, _payload(flops, tokens, nbytes, clock))
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
            head = heads[n] = prefix + _RECORD_MARKER + varint(n)
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
