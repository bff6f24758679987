"""Delivery to aggregator replicas over real gRPC sockets: routing, resend after a restart, exact loss.

The replicas here are a minimal real ``chopper.v1.Aggregator`` servicer over ``aggregator.ledger``
(what the real servicer does with a batch), recording every summary it takes in, so these tests
exercise the agent side of the protocol independently of the aggregator service.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from agent.buffers import RingBuffer
from agent.delivery import Forwarder, parse_targets, resolve, route, stable_hash
from aggregator.ledger import Ledger
from chopper.demo.run import free_port
from chopper.proto.chopper.v1 import agent_pb2 as pb
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from chopper.proto.chopper.v1 import aggregator_pb2_grpc as apb_grpc


class Replica(apb_grpc.AggregatorServicer):
    """One aggregator replica: a ledger (kept across restarts, as a durable store would) and what it took in."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.ledger = Ledger()
        self.taken: list[tuple[int, str, int]] = []  # (seq, job, step)
        self.lock = threading.Lock()
        self.mute = False  # take summaries in but send no acks (acks lost in a cut)
        self.server: grpc.Server | None = None
        self.streams_opened = 0
        self.streams_open = 0
        self.positions_batches = 0
        self.batches: list[tuple[int, int]] = []  # (summaries, positions) of each batch after a handshake

    def Deliver(self, request_iterator: Iterator[apb.SummaryBatch], context: Any) -> Iterator[apb.DeliveryAck]:
        with self.lock:
            self.streams_opened += 1
            self.streams_open += 1
        try:
            for batch in request_iterator:
                new, acked = self.ledger.accept(batch.agent, batch.incarnation, list(batch.seq), batch.lost_total)
                with self.lock:
                    self.taken += [(batch.seq[i], batch.summaries[i].job, batch.summaries[i].step) for i in new]
                    self.positions_batches += bool(batch.positions)
                    if batch.seq or batch.positions:
                        self.batches.append((len(batch.seq), len(batch.positions)))
                if not self.mute:
                    yield apb.DeliveryAck(incarnation=batch.incarnation, acked_seq=acked)
        finally:
            with self.lock:
                self.streams_open -= 1

    def start(self) -> Replica:
        self.server = grpc.server(futures.ThreadPoolExecutor(8))
        apb_grpc.add_AggregatorServicer_to_server(self, self.server)
        self.server.add_insecure_port(self.address)
        self.server.start()
        return self

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop(0).wait(5)

    def seqs(self) -> list[int]:
        with self.lock:
            return [s for s, _, _ in self.taken]


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started = [Replica().start(), Replica().start()]
    yield started
    for r in started:
        if r.server is not None:
            r.server.stop(0)


def produce(buffer: RingBuffer[pb.StepSummary], jobs: list[str], steps: range) -> int:
    buffer.extend(pb.StepSummary(job=job, step=step, rank=r) for step in steps for job in jobs for r in range(2))
    return len(jobs) * len(steps) * 2


def wait_until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def total(fwd: Forwarder, key: str) -> float:
    return sum(d[key] for d in fwd.snapshot().values())


def test_stable_hash_and_targets() -> None:
    # crc32: the same number in every process (Python's hash() of a str is salted per process).
    assert stable_hash("job") == 0xFBD8E0F8
    assert route("a", ("x:1",)) == "x:1"
    assert parse_targets(" a:1, b:2 ") == ["a:1", "b:2"]
    with pytest.raises(ValueError, match="host:port"):
        parse_targets("a")
    with pytest.raises(ValueError, match="alone"):
        parse_targets("dns:///svc:9480,b:2")

    def fake_dns(host: str, port: int, type: int = 0) -> list[tuple[Any, ...]]:
        assert host == "aggregator.chopper.svc"
        return [(2, 1, 6, "", ("10.0.0.9", port)), (2, 1, 6, "", ("10.0.0.3", port)),
                (10, 1, 6, "", ("fd00::1", port, 0, 0)), (2, 1, 6, "", ("10.0.0.3", port))]

    # Sorted and de-duplicated, so every agent routes the same job to the same replica.
    assert resolve(["dns:///aggregator.chopper.svc:9480"], fake_dns) == ("10.0.0.3:9480", "10.0.0.9:9480",
                                                                          "[fd00::1]:9480")


