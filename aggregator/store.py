"""Parquet store of finalized per-step rank rows, partitioned by job and day.

Layout (Hive partitioning, readable by ``pd.read_parquet(root)``, DuckDB's
``read_parquet('root/**/*.parquet', hive_partitioning = true)`` and ``chopper attribute root``)::

    root/job=<job, URI-encoded>/date=<YYYY-MM-DD>/part-<n>.parquet

Each file holds ``aggregator.jobs.ROW_COLUMNS`` except the partition columns ``job`` and ``date``
(the directory names carry them, as pyarrow's ``write_to_dataset`` does); ``phase_s`` is a
``map<string, double>`` of phase name to seconds (files written before it existed lack it, and
``chopper attribute`` reads them with empty phase times). ``date`` is the UTC day
of the aggregator's receive time (``received_ns``), so every rank of a step lands in the same
partition whatever its node's clock says.

Algorithm of ``Store``:

1. ``append`` buffers rows in memory.
2. The buffer is written when it holds ``flush_rows`` rows, when ``flush_interval_s`` passed since
   the last write (checked on ``append`` and ``maybe_flush``, which the daemon calls every tick),
   and on ``close``.
3. A write groups the buffer by (job, date) and writes one new file per group: to a dot-file
   first, then renamed, so a reader never sees half a file (readers skip dot-files). ``n`` is one
   more than the largest part number already in the directory, so a restarted aggregator appends.
4. With a write-ahead log (``durable=True``), ``before_write`` is told the paths of a write before
   any file is created (the log records them, so its recovery knows which files to read back),
   and each file is fsynced before its rename and its directory after, so rows the log then
   forgets survive a power loss.
5. ``stored_keys`` reads back the ``(job, step, rank, digest)`` keys of the newest files, for
   the step index the aggregator rebuilds at start (``aggregator/stepindex.py``, step 4).
6. A failed write is counted (``flush_errors_total``), logged, and its rows stay buffered for the
   next try, up to ``max_buffered_rows``; beyond that the oldest rows are dropped and counted
   (``rows_dropped_total``) so a full disk cannot exhaust memory. The failed write's temporary
   file is removed, so a full disk gets back the space the retry needs.
"""
from __future__ import annotations

import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger(__name__)

PARTITIONS = ("job", "date")
# Where rows kept out of the store's readers go (copies with other content, ``jobs.REJECTION_REASONS``):
# the readers skip ``_``-prefixed directories.
ASIDE_DIR = "_conflicts"
PHASE_TYPE = pa.map_(pa.string(), pa.float64())
_PART = re.compile(r"part-(\d+)\.parquet")


def partition_dir(root: Path, job: str, date: str) -> Path:
    """Directory of one (job, date) partition; the job name is URI-encoded (``/`` → ``%2F``)."""
    return root / f"job={urllib.parse.quote(job, safe='')}" / f"date={date}"


