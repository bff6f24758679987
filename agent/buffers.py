"""Bounded, thread-safe ring buffers with sequence numbers, for samples, markers and summaries.

Each appended item gets the next sequence number (from 1). When the buffer is full the oldest
item is overwritten and counted. Readers keep their own cursor (the next sequence number they
want); a reader that fell further behind than the buffer holds learns how many items it missed.
Memory is bounded by ``capacity`` items whatever the producers and consumers do.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class RingBuffer(Generic[T]):
    """A fixed-capacity FIFO whose readers poll by sequence number.

    Args:
        capacity: Items kept; the oldest is overwritten beyond it.
        notify: Called (outside the lock) after every append, e.g. to wake subscribers.
    """

    def __init__(self, capacity: int, notify: Callable[[], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[T] = deque(maxlen=capacity)
        self._next_seq = 1
        self._lock = threading.Lock()
        self._notify = notify
        self.overwritten_total = 0

    def extend(self, items: Iterable[T]) -> None:
        """Append items in order, overwriting (and counting) the oldest when full."""
        with self._lock:
            for item in items:
                if len(self._items) == self.capacity:
                    self.overwritten_total += 1
                self._items.append(item)
                self._next_seq += 1
        if self._notify is not None:
            self._notify()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def next_seq(self) -> int:
        """The sequence number the next appended item will get."""
        return self._next_seq

    def read(self, cursor: int, limit: int) -> tuple[list[T], int, int]:
        """Return up to ``limit`` items from sequence number ``cursor`` on.

        Returns:
            ``(items, new_cursor, missed)`` where ``missed`` counts items between ``cursor`` and
            the oldest item still held (overwritten before this reader got them).
        """
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
        """Sequence number of the oldest held item with ``key(item) >= since`` (items are in time order)."""
        with self._lock:
            first = self._next_seq - len(self._items)
            for i, item in enumerate(self._items):
                if key(item) >= since:
                    return first + i
            return self._next_seq

