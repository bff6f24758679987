"""Fuzz the aggregator's write-ahead log replay (``aggregator.wal``) and the recovery built on it.

Properties:

- ``read_segment`` of any bytes never raises; of a genuine segment that was cut, flipped or
  padded, it returns genuine records in order (the CRC covers kind, lsn and payload): every
  record the edit did not touch (a cut keeps those before it, resynchronisation those after a
  flip or an insert), and says the segment was damaged whenever it returns fewer.
- ``Aggregator.recover`` on a store whose log segments were mutated (or joined by stray files
  and directories named like segments) finishes, counts what it skipped, replays only genuine
  records, and the aggregator then takes deliveries and closes cleanly.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from aggregator.wal import Record, Wal, parse_segment, read_segment
from tests.support.aggregator_life import FakeAgent, life, run_steps
from tests.support.fake_clock import START_NS, FakeClock
from tests.support.strategies import edit, fuzz

ROOT = Path(tempfile.mkdtemp(prefix="chopper-fuzz-wal-"))


def _crashed_store() -> Path:
    """A store whose aggregator died (no ``close``) after 4 steps of two agents: flushed files and a log."""
    root = ROOT / "crashed"
    core = life(root, FakeClock(START_NS), segment_bytes=1 << 20)
    run_steps(core, FakeClock(START_NS), [FakeAgent("a0"), FakeAgent("a1")], range(4))
    assert core.wal is not None
    core.wal.close()  # the flusher stops; what is on disk is what a kill -9 leaves
    return root


CRASHED = _crashed_store()
SEGMENTS = sorted((CRASHED / "_wal").glob("segment-*.log"))
GENUINE = {(r.kind, r.lsn, r.payload) for seg in SEGMENTS for r in read_segment(seg)[0]}

_edit = st.tuples(st.sampled_from(["cut", "flip", "insert", "stray_file", "stray_dir", "empty"]),
                  st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8))


def _key(r: Record) -> tuple[int, int, bytes]:
    return r.kind, r.lsn, r.payload


@fuzz(400, timeout_s=60)
@given(st.one_of(st.binary(max_size=512), st.tuples(st.integers(0, 1 << 16), st.binary(max_size=8))))
def test_read_segment_returns_every_untouched_genuine_record(case: bytes | tuple[int, bytes]) -> None:
    path = Path(tempfile.mkdtemp(dir=ROOT)) / "segment-00000000000000000001.log"
    genuine = SEGMENTS[0].read_bytes()
    if isinstance(case, bytes):
        path.write_bytes(case)
        records, _ = read_segment(path)
        assert all(r.kind in (1, 2, 3) for r in records)
        return
    at, extra = case
    at %= len(genuine) + 1
    data = genuine[:at] + extra + genuine[at:] if extra else genuine[:at]
    path.write_bytes(data)
    records, damaged = read_segment(path)
    original, _ = read_segment(SEGMENTS[0])
    got = [_key(r) for r in records]
    assert got == sorted(set(got), key=lambda k: k[1]) and set(got) <= {_key(r) for r in original}
    # A record is untouched when it ends before the edit or (an insert) starts at or after it.
    pos, untouched = 12, []
    for r in original:
        end = pos + 4 + 17 + len(r.payload)
        if end <= at or (extra and pos >= at and at >= 12):
            untouched.append(_key(r))
        pos = end
    assert set(untouched) <= set(got), (at, extra)
    assert damaged or len(records) == len(original) or genuine.startswith(data)
    assert len(parse_segment(data, 1).records) == len(records)


@fuzz(80, timeout_s=180)
@given(st.lists(_edit, min_size=1, max_size=3))
@example([("stray_dir", 0, b"x")])  # a directory named like a segment
@example([("flip", 40, b"\x01")])  # a flipped byte inside the first record
def test_recovery_of_a_mutated_log(edits: list[tuple[str, int, bytes]]) -> None:
    root = Path(shutil.copytree(CRASHED, Path(tempfile.mkdtemp(dir=ROOT)) / "store"))
    wal_dir = root / "_wal"
    for op, at, extra in edits:
        segments = sorted(wal_dir.glob("segment-*.log"))
        files = [s for s in segments if s.is_file()]
        target = files[at % len(files)] if files else None
        if op in ("cut", "flip", "insert") and target is not None:
            target.write_bytes(edit(target.read_bytes(), op, at, extra))
        elif op == "stray_file":
            (wal_dir / f"segment-{at:020d}.log").write_bytes(extra)
        elif op == "stray_dir":
            (wal_dir / f"segment-{at + 10**12:020d}.log").mkdir(exist_ok=True)
        elif op == "empty" and target is not None:
            target.write_bytes(b"")
    replayed = [_key(r) for r in Wal(wal_dir).replay()]
    assert set(replayed) <= GENUINE, "only records the aggregator wrote are replayed"
    core = life(root, FakeClock(START_NS))  # recover() runs here
    agent = FakeAgent("a2")
    run_steps(core, FakeClock(START_NS), [agent], range(10, 12), nodes=(0,))
    core.close()
