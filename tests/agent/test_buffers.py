from __future__ import annotations

from agent.buffers import RingBuffer


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
