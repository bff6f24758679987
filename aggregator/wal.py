"""Write-ahead log of accepted step summaries: an acknowledgement means the summary is on disk.

Layout: ``<store_dir>/_wal/segment-<first lsn, 20 digits>.log`` (the store's readers skip
``_``-prefixed directories); ``<store_dir>/_wal/quarantine/`` holds what recovery set aside.
A segment (format version 2) is a 12-byte file header, then a sequence of records::

    file header: b"CHOPWAL" | u8 version | u32 crc32 of the 8 bytes before it
    record:      sync word (4 bytes) | u32 payload length | u32 crc32 of (kind, lsn, payload) | u8 kind
                 | u64 lsn | payload

Segments of version 1 (no file header, records without the sync word) are still read; new ones
are always written as version 2. ``lsn`` (log sequence number) counts records 1, 2, 3, ... across
segments; a segment's name is the lsn of its first record and its records carry consecutive
lsns, so a restarted log continues the count and a reader knows which lsn comes next. Kinds:

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
   (the ledger snapshot). The flusher switches files in order with the records, writing and
   fsyncing the new file's header before its first record.
4. **Truncate** (``truncate(below)``): a closed segment whose last lsn is below ``below`` (the
   oldest lsn whose summaries are not yet finalized and written to the store) and which is fully
   durable is deleted, oldest first, so the log stays bounded by what is still in memory.
5. **Recovery scan** (first ``replay``): every entry of the directory that is not a readable
   segment of a known version is moved to ``quarantine/`` and counted by reason (``SET_ASIDE``):
   a wrong name, a directory or other non-file named like a segment, a zero-length file, a cut
   file header, a version this code does not know (a newer aggregator's); a file that cannot be
   read at all too. Nothing found there stops the start.
6. **Replay** (``replay``, before ``start``): the segments' intact records in lsn order
   (``parse_segment``). A record is intact when its sync word, kind, lsn (the next expected one or
   later), length and CRC all hold. Where one does not, the reader resynchronises: it looks for
   the next position where an intact record starts (at a sync word; in a version-1 segment at a
   kind byte followed by a plausible lsn) and goes on from there, so one bad byte costs the
   record it hit, not the rest of its segment. Bad bytes are told apart by where they are:

   - a **torn tail**: bad bytes at the end of the newest segment (or of an older one when no lsn
     is missing after them): a write cut by kill -9 or power loss, never acknowledged, which the
     agents resend. Counted in ``torn_records_total``.
   - **corruption**: bad bytes followed by an intact record, or at the end of a segment with
     records missing before the next segment's first lsn. The records missing from the lsn
     sequence were acknowledged and are lost: counted in ``corrupt_records_total`` (and the
     bytes in ``corrupt_bytes_total``), and logged as an error.
7. **Start** (``start``): a replayed segment that holds no intact record (only a torn or corrupt
   write, or just its header) is set aside, so the new segment may take the next lsn's name; the
   new segment is headed by the records given (the ledger snapshot).
"""
from __future__ import annotations

import logging
import os
import re
import stat
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

log = logging.getLogger(__name__)

BATCH, LEDGER, FILES = 1, 2, 3
KINDS = (BATCH, LEDGER, FILES)
# The version this code writes; version 1 segments (no file header, no sync words) are read too.
VERSION = 2
_MAGIC = b"CHOPWAL"
_FILE_HEADER_SIZE = len(_MAGIC) + 1 + 4
_SYNC = b"\xc3\xa7\x5a\x17"
# Length, crc32, kind and lsn: the record header of both versions (version 2 puts _SYNC before it).
_HEADER = struct.Struct("<IIBQ")
_KIND_LSN = struct.Struct("<BQ")
_CRC = struct.Struct("<I")
_SEGMENT = re.compile(r"segment-(\d{20})\.log")
QUARANTINE = "quarantine"
# Why recovery set an entry of the log directory aside (``chopper_aggregator_wal_set_aside_total``).
SET_ASIDE: dict[str, str] = {
    "name": "an entry not named segment-<20 digits>.log",
    "not_a_file": "a directory, link or other non-file named like a segment",
    "empty": "a zero-length segment (a crash while the file was created)",
    "truncated_header": "a segment cut inside its 12-byte file header",
    "newer_version": "a segment of a format version this aggregator does not know (written by a newer one)",
    "unreadable": "a segment that could not be read (I/O or permission error)",
    "unknown_version": "a segment whose intact header names a version no aggregator wrote",
    "no_records": "a segment without one intact record (only its header, or a torn or corrupt write)",
}
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
class Damage:
    """A run of bytes in a segment that are not intact records (module step 6).

    Attributes:
        offset: Where the run starts in the file, bytes.
        length: Its length, bytes (0: records missing between two intact ones that touch).
        lost: Records missing from the lsn sequence across it (0 when none is known missing).
        tail: The run reaches the end of the segment.
    """

    offset: int
    length: int
    lost: int
    tail: bool

    @property
    def torn(self) -> bool:
        """A torn write (never acknowledged), not corruption: at the end, with no lsn missing."""
        return self.tail and self.lost == 0