class Store:
    """Buffered Parquet writer of step rows (module docstring).

    Args:
        root: Store directory; created on first write.
        flush_rows: Write once this many rows are buffered.
        flush_interval_s: Write buffered rows at least this often, s.
        clock: Monotonic seconds, for the flush interval; injected in tests.
        max_buffered_rows: Rows held while writes fail, at most.
        durable: Fsync every file and its directory (module step 4).
        before_write: Called with the files a write is about to create, relative to ``root``.
    """

    def __init__(
        self,
        root: str | Path,
        flush_rows: int = 50_000,
        flush_interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_buffered_rows: int = 2_000_000,
        durable: bool = False,
        before_write: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self.max_buffered_rows = max_buffered_rows
        self.durable = durable
        self.before_write = before_write
        self._buffer: list[pd.DataFrame] = []
        self.buffered_rows = 0
        self._last_flush = clock()
        self._next_part: dict[Path, int] = {}
        self.rows_written_total = 0
        self.files_written_total = 0
        self.flush_errors_total = 0
        self.rows_dropped_total = 0

    def append(self, rows: pd.DataFrame) -> None:
        """Buffer rows (``jobs.ROW_COLUMNS``); write when a threshold is reached."""
        if len(rows):
            self._buffer.append(rows)
            self.buffered_rows += len(rows)
        self.maybe_flush()

    def maybe_flush(self) -> None:
        """Write when ``flush_rows`` rows wait or ``flush_interval_s`` passed."""
        due = self.clock() - self._last_flush >= self.flush_interval_s
        if self.buffered_rows >= self.flush_rows or (due and self.buffered_rows):
            self.flush()
        elif due:
            self._last_flush = self.clock()

    def flush(self) -> bool:
        """Write every buffered row now; False (counted, unwritten rows kept) when a partition failed.

        Partitions are written one file each and independently: one that fails (a full disk, a bad
        job directory) keeps only its own rows buffered for the next flush, so it neither blocks
        the other jobs nor makes their rows, already on disk, be written twice.
        """
        self._last_flush = self.clock()
        if not self._buffer:
            return True
        frame = pd.concat(self._buffer, ignore_index=True) if len(self._buffer) > 1 else self._buffer[0]
        written, unwritten, error = self._write(frame)
        self.rows_written_total += written
        if error is None:
            self._buffer, self.buffered_rows = [], 0
            return True
        self.flush_errors_total += 1
        log.error("event=store_flush_failed root=%s rows=%d unwritten=%d error=%r", self.root, len(frame),
                  len(unwritten), str(error))
        if len(unwritten) > self.max_buffered_rows:
            drop = len(unwritten) - self.max_buffered_rows
            self.rows_dropped_total += drop
            unwritten = unwritten.iloc[drop:]
        unwritten = unwritten.reset_index(drop=True)
        self._buffer, self.buffered_rows = [unwritten], len(unwritten)
        return False

    def oldest_buffered_id(self) -> int | None:
        """The smallest non-negative ``wal_id`` of a buffered row (None: none)."""
        found = [int(ids[ids >= 0].min()) for f in self._buffer
                 if len(f) and "wal_id" in f and (ids := f["wal_id"].to_numpy()).max() >= 0]
        return min(found, default=None)

    def close(self) -> bool:
        """Write what is buffered (shutdown)."""
        return self.flush()

    def _write(self, frame: pd.DataFrame) -> tuple[int, pd.DataFrame, Exception | None]:
        """Write ``frame`` as one new file per (job, date) partition.

        Returns:
            Rows written, the rows of partitions that failed (in ``frame`` order), and the last
            failure (None when every partition was written).
        """
        dates = pd.to_datetime(frame["received_ns"].astype("int64"), unit="ns", utc=True).dt.strftime("%Y-%m-%d")
        written = 0
        plan = []
        failed: list[pd.DataFrame] = []
        error: Exception | None = None
        for (job, date), part in frame.groupby([frame["job"], dates], sort=True):
            directory = partition_dir(self.root, str(job), str(date))
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                failed.append(part)
                error = exc
                continue
            plan.append((directory, self._part_number(directory), part))
        if self.before_write is not None:
            try:
                self.before_write([(d / f"part-{n}.parquet").relative_to(self.root).as_posix() for d, n, _ in plan])
            except OSError as exc:  # the write-ahead log failing (WalError): write nothing it has not recorded
                return 0, frame, exc
        for directory, n, part in plan:
            try:
                self._write_part(directory, n, part)
            except (OSError, pa.ArrowException) as exc:
                failed.append(part)
                error = exc
                continue
            written += len(part)
        unwritten = pd.concat(failed).sort_index() if failed else frame.iloc[:0]
        return written, unwritten, error

    def _write_part(self, directory: Path, n: int, part: pd.DataFrame) -> None:
        """``part`` as ``directory/part-<n>.parquet``, through a temporary file and a rename."""
        part = part.reset_index(drop=True)
        table = pa.Table.from_pandas(part.drop(columns=["job", "phase_s"]), preserve_index=False)
        # A map, not the struct pyarrow infers from dicts: phase names differ between rows and files.
        phases = pa.array([list(p.items()) for p in part["phase_s"]], type=PHASE_TYPE)
        table = table.add_column(table.schema.get_field_index("flags") + 1, "phase_s", phases)
        tmp = directory / f".part-{n}.parquet.tmp"
        try:
            pq.write_table(table, tmp)
            if self.durable:
                _fsync(tmp)
            os.replace(tmp, directory / f"part-{n}.parquet")
        except BaseException:
            # A half-written file on a full disk would hold space the retry needs.
            tmp.unlink(missing_ok=True)
            raise
        if self.durable:
            _fsync(directory)
        self._next_part[directory] = n + 1
        self.files_written_total += 1

    def _part_number(self, directory: Path) -> int:
        # Part numbers are only taken by a successful write: a failed or cut one leaves the name free.
        n = self._next_part.get(directory)
        if n is None:
            found = [int(m.group(1)) for p in directory.iterdir() if (m := _PART.fullmatch(p.name))]
            n = max(found, default=-1) + 1
        return n


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class StoredKeys:
    """What ``stored_keys`` read back.

    Attributes:
        loaded: ``(job, steps, ranks, digests)`` per file read, newest file first; a digest is 0
            in files written before the column existed.
        beyond: Per job, the highest step of the files past the budget (their keys not loaded).
        unreadable: Files that could not be read (logged, skipped).
    """

    loaded: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    beyond: dict[str, int] = field(default_factory=dict)
    unreadable: int = 0


def stored_keys(root: Path, budget: int) -> StoredKeys:
    """The keys of the rows in the newest part files, ``budget`` rows at most (module step 5).

    Files are taken newest first (by date partition, then modification time); once ``budget``
    rows are loaded, only the largest step of each further file is read (from its footer's
    statistics where it has them), so the work past the budget is per file, not per row.
    """
    out = StoredKeys()
    files = []
    for path in root.glob("job=*/date=*/part-*.parquet"):
        try:
            files.append((path.parent.name, path.stat().st_mtime_ns, path))
        except OSError:
            continue  # removed meanwhile
    files.sort(reverse=True)
    rows = 0
    for _, _, path in files:
        job = urllib.parse.unquote(path.parent.parent.name.removeprefix("job="))
        try:
            if rows < budget:
                table = pq.read_table(path, columns=[c for c in ("step", "rank", "digest")
                                                     if c in pq.read_schema(path).names])
                steps = np.asarray(table.column("step").to_numpy(), dtype=np.int64)
                ranks = np.asarray(table.column("rank").to_numpy(), dtype=np.int64)
                digests = (np.asarray(table.column("digest").to_numpy(), dtype=np.int64)
                           if "digest" in table.column_names else np.zeros(len(steps), dtype=np.int64))
                out.loaded.append((job, steps, ranks, digests))
                rows += len(steps)
            else:
                top = _max_step(path)
                if top is not None:
                    out.beyond[job] = max(out.beyond.get(job, top), top)
        except (OSError, ValueError, TypeError, KeyError, pa.ArrowException) as exc:
            out.unreadable += 1
            log.warning("event=store_file_unreadable path=%s error=%r note='its keys are not in the step index'",
                        path, str(exc))
    return out


def _max_step(path: Path) -> int | None:
    """The largest ``step`` of a part file, from its footer's statistics (else its column)."""
    meta = pq.read_metadata(path)
    # A leaf column's index (nested columns such as flags have leaves of their own).
    col = next((j for j in range(meta.num_columns) if meta.schema.column(j).path == "step"), None)
    if col is None:
        return None
    tops = [meta.row_group(i).column(col).statistics for i in range(meta.num_row_groups)]
    if all(t is not None and t.has_min_max for t in tops):
        return max((int(t.max) for t in tops if t is not None), default=None)
    steps = pq.read_table(path, columns=["step"]).column("step").to_numpy()
    return int(steps.max()) if len(steps) else None
