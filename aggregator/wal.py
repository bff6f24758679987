"""Write-ahead log of accepted step summaries: an acknowledgement means the summary is on disk.

Layout: ``<store_dir>/_wal/segment-<first lsn, 20 digits>.log`` (the store's readers skip
``_``-prefixed directories). Each segment is a sequence of records::

    u32 payload length | u32 crc32 of (kind, lsn, payload) | u8 kind | u64 lsn | payload

``lsn`` (log sequence number) counts records 1, 2, 3, ... across segments; a segment's name is
the lsn of its first record, so a restarted log continues the count. Kinds:

- ``BATCH``: a ``chopper.v1.SummaryBatch`` holding only the summaries the ledger took in as new,
  with their agent, incarnation, sequence numbers and the agent's ``lost_total``.
- ``LEDGER``: one incarnation of the ledger (a ``SummaryBatch`` with ``seq = [max_seq]`` and no
  summaries; an empty agent carries the loss of forgotten incarnations). Every segment starts
  with a snapshot of the whole ledger, so the oldest remaining segment rebuilds it exactly.
- ``FILES``: the store files (paths relative to the store root, one per line) a flush is about
  to write, logged and fsynced *before* they are written: recovery reads their ``wal_id``
  column to know which logged summaries are already stored.

Algorithm.

1. **Append** (``append``, callers serialized by the aggregator's lock, so log order is ledger
   order): the record is encoded into the pending buffer and gets the next lsn. Nothing waits.
2. **Group commit** (one flusher thread): when records are pending, it waits until
   ``commit_interval_s`` has passed since its last commit (or ``commit_bytes`` are pending, or a
   caller asked for ``sync``), then writes every pending record with one ``write`` and one
   ``fsync`` and raises ``durable_lsn`` to the last of them. Callers ``wait(lsn)`` for that, so
   one fsync releases the acknowledgements of every stream that appended meanwhile: 64 streams
   share fsyncs instead of queueing on them.
   **A write or fsync error** (disk full, I/O error) puts the log in a failing state: every waiter
   gets ``WalError`` at once (no acknowledgement), the failure is counted, and the records stay
   pending in memory. The flusher cuts the segment back to its last committed size (a failed
   fsync leaves the page cache untrustworthy, so the records are written again from memory, never
   just fsynced again) and retries with backoff (``RETRY_S``); the first commit that succeeds
   ends the failing state, and the acknowledgements resume.
3. **Rotate** (``rotate``): later records go to a new segment, headed by the records given
   (the ledger snapshot). The flusher switches files in order with the records.
4. **Truncate** (``truncate(below)``): a closed segment whose last lsn is below ``below`` (the
   oldest lsn whose summaries are not yet finalized and written to the store) and which is fully
   durable is deleted, oldest first, so the log stays bounded by what is still in memory.
5. **Replay** (``replay``, before ``start``): the segments' records in lsn order. A record whose
   length runs past the end of its segment or whose CRC does not match is *torn* (a write cut by
   kill -9 or power loss, which was never acknowledged): it and the rest of its segment are
   skipped and counted.
"""
from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

log = logging.getLogger(__name__)

BATCH, LEDGER, FILES = 1, 2, 3
KINDS = (BATCH, LEDGER, FILES)
_HEADER = struct.Struct("<IIBQ")
_KIND_LSN = struct.Struct("<BQ")
_SEGMENT = re.compile(r"segment-(\d{20})\.log")
# A summary's id in the job table and the store: its record's lsn and its index in the record.
ID_BITS = 24
# Retry delays of a failing log, s: the first, doubled per failure up to the last.
RETRY_S = (0.1, 2.0)


def summary_id(lsn: int, index: int) -> int:
    """Id of the ``index``-th summary of record ``lsn`` (stored as ``wal_id`` in every row)."""
    return (lsn << ID_BITS) | index


class WalError(OSError):
    """The log cannot make records durable; acknowledgements must not be given."""


@dataclass
class Record:
    """One replayed record."""

    kind: int
    lsn: int
    payload: bytes


