"""Token buckets: per-client call rates and per-stream message rates of the gRPC servers.

A bucket holds at most ``rate × BURST_S`` tokens and refills at ``rate`` tokens per second; each
admitted call (or streamed message) takes one. So a client may burst to two seconds' worth and
then sustain ``rate`` per second. A rate of 0 disables the limit.

``RateLimiter`` keeps one bucket per key (client identity and RPC) in a least-recently-used map of
at most ``max_keys`` entries: a flood of new identities evicts the quietest buckets instead of
growing memory. An evicted bucket comes back full, which is what an idle client's bucket is anyway.
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
