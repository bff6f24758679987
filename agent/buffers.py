"""Bounded, thread-safe ring buffers with sequence numbers, for samples, markers and summaries.

Each appended item gets the next sequence number (from 1). When the buffer is full the oldest
items are dropped and counted. Readers keep their own cursor (the next sequence number they
want); a reader that fell further behind than the buffer holds learns how many items it missed.

Two bounds, whichever is reached first: ``capacity`` items, and (with a codec) ``max_bytes`` of
memory. With a codec the buffer holds each item encoded (a protobuf message as its wire bytes,
about an eighth of the memory of the message object: 106 B against 918 B for a marker record in
CPython with upb) and decodes on read; an item's memory is counted as its encoded length plus
``ITEM_OVERHEAD_BYTES`` (the ``bytes`` object's header and the deque's slot), so the budget is
the buffer's share of the agent's resident memory, not a count that means a gigabyte when full.
"""
from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
M = TypeVar("M", bound="Message")

# sys.getsizeof(b"") is the header of a bytes object; its pointer in the deque is another 8.
ITEM_OVERHEAD_BYTES = sys.getsizeof(b"") + 8


class Message(Protocol):
    """What a codec needs of a protobuf message."""

    def SerializeToString(self) -> bytes: ...


class ProtoCodec(Generic[M]):
    """Encodes messages of one protobuf class to their wire bytes and back."""

    def __init__(self, cls: Any) -> None:
        self.decode: Callable[[bytes], M] = cls.FromString

    @staticmethod
    def encode(message: M) -> bytes:
        return message.SerializeToString()


class RingBuffer(Generic[T]):
    """A bounded FIFO whose readers poll by sequence number.

    Args:
        capacity: Items kept at most; the oldest go beyond it.
        notify: Called (outside the lock) after every append, e.g. to wake subscribers.
        max_bytes: Memory kept at most (module docstring); needs ``codec``. None: items only.
        codec: Stores items encoded (``ProtoCodec``); None: the objects themselves.
    """

    def __init__(self, capacity: int, notify: Callable[[], None] | None = None, max_bytes: int | None = None,
                 codec: ProtoCodec[Any] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if max_bytes is not None and (codec is None or max_bytes < 1):
            raise ValueError(f"max_bytes={max_bytes} needs a codec and at least 1 byte")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._codec = codec
        self._items: deque[Any] = deque()
        self._bytes = 0
        self._next_seq = 1
        self._lock = threading.Lock()
        self._notify = notify
        self.overwritten_total = 0

    def extend(self, items: Iterable[T]) -> None:
        """Append items in order, dropping (and counting) the oldest beyond either bound."""
        codec = self._codec
        self._append([codec.encode(item) for item in items] if codec is not None else list(items))

    def extend_encoded(self, encoded: list[bytes]) -> None:
        """Append items already in the codec's encoding (a producer that builds the wire form itself)."""
        if self._codec is None:
            raise TypeError("extend_encoded needs a buffer with a codec")
        self._append(encoded)

    def _append(self, encoded: list[Any]) -> None:
        codec = self._codec
        with self._lock:
            held = self._items
            held.extend(encoded)
            self._next_seq += len(encoded)
            if codec is not None:
                self._bytes += sum(map(len, encoded)) + ITEM_OVERHEAD_BYTES * len(encoded)
            over = len(held) - self.capacity
            while over > 0 or (self.max_bytes is not None and self._bytes > self.max_bytes and held):
                gone = held.popleft()
                if codec is not None:
                    self._bytes -= len(gone) + ITEM_OVERHEAD_BYTES
                self.overwritten_total += 1
                over -= 1
        if self._notify is not None:
            self._notify()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes_held(self) -> int:
        """Memory the held items are counted at (module docstring); 0 without a codec."""
        return self._bytes

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended item will get."""
        return self._next_seq

    def read(self, cursor: int, limit: int) -> tuple[list[T], int, int]:
        """Return up to ``limit`` items from sequence number ``cursor`` on.

        Returns:
            ``(items, new_cursor, missed)`` where ``missed`` counts items between ``cursor`` and
            the oldest item still held (dropped before this reader got them).
        """
        items, cursor, missed = self.read_held(cursor, limit)
        if self._codec is not None:  # decoded outside the lock: producers never wait on a reader
            items = [self._codec.decode(b) for b in items]
        return items, cursor, missed

    def read_held(self, cursor: int, limit: int) -> tuple[list[Any], int, int]:
        """``read``, but the items as held: encoded with a codec (a reader that sends them on as they are)."""
        with self._lock:
            first = self._next_seq - len(self._items)
            missed = max(0, first - cursor)
            start = max(cursor, first)
            count = min(limit, self._next_seq - start)
            offset = start - first
            # CPython walks a deque from its nearer end, so live readers near the tail stay cheap.
            items = [self._items[offset + i] for i in range(count)]
        return items, start + count, missed

    def first_seq_at_or_after(self, key: Callable[[T], int], since: int) -> int:
        """Sequence number of the oldest held item with ``key(item) >= since`` (items are in time order).

        A binary search: ``log2(len)`` items are looked at (decoded, with a codec).
        """
        decode = self._codec.decode if self._codec is not None else (lambda item: item)
        with self._lock:
            first = self._next_seq - len(self._items)
            lo, hi = 0, len(self._items)
            while lo < hi:
                mid = (lo + hi) // 2
                if key(decode(self._items[mid])) >= since:
                    hi = mid
                else:
                    lo = mid + 1
            return first + lo