@dataclass
class SegmentRead:
    """What ``parse_segment`` found in one segment: its intact records and the damage between them."""

    version: int
    records: list[Record] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)


@dataclass
class _Segment:
    path: Path
    first_lsn: int
    last_lsn: int
    bytes: int = 0
    # The flusher has moved past this segment: its file is complete and closed.
    closed: bool = False
    # Its damage and records are in the stats (counted once, however often it is replayed).
    counted: bool = False


def _crc(kind: int, lsn: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(_KIND_LSN.pack(kind, lsn)))


def _encode(kind: int, lsn: int, payload: bytes) -> bytes:
    return _SYNC + _HEADER.pack(len(payload), _crc(kind, lsn, payload), kind, lsn) + payload


def file_header(version: int = VERSION) -> bytes:
    """The 12 bytes that open a segment of ``version``."""
    head = _MAGIC + bytes([version])
    return head + _CRC.pack(zlib.crc32(head))


def header_problem(head: bytes) -> str | None:
    """Why a segment starting with ``head`` (its first 12 bytes or fewer) cannot be replayed, or None.

    A file that does not start like a version-2 header (6 of the 7 magic bytes, so one bad byte
    there still reads as version 2) is a version-1 segment, whose records start at byte 0.
    """
    if not head:
        return "empty"
    if len(head) < _FILE_HEADER_SIZE and file_header().startswith(head):
        return "truncated_header"
    if len(head) >= _FILE_HEADER_SIZE and _CRC.unpack_from(head, 8)[0] == zlib.crc32(head[:8]) and (
            head[:7] == _MAGIC and head[7] != VERSION):
        return "newer_version" if head[7] > VERSION else "unknown_version"
    return None


def _version(data: bytes) -> tuple[int, int, list[Damage]]:
    """``(version, offset of the first record, damage)`` of a segment whose header has no problem."""
    if len(data) >= _FILE_HEADER_SIZE and sum(a == b for a, b in zip(data[:7], _MAGIC, strict=True)) >= 6:
        intact = data[:_FILE_HEADER_SIZE] == file_header()
        return VERSION, _FILE_HEADER_SIZE, [] if intact else [Damage(0, _FILE_HEADER_SIZE, 0, False)]
    return 1, 0, []


def parse_segment(data: bytes, first_lsn: int, next_lsn: int | None = None) -> SegmentRead:
    """The intact records of one segment's bytes and the damage between them (module step 6).

    Never raises and never allocates by a length field: every slice is bounded by ``data``.

    Args:
        data: The whole file.
        first_lsn: The lsn in its name: its first record's.
        next_lsn: The first lsn of the next segment (None: this is the newest), which tells how
            many records bad bytes at its end replaced.
    """
    version, pos, damage = _version(data)
    sync = _SYNC if version == VERSION else b""
    # Smallest record: its lsn can be at most this many records past the expected one.
    smallest = len(sync) + _HEADER.size
    out = SegmentRead(version, damage=damage)
    expected = first_lsn
    while pos < len(data):
        hi = expected + (len(data) - pos) // smallest
        found = _record_at(data, pos, sync, expected, hi)
        start = pos
        if found is None:
            found, start = _resync(data, pos + 1, sync, version, expected, hi)
        if found is None:
            lost = max(0, next_lsn - expected) if next_lsn is not None else 0
            out.damage.append(Damage(pos, len(data) - pos, lost, True))
            break
        record, end = found
        if start > pos or record.lsn > expected:
            out.damage.append(Damage(pos, start - pos, record.lsn - expected, False))
        out.records.append(record)
        expected, pos = record.lsn + 1, end
    else:
        if next_lsn is not None and next_lsn > expected:
            # Intact to its end, yet records are missing before the next segment (one set aside).
            out.damage.append(Damage(len(data), 0, next_lsn - expected, True))
    return out


def _record_at(data: bytes, pos: int, sync: bytes, lo: int, hi: int) -> tuple[Record, int] | None:
    """The intact record starting at ``pos`` with an lsn in ``[lo, hi]`` and its end, or None."""
    at = pos + len(sync)
    if data[pos:at] != sync or at + _HEADER.size > len(data):
        return None
    length, crc, kind, lsn = _HEADER.unpack_from(data, at)
    start = at + _HEADER.size
    end = start + length
    if kind not in KINDS or not lo <= lsn <= hi or end > len(data):
        return None
    payload = data[start:end]
    if _crc(kind, lsn, payload) != crc:
        return None
    return Record(kind, lsn, payload), end


