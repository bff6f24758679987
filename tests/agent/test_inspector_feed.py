"""Inspector records mapped to ranks, placed on their steps and totalled (agent.inspector.feed).

Records are built the way ``chopper.inspector.format.parse_record`` builds them from a dump line
(values as in the plugin README's examples: an AllReduce of 16 GiB in 61 974 µs at 485 GB/s bus
bandwidth, timing source ``kernel_gpu``).
"""
from __future__ import annotations

import pytest

from agent.inspector import feed as feed_mod
from agent.inspector.feed import InspectorFeed, size_bucket
from chopper.inspector.format import InspectorRecord
from chopper.proto.chopper.v1 import agent_pb2 as pb

S = 10**9
BASE = 1_700_000_000 * S


class Clock:
    """A monotonic clock the test moves, ns."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def unheld(feed: InspectorFeed, clock: Clock, *batches: tuple[list[InspectorRecord], str]) -> list[pb.CollectiveRecord]:
    """Add ``batches`` as one poll each, then let their hold run out: the wire records placed."""
    out = []
    for records, path in batches:
        out += feed.add(records, path)
    clock.ns += feed_mod.HOLD_NS
    return out + feed.add([], "")


def record(pid: int = 100, begin_s: float | None = 1.0, end_s: float | None = 1.5, dump_s: float = 2.0,
           comm_ranks: int = 2, comm_rank: int = 1, collective: str = "AllReduce", nbytes: int = 16 * 2**30,
           exec_s: float = 0.061974, bus_gbs: float = 485.119099) -> InspectorRecord:
    return InspectorRecord(
        collective=collective, seq=1407, bytes=nbytes, exec_s=exec_s, timing_source="kernel_gpu",
        algo_gbs=277.210914, bus_gbs=bus_gbs, comm_id="0x7f8c496ae9f661", comm_rank=comm_rank,
        comm_ranks=comm_ranks, comm_nodes=1, hostname="node-a", pid=pid, dump_ns=BASE + int(dump_s * S),
        begin_ns=None if begin_s is None else BASE + int(begin_s * S),
        end_ns=None if end_s is None else BASE + int(end_s * S), version="v4.0",
    )


def test_a_registered_pid_names_job_rank_and_gpu() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "llama", 3, 5)
    (wire,) = feed.add([record()], "")
    assert (wire.job, wire.rank, wire.gpu, wire.placed) == ("llama", 3, 5, True)
    assert wire.begin_ns == BASE + S and wire.end_ns == BASE + int(1.5 * S)
    assert feed.counts().mapped["registration"] == 1
    assert feed.has_feed("llama", 3)


def test_an_unregistered_pid_takes_job_from_the_directory_and_rank_from_its_largest_communicator() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    wires = unheld(feed, clock, ([record(comm_ranks=8, comm_rank=6), record(comm_ranks=2, comm_rank=0)],
                                 "bert/node-a-100.log"), ([record(comm_ranks=2, comm_rank=1)], "bert/node-a-100.log"))
    assert [(w.job, w.rank, w.gpu) for w in wires] == [("bert", 6, -1)] * 3  # the 8-rank world, not the pair
    assert feed.counts().mapped["directory"] == 3


def test_records_dumped_before_the_trainer_registers_are_claimed_by_its_registration() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    assert feed.add([record(), record()], "") == []
    assert feed.counts().held == 2
    clock.ns += feed_mod.HOLD_NS - 1
    claimed = feed.register(100, "llama", 3, 5)
    assert [(w.job, w.rank, w.gpu) for w in claimed] == [("llama", 3, 5)] * 2
    assert feed.counts().mapped["registration"] == 2 and feed.counts().held == 0


def test_a_record_of_no_known_process_outside_a_job_directory_is_unmapped_but_totalled() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    (wire,) = unheld(feed, clock, ([record()], "node-a-100.log"))
    assert (wire.job, wire.rank) == ("", -1)
    counts = feed.counts()
    assert counts.mapped["unmapped"] == 1 and counts.ranks == 0
    assert counts.totals[("", "AllReduce", "ge256MiB")].count == 1


def test_a_pid_two_ranks_registered_is_ambiguous_and_falls_through() -> None:
    # Two containers with their own pid namespaces can both run a trainer as pid 100.
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "a", 0, 0)
    feed.register(100, "b", 0, 1)
    (wire,) = feed.add([record()], "c/x.log")
    assert (wire.job, wire.rank) == ("c", 1)


def test_a_record_without_event_timestamps_ends_at_its_dump_time() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "j", 0, 0)
    (wire,) = feed.add([record(begin_s=None, end_s=None, dump_s=2.0, exec_s=0.25)], "")
    assert not wire.placed
    assert (wire.begin_ns, wire.end_ns) == (BASE + int(1.75 * S), BASE + 2 * S)
    assert feed.counts().unplaced == 1


def test_a_record_spanning_two_steps_counts_its_bytes_where_it_ended() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "j", 0, 0)
    feed.add([record(begin_s=0.8, end_s=1.2, nbytes=1000)], "")
    first = feed.collectives_in("j", 0, BASE, BASE + S)
    second = feed.collectives_in("j", 0, BASE + S, BASE + 2 * S)
    assert [(p.lo_ns - BASE, p.hi_ns - BASE, p.bytes, p.counted) for p in first] == [(int(0.8 * S), S, 0, False)]
    assert [(p.lo_ns - BASE, p.hi_ns - BASE, p.bytes, p.counted) for p in second] == [(S, int(1.2 * S), 1000, True)]


def test_a_step_waits_for_records_dumped_after_its_end() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    assert feed.covers("j", 0, BASE + 5 * S)  # no feed: nothing to wait for
    feed.register(100, "j", 0, 0)
    feed.add([record(dump_s=2.0)], "")
    assert feed.covers("j", 0, BASE + 2 * S) and not feed.covers("j", 0, BASE + 3 * S)


def test_a_rank_that_turned_the_plugin_on_is_waited_for_before_its_first_record() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    feed.register(100, "j", 0, 0, inspector_enabled=True)
    feed.register(200, "k", 0, 1)  # one that did not: never waited for
    assert not feed.covers("j", 0, BASE + S) and feed.covers("k", 0, BASE + S)
    assert not feed.has_feed("j", 0)  # waited for, but no records to take yet
    feed.add([record(dump_s=2.0)], "")
    assert feed.covers("j", 0, BASE + S) and feed.counts().silent == 0


def test_a_rank_whose_records_never_come_turns_silent_and_is_no_longer_waited_for() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    feed.register(100, "j", 0, 0, inspector_enabled=True)
    clock.ns += feed_mod.EXPECT_NS
    assert not feed.covers("j", 0, BASE + S) and feed.counts().silent == 0
    clock.ns += 1
    assert feed.covers("j", 0, BASE + S) and feed.counts().silent == 1
    feed.register(100, "j", 0, 0, inspector_enabled=True)  # later batches do not restart the wait
    assert feed.covers("j", 0, BASE + S)
    feed.forget("j", 0)
    assert feed.counts().silent == 0


def test_totals_add_time_bytes_and_bus_bytes_by_collective_and_size() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "j", 0, 0)
    feed.add([record(nbytes=2**20, exec_s=0.01, bus_gbs=100.0)] * 3 + [record(collective="Garbled", nbytes=10)], "")
    totals = feed.counts().totals
    t = totals[("j", "AllReduce", "1-16MiB")]
    assert (t.count, t.seconds, t.bytes) == (3, pytest.approx(0.03), 3 * 2**20)
    assert t.bus_bytes == pytest.approx(3 * 100e9 * 0.01)
    assert ("j", "other", "lt64KiB") in totals


def test_memory_is_bounded_by_ranks_jobs_and_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feed_mod, "MAX_JOBS", 4)
    monkeypatch.setattr(feed_mod, "MAX_HELD", 3)
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=2, clock=clock)
    for job in range(10):
        feed.add([record(pid=1000 + job, comm_rank=0)], f"job{job}/f.log")
        assert feed.counts().held <= 3
    unheld(feed, clock)
    counts = feed.counts()
    assert counts.ranks == 2 and len({job for job, _, _ in counts.totals}) == 4
    assert feed.has_feed("job9", 0) and not feed.has_feed("job0", 0)


def test_a_forgotten_rank_loses_its_registration_and_intervals() -> None:
    feed = InspectorFeed("node-a", max_ranks=8)
    feed.register(100, "j", 0, 0)
    feed.add([record()], "")
    feed.forget("j", 0)
    assert not feed.has_feed("j", 0)
    assert feed.add([record()], "") == [] and feed.counts().held == 1  # waits for a registration again


def test_size_buckets_are_half_open() -> None:
    assert [size_bucket(b) for b in (0, 64 * 2**10 - 1, 64 * 2**10, 2**20, 2**30)] == [
        "lt64KiB", "lt64KiB", "64KiB-1MiB", "1-16MiB", "ge256MiB"]


def test_a_restarted_trainer_moves_its_rank_to_its_new_pid() -> None:
    clock = Clock()
    feed = InspectorFeed("node-a", max_ranks=8, clock=clock)
    feed.register(100, "j", 0, 0)
    assert feed.register(100, "j", 0, 0) == []  # the same registration again: nothing to do
    feed.register(200, "j", 0, 0)
    (new,) = feed.add([record(pid=200)], "")
    assert (new.job, new.rank) == ("j", 0)
    (old,) = unheld(feed, clock, ([record(pid=100)], ""))  # the old pid names nobody now
    assert (old.job, old.rank) == ("", -1)
