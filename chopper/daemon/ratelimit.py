"""Token buckets and stream slots: per-client call rates, per-stream message rates, open streams.

A bucket holds at most ``rate × BURST_S`` tokens and refills at ``rate`` tokens per second; each
admitted call (or streamed message) takes one. So a client may burst to two seconds' worth and
then sustain ``rate`` per second. A rate of 0 disables the limit.

``RateLimiter`` keeps one bucket per key (client identity and RPC) in a least-recently-used map of
at most ``max_keys`` entries: a flood of new identities evicts the quietest buckets instead of
growing memory. An evicted bucket comes back full, which is what an idle client's bucket is anyway.

``StreamSlots`` bounds open streams, which hold a server worker thread each for their whole life:
at most ``total`` at once, and at most ``per_client`` of one client, so one client can never take
the slots the others need. The counts are of open streams only (a client's entry goes with its
last stream), so their memory is bounded by ``total``.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

# Seconds of traffic a full bucket covers: what a client may send at once before the rate holds.
BURST_S = 2.0
MAX_KEYS = 10_000


class TokenBucket:
    """One bucket. Not thread-safe on its own: ``RateLimiter`` locks, a stream owns its bucket.

    Args:
        rate: Tokens per second (> 0).
        now: Current monotonic time, seconds.
    """

    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate * BURST_S)
        self.tokens = self.capacity
        self.stamp = now

    def take(self, now: float) -> bool:
        """Refill for the time since the last call, then take one token if there is one."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimiter:
    """Buckets by key, shared by a server's worker threads.

    Args:
        rate: Admissions per second per key; 0 admits everything.
        clock: Monotonic seconds (injected in tests).
        max_keys: Most buckets held; the least recently used goes first.
    """

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, max_keys: int = MAX_KEYS) -> None:
        self.rate = rate
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: OrderedDict[Hashable, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, key: Hashable) -> bool:
        """Whether ``key`` may make one more call now (takes a token if so)."""
        if self.rate <= 0:
            return True
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(self.rate, now)
                if len(self._buckets) > self.max_keys:
                    self._buckets.popitem(last=False)
            else:
                self._buckets.move_to_end(key)
            return bucket.take(now)

    def stream_bucket(self) -> TokenBucket | None:
        """A fresh bucket for one stream's messages (None: unlimited); the stream's thread owns it."""
        return TokenBucket(self.rate, self.clock()) if self.rate > 0 else None

    def __len__(self) -> int:
        return len(self._buckets)


class StreamSlots:
    """Open-stream slots of a server, ``total`` in all and ``per_client`` for any one client.

    Args:
        total: Most streams open at once.
        per_client: Most streams one client key may hold.
    """

    def __init__(self, total: int, per_client: int) -> None:
        self.total = total
        self.per_client = per_client
        self._held: dict[Hashable, int] = {}
        self._open = 0
        self._lock = threading.Lock()

    def acquire(self, client: Hashable) -> str:
        """Take a slot for ``client``: "" when taken, else the refusal reason.

        Returns:
            ``""``, ``"too_many_streams"`` (all ``total`` slots held) or ``"streams_per_client"``
            (``client`` holds ``per_client``).
        """
        with self._lock:
            held = self._held.get(client, 0)
            if held >= self.per_client:
                return "streams_per_client"
            if self._open >= self.total:
                return "too_many_streams"
            self._held[client] = held + 1
            self._open += 1
            return ""

    def release(self, client: Hashable) -> None:
        """Give back a slot taken by ``client``."""
        with self._lock:
            held = self._held.pop(client, 0) - 1
            if held > 0:
                self._held[client] = held
            self._open -= 1

    @property
    def open(self) -> int:
        """Streams holding a slot now."""
        return self._open