def _resync(data: bytes, pos: int, sync: bytes, version: int, lo: int, hi: int,
            ) -> tuple[tuple[Record, int] | None, int]:
    """The first intact record at or after ``pos`` (and where it starts), or ``(None, len(data))``.

    Version 2 tries each sync word; version 1 each kind byte followed by an lsn whose high five
    bytes are those of an lsn in ``[lo, hi]`` (found by one regular-expression scan), so a
    search costs a pass over the bytes, not a CRC per byte.
    """
    if version == VERSION:
        at = data.find(sync, pos)
        while at >= 0:
            found = _record_at(data, at, sync, lo, hi)
            if found is not None:
                return found, at
            at = data.find(sync, at + 1)
        return None, len(data)
    kind_at = _HEADER.size - _KIND_LSN.size
    for m in _v1_candidates(lo, hi).finditer(data, pos + kind_at):
        found = _record_at(data, m.start() - kind_at, b"", lo, hi)
        if found is not None:
            return found, m.start() - kind_at
    return None, len(data)


def _v1_candidates(lo: int, hi: int) -> re.Pattern[bytes]:
    """Positions of a version-1 kind byte followed by an lsn whose top five bytes are those of ``lo..hi``."""
    highs = b"|".join(re.escape((h).to_bytes(5, "little")) for h in range(lo >> 24, (hi >> 24) + 1))
    kinds = b"".join(re.escape(bytes([k])) for k in KINDS)
    return re.compile(b"(?=[" + kinds + b"][\\x00-\\xff]{3}(?:" + highs + b"))", re.DOTALL)


