"""Token buckets with an injected clock: burst, refill, per-key independence, bounded memory."""
from __future__ import annotations

from chopper.access import client_identity
from chopper.ratelimit import BURST_S, RateLimiter
from chopper.tls_front import Peer, Peers
from tests.agent.test_sampler import FakeClock as Clock  # any number serves as seconds here


def test_burst_then_rate_then_refill() -> None:
    clock = Clock()
    limiter = RateLimiter(5.0, clock)
    burst = int(5.0 * BURST_S)
    assert [limiter.admit("a") for _ in range(burst + 1)] == [True] * burst + [False]
    assert limiter.admit("b")  # another key has its own bucket
    clock.now += 0.2  # one token back at 5 per second
    assert limiter.admit("a") and not limiter.admit("a")
    clock.now += 3600  # refills to the burst, never beyond
    assert sum(limiter.admit("a") for _ in range(3 * burst)) == burst


def test_zero_rate_admits_everything_and_keeps_no_state() -> None:
    limiter = RateLimiter(0.0, Clock())
    assert all(limiter.admit(i) for i in range(10_000)) and len(limiter) == 0
    assert limiter.stream_bucket() is None


def test_a_flood_of_identities_cannot_grow_memory() -> None:
    limiter = RateLimiter(1.0, Clock(), max_keys=100)
    for i in range(10_000):
        limiter.admit(("ipv4:10.0.0.1", i))
    assert len(limiter) == 100


def test_client_identity() -> None:
    peers = Peers()
    peers.add("unix:/tmp/chopper-tls-x/c1", Peer("cn:node17", "ipv4:10.1.2.3:5555"))
    assert client_identity("unix:/tmp/chopper-tls-x/c1", peers) == "cn:node17"
    assert client_identity("unix:", peers) == "unix"
    assert client_identity("ipv4:10.1.2.3:40000") == client_identity("ipv4:10.1.2.3:40001") == "ipv4:10.1.2.3"
    assert client_identity("ipv6:[::1]:40000") == "ipv6:[::1]"
