"""Write-ahead log damage: one bad byte costs its record only, torn tails and corruption are told apart, and
whatever the log directory holds, the aggregator starts, setting aside what it cannot read."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pandas as pd
import pytest

from aggregator.wal import BATCH, LEDGER, QUARANTINE, Wal, _encode, file_header, parse_segment
from chopper.demo.run import metric_sum
from tests.support.aggregator_life import FakeAgent, life, run_steps, stored
from tests.support.daemons import AggregatorProcess
from tests.support.fake_clock import START_NS, FakeClock
from tests.support.grpc_delivery import deliver
from tests.support.hazards import HazardOutcome
from tests.support.summaries import summary

RECORDS = 40


def _segment(tmp_path: Path) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """A segment the log wrote (a ledger head and RECORDS batches) and its records as (kind, lsn, payload)."""
    wal = Wal(tmp_path / "wal", commit_interval_s=0.0)
    wal.start([(LEDGER, b"snapshot")])
    for i in range(RECORDS - 1):
        wal.append(BATCH, bytes([i]) * (8 + i % 5))
    wal.sync(wal.appended_lsn)
    wal.close()
    path = next((tmp_path / "wal").glob("segment-*.log"))
    data = path.read_bytes()
    return data, [(r.kind, r.lsn, r.payload) for r in parse_segment(data, 1).records]


def _offsets(data: bytes, version: int) -> list[int]:
    """Where each record of an intact segment starts, and its end."""
    pos, out = (12, [12]) if version == 2 else (0, [0])
    read = parse_segment(data, 1)
    for r in read.records:
        pos += (4 if version == 2 else 0) + 17 + len(r.payload)
        out.append(pos)
    return out


@pytest.mark.hazard(item=8, input="every single byte of a 40-record segment flipped in turn (both formats)",
                    promise="one bad byte costs at most the record it hit; the records after it are replayed, and "
                            "the loss is counted as corruption (or as a torn tail at the very end)")
def test_one_bad_byte_anywhere_costs_only_its_record(tmp_path: Path, hazard: HazardOutcome) -> None:
    data, genuine = _segment(tmp_path)
    # The same records as version 1 wrote them (no file header, no sync words): still read and resynchronised.
    legacy = b"".join(_encode(k, lsn, p)[4:] for k, lsn, p in genuine)
    assert len(parse_segment(legacy, 1).records) == RECORDS and parse_segment(legacy, 1).version == 1
    worst = {}
    for name, segment, version in (("v2", data, 2), ("v1", legacy, 1)):
        bounds = _offsets(segment, version)
        worst[name] = 0
        for at in range(len(segment)):
            bad = bytearray(segment)
            bad[at] ^= 0x5A
            read = parse_segment(bytes(bad), 1)
            got = [(r.kind, r.lsn, r.payload) for r in read.records]
            hit = next((i for i in range(RECORDS) if bounds[i] <= at < bounds[i + 1]), None)
            assert got == [g for i, g in enumerate(genuine) if i != hit] or got == genuine, (name, at, read.damage)
            lost = RECORDS - len(got)
            worst[name] = max(worst[name], lost)
            counted = sum(d.lost for d in read.damage if not d.torn) + sum(d.torn for d in read.damage)
            assert counted == lost, (name, at, read.damage)  # every loss counted, as corruption or torn tail
            if hit is not None and hit < RECORDS - 1:
                assert lost == 1 and not any(d.torn for d in read.damage), (name, at, read.damage)
    assert worst == {"v2": 1, "v1": 1}
    hazard.outcome = (f"{len(data)} + {len(legacy)} single-byte flips of a {RECORDS}-record segment (v2 and v1): at "
                      f"most 1 record lost per flip, each counted as corruption, "
                      "or as a torn tail when it hit the last record")


@pytest.mark.hazard(item=8, input="a segment cut in its last record vs a byte flipped in a middle record",
                    promise="a torn tail and corruption in the middle are counted and logged apart")
def test_torn_tail_and_corruption_are_told_apart(tmp_path: Path, hazard: HazardOutcome,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    data, _ = _segment(tmp_path)
    path = next((tmp_path / "wal").glob("segment-*.log"))
    bounds = _offsets(data, 2)
    figures = {}
    middle = (bounds[20] + bounds[21]) // 2
    for case, bad in (("torn", data[:-3]), ("corrupt", data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:])):
        path.write_bytes(bad)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aggregator.wal"):
            wal = Wal(tmp_path / "wal")
            replayed = len(list(wal.replay()))
        stats = wal.stats()
        figures[case] = (replayed, stats["torn_records_total"], stats["corrupt_records_total"],
                         sorted({r.getMessage().split()[0] for r in caplog.records}))
    assert figures["torn"] == (RECORDS - 1, 1, 0, ["event=wal_torn_tail"])
    assert figures["corrupt"] == (RECORDS - 1, 0, 1, ["event=wal_corrupt"])
    hazard.outcome = (f"cut tail: {figures['torn'][0]} of {RECORDS} replayed, torn=1 corrupt=0, warning wal_torn_tail; "
                      f"flipped middle record: {figures['corrupt'][0]} replayed, torn=0 corrupt=1, error wal_corrupt")


def _strays(wal_dir: Path) -> dict[str, str]:
    """Entries recovery must set aside, by the reason it must give."""
    wal_dir.mkdir(parents=True, exist_ok=True)
    (wal_dir / f"segment-{10**12:020d}.log").mkdir()
    (wal_dir / f"segment-{10**12 + 1:020d}.log").write_bytes(b"")
    (wal_dir / f"segment-{10**12 + 2:020d}.log").write_bytes(file_header()[:5])
    (wal_dir / f"segment-{10**12 + 3:020d}.log").write_bytes(file_header(3) + b"a record of a future format")
    (wal_dir / "segment-7.log").write_bytes(b"not named as the log names segments")
    os.mkfifo(wal_dir / f"segment-{10**12 + 4:020d}.log")  # reading it would block the start forever
    (wal_dir / QUARANTINE).write_bytes(b"a file where the quarantine directory goes")
    return {f"segment-{10**12:020d}.log": "not_a_file", f"segment-{10**12 + 1:020d}.log": "empty",
            f"segment-{10**12 + 2:020d}.log": "truncated_header", f"segment-{10**12 + 3:020d}.log": "newer_version",
            "segment-7.log": "name", f"segment-{10**12 + 4:020d}.log": "not_a_file",
            f"{QUARANTINE}.not-a-directory": "name"}


@pytest.mark.hazard(item=8, input="log directory holding a directory and a FIFO named like segments, a zero-length "
                                  "segment, a cut header, a newer version's segment, wrongly named files, a file "
                                  "named like the quarantine",
                    promise="recovery never refuses to start: what it cannot read is moved to quarantine/, counted "
                            "by reason, and every acknowledged summary is still stored once")
def test_recovery_sets_aside_what_it_cannot_read(tmp_path: Path, hazard: HazardOutcome) -> None:
    agents = [FakeAgent("node0"), FakeAgent("node1")]
    clock = FakeClock(START_NS)
    core = life(tmp_path, clock)
    run_steps(core, clock, agents, range(0, 3))
    del core  # kill -9
    expected = _strays(tmp_path / "_wal")
    core = life(tmp_path, clock)  # recover() runs here and must not raise
    assert core.wal is not None
    counted = {k: v for k, v in core.wal.set_aside.items() if v}
    quarantined = sorted(p.name for p in (tmp_path / "_wal" / QUARANTINE).iterdir())
    assert quarantined == sorted(expected)
    assert counted == pd.Series(expected).value_counts().to_dict()
    for a in agents:
        a.reconnect(core)
    run_steps(core, clock, agents, range(3, 5))
    core.close()
    frame = stored(tmp_path)
    made = sum(len(a.buffer) for a in agents)
    assert len(frame) == made and not frame.duplicated(["job", "rank", "step"]).any()
    # A log directory that is a file is set aside too, and the log starts afresh beside it.
    (tmp_path / "_wal").rename(tmp_path / "old-wal")
    (tmp_path / "_wal").write_bytes(b"a file where the log directory should be")
    core = life(tmp_path, clock)
    assert core.wal is not None and core.wal.set_aside["not_a_file"] == 1
    core.close()
    hazard.outcome = (f"started every time; set aside {sum(counted.values())} entries by reason {counted} and a file "
                      f"at the log directory's path; {len(frame)} of {made} summaries stored once")


def _record_bounds(segment: Path) -> list[tuple[int, int, int]]:
    """(kind, start, end) of every record of an intact version-2 segment."""
    data = segment.read_bytes()
    pos, out = 12, []
    for r in parse_segment(data, int(segment.name[8:28])).records:
        end = pos + 4 + 17 + len(r.payload)
        out.append((r.kind, pos, end))
        pos = end
    return out


@pytest.mark.slow
@pytest.mark.hazard(item=8, input="one byte flipped in the middle of a real aggregator's log (680 acked rows in 68 "
                                  "records, killed -9), stray entries beside it",
                    promise="rows stored = rows acknowledged - the rows of the one damaged record, which are counted "
                            "lost; nothing duplicated; the aggregator starts")
def test_flipped_byte_in_a_live_log_loses_only_its_record(tmp_path: Path, hazard: HazardOutcome) -> None:
    store = tmp_path / "store"
    agg = AggregatorProcess(tmp_path, "agg", "--store-dir", str(store), "--flush-interval-s", "3600").start()
    ranks, steps = 10, 68
    try:
        batches = [[summary("w", r, s) for r in range(ranks)] for s in range(steps)]
        acks = deliver(agg.address, "node0", "inc-0", batches)
        assert acks[-1] == ranks * steps  # every summary acknowledged, so fsynced in the log
        agg.kill()
        segment = max((store / "_wal").glob("segment-*.log"))
        batches = [(start, end) for kind, start, end in _record_bounds(segment) if kind == BATCH]
        assert len(batches) == steps
        start, end = batches[steps // 2]
        data = bytearray(segment.read_bytes())
        data[(start + end) // 2] ^= 0xFF
        segment.write_bytes(bytes(data))
        expected = _strays(store / "_wal")
        agg.start()
        metrics = agg.metrics()
        corrupt = metric_sum(metrics, "chopper_aggregator_wal_corrupt_records_total")
        torn = metric_sum(metrics, "chopper_aggregator_wal_torn_records_total")
        set_aside = metric_sum(metrics, "chopper_aggregator_wal_set_aside_total")
    finally:
        agg.stop()
    assert agg.proc is not None and agg.proc.returncode == 0
    frame = pd.read_parquet(store)
    keys = set(zip(frame["rank"], frame["step"], strict=True))
    missing = {(r, s) for r in range(ranks) for s in range(steps)} - keys
    assert missing == {(r, steps // 2) for r in range(ranks)}, sorted(missing)[:20]
    assert len(frame) == len(keys) == ranks * steps - ranks
    assert (corrupt, torn, set_aside) == (1, 0, len(expected))
    hazard.outcome = (f"{acks[-1]} rows acknowledged, {len(frame)} stored after the restart, 0 duplicated; the {ranks} "
                      f"of the damaged record lost and counted (wal_corrupt_records_total={corrupt:.0f}, torn=0); "
                      f"{set_aside:.0f} stray entries set aside, the aggregator started and stopped with 0")
