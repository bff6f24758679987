"""Fuzz recorded-run tables (``chopper.runs.rundir``), their replay and attribution, and the aggregator's store reader.

Properties:

- ``read_run`` on a run directory whose tables were mutated (Parquet or CSV; columns dropped,
  added or retyped; values NaN, infinite, beyond 64 bits, negative, out of order, text, lists;
  file bytes cut short or flipped; CSV rows ragged) returns typed tables (integer columns int64,
  rows sorted by ``ts_ns``) or raises ``RunDirError`` naming the file or the table.
- A run it accepts can be replayed: ``ReplayBackend.open`` gives devices or ``BackendUnavailable``,
  and each ``sample`` call, looping or not, returns promptly at most two recorded cycles.
- ``read_step_store`` on a mutated aggregator store returns rows or raises ``AttributionError``.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from agent.backends.base import BackendUnavailable
from agent.backends.replay import ReplayBackend
from aggregator.jobs import JobTable
from aggregator.store import Store
from chopper.attribution import AttributionError
from chopper.attribution.store_reader import read_step_store
from chopper.runs.rundir import COLUMNS, TABLES, RunDirError, read_run, write_run
from chopper.schema import DeviceInfo, MarkerKind, Sample
from tests.support.strategies import edit, fuzz
from tests.support.summaries import summary

NS = 1_000_000_000
T0 = 1_700_000_000 * NS
ROOT = Path(tempfile.mkdtemp(prefix="chopper-fuzz-runs-"))


def _valid_run(path: Path) -> Path:
    """Two GPUs, one step of one rank with a phase: every table non-trivial."""
    devices = [DeviceInfo("n1", g, "amd", "MI300X", f"u{g}", 2100.0, 1.3e15, 2**37, 750.0) for g in range(2)]
    samples = [Sample(T0 + i * 10_000_000, "n1", g, gfx_clock_mhz=2000.0, busy_ratio=0.9, power_w=600.0,
                      energy_j=6.0 * i, throttle_power_s=0.001 * i) for i in range(6) for g in range(2)]
    marker = dict(job="j", node="n1", rank=0, gpu=0, step=1, flops=np.nan, tokens=np.nan, bytes=np.nan)
    markers = [{**marker, "ts_ns": T0 + 5_000_000, "kind": MarkerKind.STEP_BEGIN, "name": ""},
               {**marker, "ts_ns": T0 + 6_000_000, "kind": MarkerKind.PHASE_BEGIN, "name": "forward"},
               {**marker, "ts_ns": T0 + 30_000_000, "kind": MarkerKind.PHASE_END, "name": "forward"},
               {**marker, "ts_ns": T0 + 45_000_000, "kind": MarkerKind.STEP_END, "name": "", "flops": 1e13}]
    return write_run(path, devices, samples, markers)


VALID_RUN = _valid_run(ROOT / "valid")
_hostile_values = st.sampled_from([
    [np.nan], [np.inf], [-np.inf], [1e20], [-1.0], [2**62], [0], ["x"], [""], [None], [True], [[1, 2]], ["1e3"],
    [T0 - 10**15], [-(2**63)], [2**63 - 1],
])


@st.composite
def _mutation(draw: st.DrawFn) -> tuple[str, str, Any]:
    """One change to one table: (table, operation, argument)."""
    table = draw(st.sampled_from(TABLES))
    op = draw(st.sampled_from(["csv", "drop", "extra", "values", "uint64", "shuffle", "cut", "flip", "csv_text",
                               "ragged", "empty"]))
    column = draw(st.sampled_from(COLUMNS[table]))
    if op == "values":
        return table, op, (column, draw(_hostile_values), draw(st.integers(0, 20)))
    if op in ("cut", "flip", "csv_text"):
        return table, op, (draw(st.integers(0, 4000)), draw(st.binary(min_size=1, max_size=4)))
    return table, op, column


def _apply(run: Path, table: str, op: str, arg: Any) -> None:
    parquet, csv = run / f"{table}.parquet", run / f"{table}.csv"
    current = parquet if parquet.exists() else csv
    if op in ("cut", "flip", "csv_text"):
        if op == "csv_text" and current == parquet:
            try:
                pd.read_parquet(parquet).to_csv(csv, index=False)
            except Exception:  # an earlier mutation broke it: edit the Parquet bytes instead
                op = "insert"
            else:
                parquet.unlink()
                current = csv
        at, extra = arg
        current.write_bytes(edit(current.read_bytes(), "insert" if op == "csv_text" else op, at, extra))
        return
    try:
        frame = pd.read_parquet(parquet) if current == parquet else pd.read_csv(csv, dtype=str)
    except Exception:  # an earlier mutation already broke the file: the read below must say so
        return
    try:
        _rewrite(frame, op, arg, parquet, csv)
    except Exception:  # the frame holds what neither format can take (text pyarrow cannot convert)
        return


def _rewrite(frame: pd.DataFrame, op: str, arg: Any, parquet: Path, csv: Path) -> None:
    """Write ``frame`` back after the table-level mutation ``op``."""
    current = parquet if parquet.exists() else csv
    if op == "csv":
        frame.to_csv(csv, index=False)
        parquet.unlink(missing_ok=True)
        return
    if op == "drop":
        frame = frame.drop(columns=[arg], errors="ignore")
    elif op == "extra":
        frame[arg + "_extra"] = 1
    elif op == "values":
        column, values, row = arg
        if len(frame) and column in frame:
            frame[column] = frame[column].astype(object)
            frame.iat[row % len(frame), frame.columns.get_loc(column)] = values[0]
    elif op == "shuffle":
        frame = frame.iloc[::-1]
    elif op == "empty":
        frame = frame.iloc[:0]
    if op == "uint64" and arg in frame and current == parquet:
        with_max = pq.read_table(parquet)  # readable: pd.read_parquet above succeeded
        i = with_max.column_names.index(arg)
        pq.write_table(with_max.set_column(i, arg, pa.array([2**64 - 1] * len(frame), pa.uint64())), parquet)
        return
    if op == "ragged":
        text = frame.to_csv(index=False).replace("\n", ",1\n").replace(",1\n", "\n", 1)
        csv.write_text(text)
        parquet.unlink(missing_ok=True)
        return
    if current == parquet:
        try:
            frame.to_parquet(parquet, index=False)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):  # Parquet cannot store that mixture
            frame.to_csv(csv, index=False)
            parquet.unlink()
    else:
        frame.to_csv(csv, index=False)


def _case_dir() -> Path:
    return Path(tempfile.mkdtemp(dir=ROOT))


@pytest.mark.slow
@fuzz(120, timeout_s=180)
@given(st.lists(_mutation(), min_size=1, max_size=3), st.booleans())
@example([("samples", "values", ("ts_ns", [1e20], 0))], False)  # beyond int64: was cast to garbage
@example([("samples", "uint64", "ts_ns")], False)  # uint64 2**64-1: wrapped to -1
@example([("devices", "ragged", "gpu")], False)  # extra cells: pandas shifted every column
@example([("samples", "values", ("ts_ns", [-(2**63)], 0))], True)  # span beyond int64
@example([("devices", "flip", (24, b"\x80"))], False)  # invalid UTF-8 in a Parquet text column
@example([("samples", "csv", "ts_ns"), ("samples", "flip", (1849, b"\x0e"))], True)  # replayed three cycles
def test_recorded_run_reads_and_replays_or_says_why(mutations: list[tuple[str, str, Any]],
                                                    loop: bool) -> None:
    run = Path(shutil.copytree(VALID_RUN, _case_dir() / "run"))
    for table, op, arg in mutations:
        _apply(run, table, op, arg)
    try:
        recorded = read_run(run)
    except RunDirError as exc:
        message = str(exc)
        assert str(run) in message or any(t in message for t in TABLES), message
        return
    for table in TABLES:
        frame = getattr(recorded, table)
        assert tuple(frame.columns) == COLUMNS[table]
        if "ts_ns" in frame:
            assert frame["ts_ns"].dtype == np.int64 and frame["ts_ns"].is_monotonic_increasing
    _replay(run, loop, len(recorded.samples))


def _replay(run: Path, loop: bool, recorded: int) -> None:
    backend = ReplayBackend("live", run, speed=1e6, loop=loop)
    try:
        backend.open()
    except BackendUnavailable as exc:
        assert "replay:" in str(exc)
        return
    now = T0
    for _ in range(4):
        now += 3600 * NS  # an hour per call at a million times real speed: many cycles pass each time
        assert len(backend.sample(now)) <= 2 * recorded
    backend.close()


def test_replay_of_a_nanosecond_recording_stays_bounded(tmp_path: Path) -> None:
    """Timestamps written in seconds (a few ns apart): looping once replayed 10**8 samples per call."""
    run = _valid_run(tmp_path / "run")
    frame = pd.read_parquet(run / "samples.parquet")
    frame["ts_ns"] = np.arange(len(frame)) // 2
    frame.to_parquet(run / "samples.parquet", index=False)
    backend = ReplayBackend("live", run, loop=True)
    backend.open()
    backend.sample(T0)
    counters = [s.energy_j for s in backend.sample(T0 + NS // 10) if s.gpu == 0]
    assert 0 < len(counters) <= 2 * len(frame)
    assert counters == sorted(counters), "cumulative counters never go backwards across cycles"


def _valid_store(root: Path) -> Path:
    table = JobTable(30.0, join_s=0.0)
    store = Store(root, flush_rows=1)
    for job in ("j", "k/1"):
        done = table.add([summary(job, r, s) for s in range(3) for r in range(2)], T0)
        store.append(done.rows)
    store.append(table.close(T0 + 60 * NS).rows)
    store.close()
    return root


VALID_STORE = _valid_store(ROOT / "valid-steps")
_store_mutation = st.tuples(
    st.sampled_from(["cut", "flip", "junk_file", "bad_partition", "drop_column", "empty_file", "empty_dir"]),
    st.integers(0, 10_000), st.binary(min_size=1, max_size=4),
)


@fuzz(100, timeout_s=120)
@given(st.lists(_store_mutation, min_size=1, max_size=3), st.sampled_from([None, "j", "k/1", "nope"]))
@example([("drop_column", 397, b"\x00")], None)  # a part file without a column: idxmax over all-NaN failed
@example([("flip", 3848, b"\x80")], None)  # a column name no longer UTF-8: UnicodeDecodeError
def test_step_store_reads_or_says_why(mutations: list[tuple[str, int, bytes]], job: str | None) -> None:
    root = Path(shutil.copytree(VALID_STORE, _case_dir() / "steps"))
    for op, at, extra in mutations:
        parts = sorted(root.rglob("part-*.parquet"))
        part = parts[at % len(parts)] if parts else None
        if op in ("cut", "flip") and part is not None:
            part.write_bytes(edit(part.read_bytes(), op, at, extra))
        elif op == "junk_file":
            (root / "job=j" / "notes.txt").write_bytes(extra)
        elif op == "bad_partition":
            (root / "job=%ZZ" / "date=yesterday").mkdir(parents=True, exist_ok=True)
        elif op == "drop_column" and part is not None:
            try:
                t = pq.read_table(part)
            except (pa.ArrowException, OSError):  # an earlier mutation broke it already
                continue
            pq.write_table(t.drop_columns([t.column_names[at % t.num_columns]]), part)
        elif op == "empty_file" and part is not None:
            part.write_bytes(b"")
        elif op == "empty_dir":
            (root / "job=empty" / "date=2024-01-01").mkdir(parents=True, exist_ok=True)
    try:
        result = read_step_store(root, job=job)
    except AttributionError as exc:
        assert f"step store {root}" in str(exc)
    else:
        assert len(result.steps) and (job is None or set(result.steps["job"]) == {job})
