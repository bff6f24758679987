"""A ``chopper.schema.Sample`` written straight into the wire form of ``chopper.v1.Sample``.

Every GPU's sample goes into the agent's sample buffer on every tick, and the buffer holds each
one encoded (``agent.buffers``). Building a ``pb.Sample`` message from keyword arguments and then
serialising it costs about 9 µs a sample in CPython; writing the bytes with one ``struct`` call
costs about a quarter of that. The encoding is the protobuf one, field by field:

* ``ts_ns`` and ``gpu``: varints (a negative value as its 64-bit two's complement, 10 bytes);
* ``node`` and ``job``: length-delimited UTF-8, left out when empty (as protobuf does);
* every double field: its tag and 8 little-endian bytes, also when the value is 0.0 (protobuf
  leaves a proto3 zero out; a parser reads an explicit zero as the same message);
* ``links``: one hand-encoded ``LinkBytes`` entry per link (``_LINK_ENTRY``); a link index of 128
  or more, which needs a longer varint, goes through the generated class instead;
* ``errors``: through the generated class (only the samples on which health was read have any).

Concatenated protobuf encodings parse as one merged message, so the parts are simply joined.
The field numbers come from the generated descriptor, so the proto file stays the one truth.
"""
from __future__ import annotations

import functools
import itertools
import operator
import struct

from agent.wire import WIRE_64BIT, WIRE_LENGTH, WIRE_VARINT, key, varint
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.schema import LinkBytes, Sample

_FIELDS = pb.Sample.DESCRIPTOR.fields_by_name
_DOUBLES = tuple(f.name for f in pb.Sample.DESCRIPTOR.fields if f.type == f.TYPE_DOUBLE)


def _tag(name: str, wire_type: int) -> bytes:
    return key(_FIELDS[name].number, wire_type)


_DOUBLE_TAGS = tuple(_tag(name, WIRE_64BIT) for name in _DOUBLES)
_DOUBLES_STRUCT = struct.Struct("<" + "".join(f"{len(t)}sd" for t in _DOUBLE_TAGS))
_double_values = operator.attrgetter(*_DOUBLES)
_TS, _GPU = _tag("ts_ns", WIRE_VARINT), _tag("gpu", WIRE_VARINT)
_NODE, _JOB = _tag("node", WIRE_LENGTH), _tag("job", WIRE_LENGTH)
# One Sample.links entry: the field's key, length 20, then LinkBytes' link (field 1, a one-byte
# varint below 128), tx_bytes (field 2) and rx_bytes (field 3), doubles.
_LINK_HEAD = _tag("links", WIRE_LENGTH) + b"\x14"
_LINK_ENTRY = struct.Struct(f"<{len(_LINK_HEAD)}sBbBdBd")


@functools.lru_cache(maxsize=256)
def _text(tag: bytes, text: str) -> bytes:
    if not text:
        return b""
    raw = text.encode()
    return tag + varint(len(raw)) + raw


def _links(links: tuple[LinkBytes, ...]) -> bytes:
    pack = _LINK_ENTRY.pack
    try:
        return b"".join([pack(_LINK_HEAD, 0x08, k, 0x11, tx, 0x19, rx) for k, tx, rx in links])
    except struct.error:  # a link index of 128 or more needs a longer varint
        return pb.Sample(links=[pb.LinkBytes(link=k, tx_bytes=tx, rx_bytes=rx) for k, tx, rx in links]
                         ).SerializeToString()


def sample_wire(s: Sample, job: str) -> bytes:
    """The wire bytes of ``s`` as a ``chopper.v1.Sample``, with ``job`` (the GPU's scheduler jobs)."""
    parts = [_TS + varint(s.ts_ns), _text(_NODE, s.node), _GPU + varint(s.gpu), _text(_JOB, job),
             _DOUBLES_STRUCT.pack(*itertools.chain.from_iterable(zip(_DOUBLE_TAGS, _double_values(s), strict=True)))]
    if s.links:  # most backends read no per-link counter: no entries at all
        parts.append(_links(s.links))
    if s.errors:  # only on the samples where the backend read health (docs/HEALTH.md)
        parts.append(pb.Sample(errors=[pb.ErrorCount(kind=e.kind, window=e.window, detail=e.detail, value=e.value,
                                                     chip_wide=e.chip_wide) for e in s.errors]).SerializeToString())
    return b"".join(parts)
