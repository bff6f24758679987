from __future__ import annotations

import pytest

from agent.buffers import ITEM_OVERHEAD_BYTES, ProtoCodec, RingBuffer
from chopper.proto.chopper.v1 import agent_pb2 as pb


def test_read_by_cursor_and_overwrite_counts() -> None:
    woken = []
    buf: RingBuffer[int] = RingBuffer(5, notify=lambda: woken.append(1))
    buf.extend(range(3))
    items, cursor, missed = buf.read(1, 10)
    assert (items, cursor, missed) == ([0, 1, 2], 4, 0)
    buf.extend(range(3, 10))  # 10 items through a buffer of 5
    assert buf.overwritten_total == 5
    items, cursor, missed = buf.read(cursor, 2)
    assert (items, cursor, missed) == ([5, 6], 8, 2)  # 3, 4 were overwritten before this reader came back
    items, cursor, missed = buf.read(cursor, 100)
    assert (items, cursor, missed) == ([7, 8, 9], 11, 0)
    assert buf.read(cursor, 100) == ([], 11, 0)
    assert len(woken) == 2


def test_first_seq_at_or_after() -> None:
    buf: RingBuffer[int] = RingBuffer(4)
    buf.extend([10, 20, 30, 40, 50])  # 10 overwritten; held: seq 2..5
    assert buf.first_seq_at_or_after(lambda v: v, 25) == 3
    assert buf.first_seq_at_or_after(lambda v: v, 0) == 2
    assert buf.first_seq_at_or_after(lambda v: v, 99) == 6


def _record(i: int, name: str = "all_reduce") -> pb.MarkerRecord:
    # Steps 1-127 are one byte on the wire: every record here has the same encoded size.
    marker = pb.Marker(ts_ns=1_764_700_000_000_000_000 + i, kind=pb.MARKER_KIND_COLLECTIVE_END, step=1 + i, name=name)
    return pb.MarkerRecord(job="j", node="n", rank=0, gpu=0, marker=marker)


def test_a_memory_bound_drops_the_oldest_by_their_encoded_size() -> None:
    size = len(_record(0).SerializeToString()) + ITEM_OVERHEAD_BYTES
    buf: RingBuffer[pb.MarkerRecord] = RingBuffer(10**6, max_bytes=10 * size, codec=ProtoCodec(pb.MarkerRecord))
    buf.extend(_record(i) for i in range(25))
    assert len(buf) == 10 and buf.bytes_held == 10 * size and buf.overwritten_total == 15
    items, cursor, missed = buf.read(1, 100)
    assert [r.marker.step - 1 for r in items] == list(range(15, 25)) and (cursor, missed) == (26, 15)
    assert items[0] == _record(15)  # decoded as it was appended
    # A bigger item takes the room of more small ones; the item bound still holds beside the memory one.
    buf.extend([_record(25, name="x" * (3 * size))])
    assert buf.bytes_held <= 10 * size and len(buf) < 10
    assert buf.first_seq_at_or_after(lambda r: r.marker.ts_ns, 1_764_700_000_000_000_000 + 20) == 21


def test_a_memory_bound_needs_a_codec() -> None:
    with pytest.raises(ValueError, match="needs a codec"):
        RingBuffer(10, max_bytes=100)