def read_segment(path: Path) -> tuple[list[Record], bool]:
    """Intact records of one segment file (named ``segment-<lsn>.log``) and whether any bytes were damaged."""
    m = _SEGMENT.fullmatch(path.name)
    if m is None:
        raise ValueError(f"{path}: not named segment-<20 digits>.log")
    read = parse_segment(path.read_bytes(), int(m.group(1)))
    return read.records, bool(read.damage)


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
        # The segments found at start (``_scan``), which ``replay`` reads (also after ``start``).
        self._found: list[_Segment] | None = None
        self._replayed = False
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
        self.corrupt_records_total = 0
        self.corrupt_bytes_total = 0
        self.replayed_records_total = 0
        self.fsyncs_total = 0
        self.fsync_seconds_total = 0.0
        self.segments_deleted_total = 0
        self.write_errors_total = 0
        self.set_aside: dict[str, int] = dict.fromkeys(SET_ASIDE, 0)

    # -- recovery ----------------------------------------------------------------------------

    def _scan(self) -> list[_Segment]:
        """The replayable segments of the directory, oldest first; the rest set aside (module step 5)."""
        if self._found is not None:
            return self._found
        found: list[_Segment] = []
        if os.path.lexists(self.directory) and not self.directory.is_dir():
            self._set_aside_log_path()
        quarantine = self.directory / QUARANTINE
        if os.path.lexists(quarantine) and (quarantine.is_symlink() or not quarantine.is_dir()):
            # Something else holds the quarantine's name: renamed, it is set aside like any stray entry.
            try:
                os.replace(quarantine, quarantine.with_name(f"{QUARANTINE}.not-a-directory"))
            except OSError as exc:
                log.error("event=wal_set_aside_failed path=%s error=%r", quarantine, str(exc))
        entries = sorted(self.directory.iterdir()) if self.directory.is_dir() else []
        for p in entries:
            if p.name == QUARANTINE and p.is_dir() and not p.is_symlink():
                continue
            m = _SEGMENT.fullmatch(p.name)
            try:
                mode = os.lstat(p).st_mode
                reason = "name" if m is None else None if stat.S_ISREG(mode) else "not_a_file"
                if reason is None:
                    with p.open("rb") as f:
                        reason = header_problem(f.read(_FILE_HEADER_SIZE))
            except OSError as exc:
                reason = "unreadable"
                log.warning("event=wal_segment_unreadable path=%s error=%r", p, str(exc))
            if reason is not None:
                self._set_aside(p, reason)
            elif m is not None:
                first = int(m.group(1))
                found.append(_Segment(p, first, first - 1, p.stat().st_size, closed=True))
        self._found = found
        self._segments = list(found)
        return found

    def _set_aside_log_path(self) -> None:
        """The log directory's path holds something else: move it into the quarantine of a new directory."""
        aside = self.directory.with_name(f"{self.directory.name}.set-aside")
        try:
            os.replace(self.directory, aside)
            self.directory.mkdir(parents=True)
        except OSError as exc:
            log.error("event=wal_set_aside_failed path=%s error=%r", self.directory, str(exc))
            return
        self._set_aside(aside, "not_a_file")

    def _set_aside(self, path: Path, reason: str) -> None:
        """Move ``path`` into ``quarantine/`` (never over an earlier one) and count it under ``reason``."""
        self.set_aside[reason] = self.set_aside.get(reason, 0) + 1
        target = self.directory / QUARANTINE / path.name
        try:
            target.parent.mkdir(exist_ok=True)
            n = 0
            while os.path.lexists(target):
                n += 1
                target = target.with_name(f"{path.name}.{n}")
            os.rename(path, target)
            _fsync_dir(self.directory)
        except OSError as exc:
            # Left where it is, it is skipped again at the next start: still never replayed.
            log.error("event=wal_set_aside_failed path=%s reason=%s error=%r note='left in place, not replayed'",
                      path, reason, str(exc))
            return
        log.warning("event=wal_set_aside path=%s reason=%s moved_to=%s note=%r", path, reason, target,
                    SET_ASIDE.get(reason, reason))

    def replay(self) -> Iterator[Record]:
        """Every intact record of the segments found at start, in lsn order (module steps 5 and 6).

        May be called several times, before and after ``start``; each segment's damage and
        records are counted (and its damage logged) the first time it is read.
        """
        found = self._scan()
        for seg in list(found):
            if seg not in found:
                continue
            later = found[found.index(seg) + 1:]
            try:
                data = seg.path.read_bytes()
            except OSError as exc:
                log.warning("event=wal_segment_unreadable path=%s error=%r", seg.path, str(exc))
                self._forget_found(seg)
                self._set_aside(seg.path, "unreadable")
                continue
            read = parse_segment(data, seg.first_lsn, later[0].first_lsn if later else None)
            seg.last_lsn = read.records[-1].lsn if read.records else seg.first_lsn - 1
            if not seg.counted:
                seg.counted = True
                self._count(seg, read)
            yield from read.records
        self._replayed = True

    def _count(self, seg: _Segment, read: SegmentRead) -> None:
        self.replayed_records_total += len(read.records)
        for d in read.damage:
            if d.torn:
                self.torn_records_total += 1
                log.warning("event=wal_torn_tail segment=%s offset=%d bytes=%d records_before=%d note='a write cut "
                            "short by a crash, never acknowledged: the agents resend it'", seg.path.name, d.offset,
                            d.length, len(read.records))
            else:
                self.corrupt_records_total += d.lost
                self.corrupt_bytes_total += d.length
                log.error("event=wal_corrupt segment=%s offset=%d bytes=%d records_lost=%d note='acknowledged "
                          "records damaged on disk are lost; replay went on at the next intact record'",
                          seg.path.name, d.offset, d.length, d.lost)

    def _forget_found(self, seg: _Segment) -> None:
        if self._found is not None and seg in self._found:
            self._found.remove(seg)
        if seg in self._segments:
            self._segments.remove(seg)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, head: Iterable[tuple[int, bytes]] = ()) -> None:
        """Open a new segment headed by ``head`` and start the flusher (call after ``replay``; step 7)."""
        if not self._replayed:
            for _ in self.replay():  # how far each segment's lsns went
                pass
        for seg in list(self._scan()):
            if seg.last_lsn < seg.first_lsn:
                # Nothing in it to replay; its name may be the one the new segment needs.
                self._forget_found(seg)
                self._set_aside(seg.path, "no_records")
            else:
                self._next_lsn = max(self._next_lsn, seg.last_lsn + 1)
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
            seg = _Segment(self.directory / f"segment-{self._next_lsn:020d}.log", self._next_lsn, self._next_lsn - 1,
                           _FILE_HEADER_SIZE)
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
        ``corrupt_records_total``, ``corrupt_bytes_total``, ``replayed_records_total``,
        ``fsyncs_total``, ``fsync_seconds_total``, ``write_errors_total``, ``failed`` (0/1: failing
        now). ``set_aside`` holds the entries recovery set aside, by reason."""
        with self._lock:
            return {
                "bytes": float(sum(s.bytes for s in self._segments)),
                "segments": float(len(self._segments)),
                "records_total": float(self.records_total),
                "torn_records_total": float(self.torn_records_total),
                "corrupt_records_total": float(self.corrupt_records_total),
                "corrupt_bytes_total": float(self.corrupt_bytes_total),
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
            size = os.fstat(fd).st_size
            if size < _FILE_HEADER_SIZE:
                # New, or cut inside its header by a failed earlier try: the header, whole, first.
                os.ftruncate(fd, 0)
                os.write(fd, file_header())
                os.fsync(fd)
                size = _FILE_HEADER_SIZE
            # The new name must survive a crash as well as the records in it.
            _fsync_dir(self.directory)
        except OSError:
            os.close(fd)
            raise
        previous, self._file = self._file, fd
        self._file_size, self._file_dirty = size, False
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
