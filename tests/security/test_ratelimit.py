"""Token buckets with an injected clock (burst, refill, per-key independence, bounded memory); stream slots."""
from __future__ import annotations

from chopper.daemon.access import client_identity, stream_client
from chopper.daemon.ratelimit import BURST_S, RateLimiter, StreamSlots
from tests.support.fake_clock import FakeClock

START_S = 1e9  # the limiter reads seconds: any start serves on which a float still resolves 0.2 s steps


def test_burst_then_rate_then_refill() -> None:
    clock = FakeClock(START_S)
    limiter = RateLimiter(5.0, clock)
    burst = int(5.0 * BURST_S)
    assert [limiter.admit("a") for _ in range(burst + 1)] == [True] * burst + [False]
    assert limiter.admit("b")  # another key has its own bucket
    clock.now += 0.2  # one token back at 5 per second
    assert limiter.admit("a") and not limiter.admit("a")
    clock.now += 3600  # refills to the burst, never beyond
    assert sum(limiter.admit("a") for _ in range(3 * burst)) == burst


def test_zero_rate_admits_everything_and_keeps_no_state() -> None:
    limiter = RateLimiter(0.0, FakeClock(START_S))
    assert all(limiter.admit(i) for i in range(10_000)) and len(limiter) == 0
    assert limiter.stream_bucket() is None


def test_a_flood_of_identities_cannot_grow_memory() -> None:
    limiter = RateLimiter(1.0, FakeClock(START_S), max_keys=100)
    for i in range(10_000):
        limiter.admit(("ipv4:10.0.0.1", i))
    assert len(limiter) == 100


class Context:
    """What ``client_identity`` reads of a call: its peer and auth context."""

    def __init__(self, peer: str, auth: dict[str, list[bytes]] | None = None) -> None:
        self._peer, self._auth = peer, auth or {}

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


def test_client_identity() -> None:
    assert client_identity(Context("ipv4:10.1.2.3:5555", {"x509_common_name": [b"node17"]})) == "cn:node17"
    assert client_identity(Context("unix:")) == "unix"
    assert client_identity(Context("ipv4:10.1.2.3:40000")) == client_identity(Context("ipv4:10.1.2.3:40001"))
    assert client_identity(Context("ipv4:10.1.2.3:40000")) == "ipv4:10.1.2.3"
    assert client_identity(Context("ipv6:[::1]:40000")) == "ipv6:[::1]"


def test_stream_slots_bound_the_total_and_each_client() -> None:
    slots = StreamSlots(total=4, per_client=3)
    assert [slots.acquire("a") for _ in range(4)] == ["", "", "", "streams_per_client"]
    assert slots.acquire("b") == "" and slots.acquire("c") == "too_many_streams"
    slots.release("a")
    assert slots.acquire("c") == "" and slots.open == 4
    for key in ("a", "a", "b", "c"):
        slots.release(key)
    assert slots.open == 0 and slots.acquire("a") == ""


def test_a_stream_key_names_a_local_process_only_on_the_unix_socket() -> None:
    assert stream_client("unix", (("chopper-pid", "4242"),)) == "unix:pid=4242"
    assert stream_client("unix", (("chopper-pid", "x; drop"),)) == "unix"
    assert stream_client("unix", ()) == "unix"
    assert stream_client("ipv4:10.0.0.1", (("chopper-pid", "4242"),)) == "ipv4:10.0.0.1"
