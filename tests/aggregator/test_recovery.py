"""Crash and restart in process: acknowledged summaries survive, resends are duplicates, the store holds each once.

A "crash" drops the ``Aggregator``, its job table, store buffer and ledger without ``close`` (the
state a kill -9 leaves: only what is on disk); the next life is built on the same directory
(``tests.support.aggregator_life``).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from aggregator.wal import BATCH, FILES, _encode, read_segment
from chopper.proto.chopper.v1 import aggregator_pb2 as apb
from tests.support.aggregator_life import FakeAgent, life, run_steps, stored
from tests.support.fake_clock import START_NS, FakeClock
from tests.support.summaries import NS, summary


@pytest.mark.parametrize("crashes", [1, 2])
def test_restart_loses_and_doubles_nothing(tmp_path: Path, crashes: int) -> None:
    agents = [FakeAgent("node0"), FakeAgent("node1")]
    clock = FakeClock(START_NS)
    core = life(tmp_path, clock)
    run_steps(core, clock, agents, range(0, 6))
    run_steps(core, clock, agents, range(6, 7), nodes=(0,))  # step 6 of "j" stays open: node1 has not reported
    # node1's last batch is taken in and fsynced, but its ack never arrives.
    run_steps(core, clock, agents, range(7, 8), lose_ack=1)
    assert core.store is not None and core.store.rows_written_total > 0 and core.store.buffered_rows > 0
    assert core.jobs.jobs["j"].open  # state that only the log holds now
    for crash in range(crashes):
        del core  # kill -9: no close, no flush
        core = life(tmp_path, clock)
        assert core.wal is not None and core.wal.stats()["replayed_records_total"] > 0
        for a in agents:
            a.reconnect(core)
        assert agents[1].acked == len(agents[1].buffer)  # the lost ack is answered by the rebuilt ledger
        run_steps(core, clock, agents, range(8 + crash, 9 + crash))
    run_steps(core, clock, agents, range(6, 7), nodes=(1,))
    run_steps(core, clock, agents, range(8 + crashes, 12))
    core.close()
    frame = stored(tmp_path)
    expected = {(s.job, s.rank, s.step) for a in agents for s in a.buffer}
    keys = list(zip(frame["job"], frame["rank"], frame["step"], strict=True))
    assert len(keys) == len(expected) == sum(len(a.buffer) for a in agents), "a summary lost or stored twice"
    assert set(keys) == expected
    assert (frame["wal_id"] >= 0).all() and not frame["late"].any()
    assert core.ledger.stats()["lost_total"] == 0


def test_resent_batch_is_a_duplicate_after_restart(tmp_path: Path) -> None:
    agent = FakeAgent("node0")
    core = life(tmp_path, FakeClock(START_NS))
    agent.produce([summary("j", r, 0) for r in range(4)])
    agent.deliver(core, batch=4, lose_last_ack=True)
    del core
    core = life(tmp_path, FakeClock(START_NS))
    # The agent resends the batch whose ack it never got: the rebuilt ledger knows every number.
    acked = core.deliver(apb.SummaryBatch(agent="node0", incarnation=agent.incarnation, seq=[1, 2, 3, 4],
                                          summaries=agent.buffer))
    assert acked == 4 and core.ledger.stats()["duplicate_total"] == 4
    core.close()
    assert len(stored(tmp_path)) == 4


def test_torn_tail_is_not_acknowledged_and_is_resent(tmp_path: Path) -> None:
    agent = FakeAgent("node0")
    core = life(tmp_path, FakeClock(START_NS))
    agent.produce([summary("j", r, s) for s in range(2) for r in range(4)])
    agent.deliver(core, batch=4)
    assert agent.acked == 8
    del core
    # A record torn by the crash was never acknowledged: simulate one after the acknowledged ones.
    segment = sorted((tmp_path / "_wal").glob("segment-*.log"))[-1]
    with segment.open("ab") as f:
        f.write(b"\x40\x00\x00\x00torn")
    core = life(tmp_path, FakeClock(START_NS))
    assert core.wal is not None and core.wal.stats()["torn_records_total"] == 1
    agent.reconnect(core)
    assert agent.acked == 8
    core.close()
    assert len(stored(tmp_path)) == 8


def test_log_stays_bounded_and_keeps_the_ledger(tmp_path: Path) -> None:
    agent = FakeAgent("node0")
    clock = FakeClock(START_NS)
    core = life(tmp_path, clock, segment_bytes=1024 * 1024)
    assert core.wal is not None
    core.wal.segment_bytes = 1  # rotate at every tick
    seen = []
    for step in range(20):
        clock.now += NS
        agent.produce([summary("j", r, step) for r in range(8)])
        agent.deliver(core, batch=8)
        core.tick()
        seen.append(int(core.wal.stats()["segments"]))
    # Steps complete as they come and flush_rows=35 writes every 5 steps: only the segments of the
    # rows not yet written remain (one per tick since the last write), the one this tick's rotation
    # closed (deleted at the next tick) and the active one. Deterministic: the ticks do not race the flusher.
    assert seen == [2, 3, 4, 5, 2] * 4, seen
    core.wal.sync(core.wal.appended_lsn)  # the flusher creates a rotated segment's file when it gets there
    assert len(list((tmp_path / "_wal").glob("segment-*.log"))) == core.wal.stats()["segments"]
    del core
    core = life(tmp_path, FakeClock(START_NS))
    agent.reconnect(core)
    assert agent.acked == 160  # the ledger snapshot heads the remaining segments
    core.close()
    frame = stored(tmp_path)
    assert len(frame) == 160 and not frame.duplicated(["job", "rank", "step"]).any()
    # After a clean close only the fresh segment with the ledger is left.
    assert len(list((tmp_path / "_wal").glob("segment-*.log"))) == 1


def test_records_that_pass_the_checksum_but_do_not_decode_do_not_block_the_start(tmp_path: Path) -> None:
    agent = FakeAgent("node0")
    core = life(tmp_path, FakeClock(START_NS))
    agent.produce([summary("j", r, s) for s in range(2) for r in range(4)])
    agent.deliver(core, batch=4)
    assert agent.acked == 8
    del core  # crash
    segment = sorted((tmp_path / "_wal").glob("segment-*.log"))[-1]
    last = max(r.lsn for r in read_segment(segment)[0])
    (tmp_path / "job=j").mkdir(exist_ok=True)
    (tmp_path / "job=j" / "bad.parquet").write_bytes(b"not parquet")
    with segment.open("ab") as f:  # what a bug or a bit flip the crc32 misses would leave
        f.write(_encode(BATCH, last + 1, b"\xff\xff\xff not a SummaryBatch"))
        f.write(_encode(FILES, last + 2, b"job=j/bad.parquet"))
        f.write(_encode(FILES, last + 3, b"\xff\xfe not utf-8"))
    core = life(tmp_path, FakeClock(START_NS), recover=False)
    assert core.recover()["unreadable"] == 3  # the bad batch, the corrupt store file, the non-UTF-8 list
    agent.reconnect(core)
    assert agent.acked == 8
    core.close()
    (tmp_path / "job=j" / "bad.parquet").unlink()  # pandas would refuse the whole directory for it
    assert len(stored(tmp_path)) == 8  # every acknowledged summary stored, once
