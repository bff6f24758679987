"""Parquet step store: partitions, flushing, read back by pandas, DuckDB and `chopper attribute STORE_DIR`."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aggregator.jobs import JobTable
from aggregator.store import Store, partition_dir
from aggregator.wal import WalError
from chopper.attribution.columns import STEP_COLUMNS
from chopper.attribution.store_reader import is_step_store, read_step_store
from tests.support.fake_clock import FakeClock
from tests.support.summaries import NS, summary

# 2024-03-09T23:59:58Z: two seconds before midnight, so rows land in two date partitions.
T0 = 1_710_028_798 * NS


def run_jobs(store: Store) -> JobTable:
    """Two jobs, four steps each across midnight; rank 5 of job "llm/a" runs hot."""
    table = JobTable(step_timeout_s=30.0, join_s=0.0)
    for step in range(4):
        now = T0 + step * NS
        store.append(table.add([summary("llm/a", r, step, hot=(r == 5)) for r in range(8)], now).rows)
        store.append(table.add([summary("b", r, step) for r in range(2)], now).rows)
    return table


def test_rows_partitioned_by_job_and_day_and_flushed_on_close(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    store = Store(tmp_path / "steps", flush_rows=1000, flush_interval_s=60.0, clock=clock)
    run_jobs(store)
    assert store.buffered_rows == 40 and not (tmp_path / "steps").exists()  # below both thresholds
    store.close()
    assert store.rows_written_total == 40 and store.buffered_rows == 0
    files = sorted(p.relative_to(tmp_path / "steps").as_posix() for p in (tmp_path / "steps").rglob("*.parquet"))
    assert files == [
        "job=b/date=2024-03-09/part-0.parquet", "job=b/date=2024-03-10/part-0.parquet",
        "job=llm%2Fa/date=2024-03-09/part-0.parquet", "job=llm%2Fa/date=2024-03-10/part-0.parquet",
    ]
    frame = pd.read_parquet(tmp_path / "steps")
    assert len(frame) == 40 and set(STEP_COLUMNS) <= set(frame.columns)
    assert set(frame["job"].astype(str)) == {"b", "llm/a"}  # URI-decoded partition values
    hot = frame[(frame["job"].astype(str) == "llm/a") & frame["slowest"]]
    assert sorted(hot["rank"]) == [5, 5, 5, 5] and np.allclose(hot["straggler_score"], 0.10)


def test_flush_by_rows_and_by_interval_and_restart_appends(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    root = tmp_path / "s"
    store = Store(root, flush_rows=10, flush_interval_s=10.0, clock=clock)
    table = JobTable(step_timeout_s=30.0, join_s=0.0)
    store.append(table.add([summary("j", r, 0) for r in range(8)], T0).rows)
    assert (store.buffered_rows, store.rows_written_total) == (8, 0)
    store.append(table.add([summary("j", r, 1) for r in range(8)], T0 + NS).rows)
    assert (store.buffered_rows, store.rows_written_total) == (0, 16)  # flush_rows reached
    store.append(table.add([summary("j", r, 2) for r in range(8)], T0 + 2 * NS).rows)
    clock.now = 9.9
    store.maybe_flush()
    assert store.buffered_rows == 8
    clock.now = 10.0
    store.maybe_flush()
    assert store.rows_written_total == 24 and store.files_written_total == 2
    again = Store(root, flush_rows=1, clock=clock)  # a restarted aggregator appends part-1
    again.append(table.add([summary("j", r, 3) for r in range(8)], T0 + 2 * NS).rows)
    assert (partition_dir(root, "j", "2024-03-10") / "part-1.parquet").exists()
    assert len(pd.read_parquet(root)) == 32


def test_failed_write_is_counted_and_rows_kept(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = Store(blocker / "steps", flush_rows=1)
    store.append(JobTable(30.0, join_s=0.0).add([summary("j", 0, 0)], T0).rows)
    assert store.flush_errors_total == 1 and store.buffered_rows == 1 and store.rows_written_total == 0


def test_one_failing_partition_keeps_only_its_rows_and_writes_nothing_twice(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    root = tmp_path / "steps"
    store = Store(root, flush_rows=1000, flush_interval_s=60.0, clock=clock)
    run_jobs(store)
    (root / "job=b").mkdir(parents=True)
    (root / "job=b" / "date=2024-03-10").write_text("a file where job b's partition directory belongs")
    assert store.flush() is False
    assert store.flush_errors_total == 1 and store.rows_written_total == 36  # 40 rows, 4 of them b on 03-10
    assert store.buffered_rows == 4
    (root / "job=b" / "date=2024-03-10").unlink()
    assert store.flush() is True and store.buffered_rows == 0
    frame = pd.read_parquet(root)
    assert len(frame) == 40 and not frame.duplicated(["job", "rank", "step"]).any()


def test_a_failing_log_before_the_write_keeps_every_row_and_is_counted(tmp_path: Path) -> None:
    failing = True

    def log_files(paths: list[str]) -> None:
        if failing:
            raise WalError("write-ahead log: fsync failed (disk full)")

    store = Store(tmp_path / "steps", flush_rows=1000, flush_interval_s=60.0, clock=FakeClock(0.0),
                  before_write=log_files)
    run_jobs(store)
    assert store.flush() is False  # not raised: the tick and shutdown go on
    assert store.flush_errors_total == 1 and store.buffered_rows == 40 and store.rows_written_total == 0
    assert not list((tmp_path / "steps").rglob("*.parquet"))
    failing = False
    assert store.flush() is True and store.rows_written_total == 40


def test_duckdb_reads_the_store(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    store = Store(tmp_path / "steps")
    run_jobs(store)
    store.close()
    glob = str(tmp_path / "steps" / "**" / "*.parquet")
    got = duckdb.sql(f"SELECT job, count(*) AS n, sum(straggler_wait_s) AS wait FROM read_parquet('{glob}', "
                     "hive_partitioning = true) GROUP BY job ORDER BY job").fetchall()
    assert [(job, n) for job, n, _ in got] == [("b", 8), ("llm/a", 32)]  # DuckDB decodes %2F too
    assert got[1][2] == pytest.approx(7 * 4 * 0.10)


def test_read_step_store_and_chopper_attribute(tmp_path: Path) -> None:
    store = Store(tmp_path / "steps")
    run_jobs(store)
    store.close()
    root = tmp_path / "steps"
    assert is_step_store(root) and not is_step_store(tmp_path)
    result = read_step_store(root, job="llm/a")
    assert list(result.steps.columns) == list(STEP_COLUMNS) and len(result.steps) == 32
    assert list(result.stragglers["rank"]) == [5] * 4 and set(result.stragglers["cause"]) == {"thermal"}
    assert np.allclose(result.stragglers["compute_excess_s"], 0.10)
    done = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(root), "--json", "--job", "llm/a"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert len(doc["steps"]) == 32 and doc["summary"]["jobs"][0]["job"] == "llm/a"
    assert doc["summary"]["jobs"][0]["straggler_wait_s"] == pytest.approx(7 * 4 * 0.10)
    assert {s["rank"] for s in doc["summary"]["stragglers"]} == {5}
    table = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(root)],
                           capture_output=True, text=True, timeout=120, check=False)
    assert table.returncode == 0 and "cause thermal" in table.stdout and "job b:" in table.stdout
    missing = subprocess.run([sys.executable, "-m", "chopper.cli", "attribute", str(root), "--job", "nope"],
                             capture_output=True, text=True, timeout=120, check=False)
    assert missing.returncode == 2 and "no rows of job 'nope'" in missing.stderr


def test_phase_times_are_stored_and_files_without_them_still_read(tmp_path: Path) -> None:
    root = tmp_path / "steps"
    table = JobTable(step_timeout_s=30.0, join_s=0.0)
    # A part file as written before phase times were stored: the same rows without the column.
    old = table.add([summary("j", r, 0) for r in range(2)], T0).rows.drop(columns=["phase_s"])
    directory = partition_dir(root, "j", "2024-03-10")
    directory.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(old.drop(columns=["job"]), preserve_index=False), directory / "part-0.parquet")
    timed = [summary("j", r, 1) for r in range(2)]
    for s in timed:
        s.phase_times.add(name="forward", seconds=0.25 + s.rank)
        s.phase_times.add(name="backward", seconds=0.5)
    store = Store(root)
    store.append(table.add(timed, T0 + NS).rows)
    store.close()
    steps = read_step_store(root).steps
    assert [(int(r.step), int(r.rank), r.phase_s) for r in steps.itertuples()] == [
        (0, 0, {}), (0, 1, {}), (1, 0, {"forward": 0.25, "backward": 0.5}), (1, 1, {"forward": 1.25, "backward": 0.5})]