@dataclass
class _Segment:
    path: Path
    first_lsn: int
    last_lsn: int
    bytes: int = 0
    # The flusher has moved past this segment: its file is complete and closed.
    closed: bool = False


def _encode(kind: int, lsn: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, zlib.crc32(_KIND_LSN.pack(kind, lsn)))
    return _HEADER.pack(len(payload), crc, kind, lsn) + payload


def read_segment(path: Path) -> tuple[list[Record], bool]:
    """Records of one segment file and whether its tail was torn (the rest ignored)."""
    data = path.read_bytes()
    out: list[Record] = []
    pos = 0
    while pos < len(data):
        if pos + _HEADER.size > len(data):
            return out, True
        length, crc, kind, lsn = _HEADER.unpack_from(data, pos)
        end = pos + _HEADER.size + length
        if end > len(data):
            return out, True
        payload = data[pos + _HEADER.size:end]
        if kind not in KINDS or zlib.crc32(payload, zlib.crc32(_KIND_LSN.pack(kind, lsn))) != crc:
            return out, True
        out.append(Record(kind, lsn, payload))
        pos = end
    return out, False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Wal:
    """Segmented write-ahead log with group commit (module docstring).

    Args:
        directory: Where the segments live; created on ``start``.
        commit_interval_s: Fsyncs at most this often, s; the longest an append waits for a
            commit beyond the fsync itself.
        commit_bytes: Commit at once when this many bytes are pending.
        segment_bytes: ``rotate_due`` once the active segment holds this many bytes.
        segment_s: ``rotate_due`` once the active segment is this old, s (old segments can only
            be deleted whole, so this bounds how long a flushed summary stays in the log).
        clock: Monotonic seconds; injected in tests.
    """

    def __init__(
        self,
        directory: str | Path,
        commit_interval_s: float = 0.02,
        commit_bytes: int = 4 << 20,
        segment_bytes: int = 64 << 20,
        segment_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = Path(directory)
        self.commit_interval_s = commit_interval_s
        self.commit_bytes = commit_bytes
        self.segment_bytes = segment_bytes
        self.segment_s = segment_s
        self.clock = clock
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._segments: list[_Segment] = []
        if self.directory.is_dir():
            for p in sorted(self.directory.iterdir()):
                if (m := _SEGMENT.fullmatch(p.name)) and not p.is_file():
                    # Not ours (the log writes only files): replaying it would stop the aggregator.
                    log.warning("event=wal_not_a_segment path=%s", p)
                elif m:
                    first = int(m.group(1))
                    self._segments.append(_Segment(p, first, first - 1, p.stat().st_size, closed=True))
        # The segments found at start, which ``replay`` reads (also after ``start``).
        self._found = list(self._segments)
        # Pending items: encoded records, or a segment to switch to before the records after it.
        self._pending: list[bytes | _Segment] = []
        self._pending_bytes = 0
        self._next_lsn = 1
        self.appended_lsn = 0
        self.durable_lsn = 0
        self._sync_requested = False
        self._failed: BaseException | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._file: int | None = None
        # Bytes of the open segment known to be written and fsynced; a failed write may leave more.
        self._file_size = 0
        self._file_dirty = False
        self._active_since = clock()
        self.records_total = 0
        self.torn_records_total = 0
        self.replayed_records_total = 0
        self.fsyncs_total = 0
        self.fsync_seconds_total = 0.0
        self.segments_deleted_total = 0
        self.write_errors_total = 0

    # -- recovery ----------------------------------------------------------------------------

    def replay(self, count: bool = True) -> Iterator[Record]:
        """Every intact record of the segments found at start, in lsn order (module step 5).

        May be called several times, before and after ``start``.

        Args:
            count: Count torn and replayed records in the stats (the final pass does).
        """
        for seg in self._found:
            records, torn = read_segment(seg.path)
            if records:
                seg.last_lsn = records[-1].lsn
            if torn and count:
                self.torn_records_total += 1
                log.warning("event=wal_torn_record segment=%s records_before=%d", seg.path.name, len(records))
            for r in records:
                if count:
                    self.replayed_records_total += 1
                yield r

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, head: Iterable[tuple[int, bytes]] = ()) -> None:
        """Open a new segment headed by ``head`` and start the flusher (call after ``replay``)."""
        for seg in self._found:
            if seg.last_lsn < seg.first_lsn:  # not replayed yet: read how far its lsns went
                records, _ = read_segment(seg.path)
                seg.last_lsn = records[-1].lsn if records else seg.first_lsn - 1
            # A torn record may have used the lsn after the last intact one: never reuse a name.
            self._next_lsn = max(self._next_lsn, seg.last_lsn + 1, seg.first_lsn + 1)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.appended_lsn = self.durable_lsn = self._next_lsn - 1
        self.rotate(head)
        self._thread = threading.Thread(target=self._flush_loop, name="wal-flusher", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Commit what is pending and stop the flusher."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            os.close(self._file)
            self._file = None

    # -- appending ---------------------------------------------------------------------------

    def append(self, kind: int, payload: bytes) -> int:
        """Queue one record; returns its lsn (durable once ``wait(lsn)`` returns)."""
        with self._cond:
            return self._append(kind, payload)

    def _append(self, kind: int, payload: bytes) -> int:
        lsn = self._next_lsn
        self._next_lsn += 1
        data = _encode(kind, lsn, payload)
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._segments[-1].last_lsn = lsn
        self._segments[-1].bytes += len(data)
        self.appended_lsn = lsn
        self.records_total += 1
        if self._pending_bytes >= self.commit_bytes or len(self._pending) == 1:
            self._cond.notify_all()
        return lsn

    def rotate(self, head: Iterable[tuple[int, bytes]] = ()) -> None:
        """Send later records to a new segment that starts with the ``head`` records."""
        with self._cond:
            seg = _Segment(self.directory / f"segment-{self._next_lsn:020d}.log", self._next_lsn, self._next_lsn - 1)
            self._segments.append(seg)
            self._pending.append(seg)
            self._active_since = self.clock()
            for kind, payload in head:
                self._append(kind, payload)
            self._cond.notify_all()

    def rotate_due(self) -> bool:
        """The active segment is big or old enough to rotate."""
        with self._lock:
            seg = self._segments[-1]
            return seg.bytes >= self.segment_bytes or (
                self.clock() - self._active_since >= self.segment_s and seg.last_lsn >= seg.first_lsn)

    @property
    def failing(self) -> bool:
        """The last commit failed and has not been retried successfully yet."""
        return self._failed is not None

    def wait(self, lsn: int, timeout_s: float | None = None) -> None:
        """Block until record ``lsn`` is fsynced.

        Raises:
            WalError: The log is failing (at once, or when it starts failing while waiting), or
                ``timeout_s`` passed first.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self.durable_lsn >= lsn or self._failed is not None, timeout_s):
                raise WalError(f"write-ahead log: record {lsn} not durable after {timeout_s} s")
            if self.durable_lsn < lsn:
                raise WalError(f"write-ahead log failed: {self._failed}")

    def sync(self, lsn: int) -> None:
        """Commit now (not at the next interval) and wait for ``lsn``."""
        with self._cond:
            self._sync_requested = True
            self._cond.notify_all()
        self.wait(lsn)

    # -- truncation --------------------------------------------------------------------------

    def truncate(self, below: int) -> int:
        """Delete closed, durable segments whose records are all below lsn ``below``; returns how many."""
        deleted = 0
        while True:
            with self._lock:
                if len(self._segments) < 2:
                    break
                seg = self._segments[0]
                if not (seg.closed and seg.last_lsn < below and seg.last_lsn <= self.durable_lsn):
                    break
                self._segments.pop(0)
            try:
                seg.path.unlink(missing_ok=True)
            except OSError as exc:  # a segment left behind is replayed and skipped again, never doubled
                log.warning("event=wal_delete_failed segment=%s error=%r", seg.path.name, str(exc))
            deleted += 1
        self.segments_deleted_total += deleted
        return deleted

    # -- stats -------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """``bytes`` (all segments), ``segments``, ``records_total``, ``torn_records_total``,
        ``replayed_records_total``, ``fsyncs_total``, ``fsync_seconds_total``, ``write_errors_total``,
        ``failed`` (0/1: failing now)."""
        with self._lock:
            return {
                "bytes": float(sum(s.bytes for s in self._segments)),
                "segments": float(len(self._segments)),
                "records_total": float(self.records_total),
                "torn_records_total": float(self.torn_records_total),
                "replayed_records_total": float(self.replayed_records_total),
                "fsyncs_total": float(self.fsyncs_total),
                "fsync_seconds_total": self.fsync_seconds_total,
                "write_errors_total": float(self.write_errors_total),
                "failed": 1.0 if self._failed is not None else 0.0,
            }

    # -- flusher -----------------------------------------------------------------------------

    def _flush_loop(self) -> None:
        last_commit = -float("inf")
        retry_s = RETRY_S[0]
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending:
                    return
                # Rate-limit fsyncs: records arriving meanwhile share the next one (group commit).
                while not (self._stop or self._sync_requested or self._pending_bytes >= self.commit_bytes):
                    left = last_commit + self.commit_interval_s - self.clock()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                items, self._pending, self._pending_bytes = self._pending, [], 0
                self._sync_requested = False
                upto = self.appended_lsn
            last_commit = self.clock()
            try:
                self._write(items)
            except OSError as exc:
                with self._cond:
                    # What was not written goes back in front of what arrived meanwhile.
                    self._pending[:0] = items
                    self._pending_bytes += sum(len(i) for i in items if isinstance(i, bytes))
                    self.write_errors_total += 1
                    if self._failed is None:
                        log.error("event=wal_failing directory=%s error=%r retry_in_s=%g note='acknowledgements "
                                  "wait until a retry succeeds'", self.directory, str(exc), retry_s)
                    self._failed = exc
                    self._cond.notify_all()
                    # Appends notify the condition: sleep out the whole delay, not just until one.
                    deadline = self.clock() + retry_s
                    while not self._stop and (left := deadline - self.clock()) > 0:
                        self._cond.wait(left)
                    if self._stop:
                        return
                retry_s = min(retry_s * 2, RETRY_S[1])
                continue
            retry_s = RETRY_S[0]
            with self._cond:
                self.durable_lsn = upto
                if self._failed is not None:
                    log.info("event=wal_recovered directory=%s errors_total=%d", self.directory,
                             self.write_errors_total)
                    self._failed = None
                self._cond.notify_all()

    def _write(self, items: list[bytes | _Segment]) -> None:
        """Write and fsync ``items`` in order, removing each from the list once it is durable.

        On an error the items not yet durable are left in ``items`` for the retry.
        """
        while items:
            head = items[0]
            if isinstance(head, _Segment):
                self._open_segment(head)
                del items[0]
                continue
            n = next((i for i, item in enumerate(items) if isinstance(item, _Segment)), len(items))
            self._commit(cast(list[bytes], items[:n]))
            del items[:n]

    def _open_segment(self, seg: _Segment) -> None:
        fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            # The new name must survive a crash as well as the records in it.
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        previous, self._file = self._file, fd
        self._file_size, self._file_dirty = os.fstat(fd).st_size, False
        if previous is not None:
            os.close(previous)
        with self._lock:
            for other in self._segments:
                if other is not seg and not other.closed and other.first_lsn < seg.first_lsn:
                    other.closed = True

    def _commit(self, chunk: list[bytes]) -> None:
        if not chunk or self._file is None:
            return
        if self._file_dirty:
            # A failed write or fsync may have left part of a record (or untrustworthy pages)
            # after the committed bytes: cut them, so the retry writes every record whole.
            os.ftruncate(self._file, self._file_size)
            self._file_dirty = False
        data = b"".join(chunk)
        view = memoryview(data)
        self._file_dirty = True
        while view:
            n = os.write(self._file, view)
            view = view[n:]
        started = time.perf_counter()
        os.fsync(self._file)
        self._file_dirty = False
        self._file_size += len(data)
        self.fsyncs_total += 1
        self.fsync_seconds_total += time.perf_counter() - started