def test_each_job_lands_on_exactly_one_replica(replicas: list[Replica]) -> None:
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(10_000)
    fwd = Forwarder(buffer, "n1", ",".join(r.address for r in replicas), batch=64, interval_s=0.02)
    fwd.start()
    try:
        jobs = [f"job-{i}" for i in range(12)]
        n = produce(buffer, jobs, range(40))
        wait_until(lambda: total(fwd, "acked") == n)
        members = tuple(sorted(r.address for r in replicas))
        owners: dict[str, set[str]] = {}
        for rep in replicas:
            with rep.lock:
                for _, job, _ in rep.taken:
                    owners.setdefault(job, set()).add(rep.address)
        assert set(owners) == set(jobs)
        for job, where in owners.items():
            assert where == {route(job, members)}, job
        assert all(len(where) == 1 for where in owners.values())
        assert len({o for w in owners.values() for o in w}) == 2, "12 jobs should use both replicas"
        seqs = replicas[0].seqs() + replicas[1].seqs()
        assert sorted(seqs) == list(range(1, n + 1))
        assert total(fwd, "lost") == 0 and total(fwd, "pending") == 0
        assert all(d["connected"] == 1.0 for d in fwd.snapshot().values())
    finally:
        fwd.stop()


def test_streams_open_only_where_owed_and_close_when_idle(replicas: list[Replica]) -> None:
    owner, other = replicas
    members = tuple(sorted(r.address for r in replicas))
    jobs = [j for j in (f"job-{i}" for i in range(40)) if route(j, members) == owner.address][:3]
    want_positions = threading.Event()

    def positions() -> list[pb.RankPosition]:
        return [pb.RankPosition(job=jobs[0], rank=0, step=1)] if want_positions.is_set() else []

    buffer: RingBuffer[pb.StepSummary] = RingBuffer(10_000)
    fwd = Forwarder(buffer, "n1", ",".join(members), batch=16, interval_s=0.02, idle_close_s=0.5,
                    positions=positions)
    fwd.start()
    try:
        n = produce(buffer, jobs, range(20))
        wait_until(lambda: total(fwd, "acked") == n)
        # The replica that owns none of this node's jobs is never connected to.
        assert other.streams_opened == 0 and fwd.snapshot()[other.address]["connected"] == 0
        assert owner.streams_opened == 1
        # Nothing more to send: the stream closes, with everything acknowledged.
        wait_until(lambda: owner.streams_open == 0 and fwd.snapshot()[owner.address]["connected"] == 0)
        assert total(fwd, "pending") == 0
        # New summaries open it again and go exactly once.
        n += produce(buffer, jobs, range(20, 30))
        wait_until(lambda: total(fwd, "acked") == n)
        assert owner.streams_opened == 2
        assert sorted(owner.seqs()) == list(range(1, n + 1))
        assert owner.ledger.stats()["duplicate_total"] == 0 and total(fwd, "lost") == 0
        wait_until(lambda: owner.streams_open == 0)
        # Positions of a job the replica owns open a stream and keep it open while they last.
        want_positions.set()
        wait_until(lambda: owner.streams_open == 1 and owner.positions_batches > 0)
        time.sleep(1.5)  # three idle-close periods
        assert owner.streams_open == 1 and owner.streams_opened == 3
        want_positions.clear()
        wait_until(lambda: owner.streams_open == 0)
        assert other.streams_opened == 0
    finally:
        fwd.stop()


def test_positions_ride_on_the_summaries_of_a_job_stepping_once_a_second(replicas: list[Replica]) -> None:
    rep = replicas[0]
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(1000)
    fwd = Forwarder(buffer, "n1", rep.address, interval_s=0.02,
                    positions=lambda: [pb.RankPosition(job="a", rank=r, step=1) for r in (0, 1)])
    fwd.start()
    try:
        n = 0
        for step in range(4):
            n += produce(buffer, ["a"], range(step, step + 1))
            time.sleep(1.0)
        wait_until(lambda: total(fwd, "acked") == n)
        with rep.lock:
            batches = list(rep.batches)
        # One batch a step, carrying both; a batch of positions alone at most before the first summaries.
        assert sum(1 for summaries, _ in batches if summaries) == 4, batches
        assert sum(1 for summaries, _ in batches if not summaries) <= 1, batches
        assert all(positions == 2 for summaries, positions in batches[-3:]), batches
    finally:
        fwd.stop()


def test_resend_after_replica_restart_loses_and_duplicates_nothing(replicas: list[Replica]) -> None:
    rep = replicas[0]
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(10_000)
    fwd = Forwarder(buffer, "n1", rep.address, batch=50, interval_s=0.02)
    fwd.start()
    try:
        n = produce(buffer, ["a", "b"], range(50))
        wait_until(lambda: total(fwd, "acked") == n)
        # The replica takes the next summaries in but its acks never arrive, then it goes away.
        rep.mute = True
        n += produce(buffer, ["a", "b"], range(50, 80))
        wait_until(lambda: len(rep.seqs()) == n)
        rep.stop()
        n += produce(buffer, ["a", "b"], range(80, 200))
        wait_until(lambda: total(fwd, "connected") == 0, 30)  # the forwarder sees the replica go
        rep.mute = False
        rep.start()
        n += produce(buffer, ["a", "b"], range(200, 210))
        wait_until(lambda: total(fwd, "acked") == n and total(fwd, "pending") == 0)
        seqs = rep.seqs()
        assert sorted(seqs) == list(range(1, n + 1)), "every summary exactly once"
        stats = rep.ledger.stats()
        assert stats["received_total"] == n
        # The 120 unacknowledged summaries were resent until the handshake ack came back; the
        # ledger dropped each resend.
        assert 0 <= stats["duplicate_total"] <= 120
        assert stats["lost_total"] == 0 and total(fwd, "lost") == 0
        assert total(fwd, "sent") == n + stats["duplicate_total"]
    finally:
        fwd.stop()


def test_cut_longer_than_the_buffer_counts_loss_exactly_on_both_sides(replicas: list[Replica]) -> None:
    rep = replicas[0]
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(100)
    fwd = Forwarder(buffer, "n1", rep.address, batch=16, interval_s=0.02)
    fwd.start()
    try:
        produced = produce(buffer, ["a"], range(10))  # 20
        wait_until(lambda: total(fwd, "acked") == produced)
        # 30 more reach the replica without acks: in doubt on the agent when the cut comes.
        rep.mute = True
        produced += produce(buffer, ["a"], range(10, 25))
        wait_until(lambda: len(rep.seqs()) == produced)
        rep.stop()
        # 250 while the replica is down: the buffer (100) overwrites 150, among them the doubtful 30.
        for step in range(25, 150):
            produced += produce(buffer, ["a"], range(step, step + 1))
            time.sleep(0.001)
        time.sleep(0.2)
        rep.mute = False
        rep.start()
        produced += produce(buffer, ["a"], range(150, 155))
        wait_until(lambda: total(fwd, "acked") + total(fwd, "lost") == produced and total(fwd, "pending") == 0
                   and rep.ledger.stats()["lost_total"] == total(fwd, "lost"))
        received = rep.seqs()
        assert len(received) == len(set(received))
        never_received = produced - len(received)
        # 51..210 were overwritten (the last 10 pushed out 201..210); 21..50 were on the replica
        # although unacknowledged: its first ack after the cut said so, and none of them is counted lost.
        assert produced == 310 and never_received == 160
        assert set(range(21, 51)) <= set(received)
        assert total(fwd, "lost") == rep.ledger.stats()["lost_total"] == never_received
        assert total(fwd, "acked") == len(received)
    finally:
        fwd.stop()


def test_unreachable_replica_never_blocks_the_producer() -> None:
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(1000)
    fwd = Forwarder(buffer, "n1", f"127.0.0.1:{free_port()}", interval_s=0.01)
    fwd.start()
    try:
        started = time.perf_counter()
        for step in range(2000):
            produce(buffer, ["a"], range(step, step + 1))
        assert time.perf_counter() - started < 2.0
        wait_until(lambda: total(fwd, "lost") + total(fwd, "pending") == 4000)
        assert total(fwd, "pending") <= 1000, "the side table is bounded by the buffer"
    finally:
        fwd.stop()


def test_settings_name_a_bad_aggregator_list() -> None:
    from agent.config import ConfigError, load_settings

    assert load_settings(["--aggregators", "a:9480,b:9480"], env={}).aggregators == "a:9480,b:9480"
    with pytest.raises(ConfigError, match="aggregators"):
        load_settings(["--aggregators", "a"], env={})
    with pytest.raises(ConfigError, match="delivery_batch"):
        load_settings(["--delivery-batch", "0"], env={})


@pytest.mark.parametrize(("targets", "warned"), [
    ("127.0.0.1:9480", False), ("localhost:9480,[::1]:9480", False), ("10.0.0.7:9480", True),
    ("dns:///chopper-aggregator.monitoring:9480", True),
])
def test_plaintext_delivery_to_another_machine_is_warned(targets: str, warned: bool,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    buffer: RingBuffer[pb.StepSummary] = RingBuffer(10)
    fwd = Forwarder(buffer, "n1", targets, interval_s=0.01, getaddrinfo=lambda *a, **k: [])
    with caplog.at_level("WARNING", logger="agent.delivery"):
        fwd.start()
    fwd.stop()
    said = [r.getMessage() for r in caplog.records if "event=plaintext_delivery" in r.getMessage()]
    assert len(said) == int(warned), said
    if warned:
        assert "aggregator_tls_ca" in said[0] and targets.split(",")[0] in said[0]
