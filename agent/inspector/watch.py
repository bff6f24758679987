"""Reads the Inspector plugin's dump directory as it grows, with memory, time and handles bounded.

The plugin writes ``<dir>/<hostname>-pid<pid>.log`` per process (opened with ``fopen(…, "w")`` at
its first dump, appended with ``fprintf`` and flushed after each dump), one JSON object per line.
A ``DumpDirWatcher`` polls one directory (and its immediate subdirectories, for a dump directory
per job under it) on its own thread and hands each poll's new records of each file to
``on_records(records, path)``, ``path`` relative to the directory (``job42/node-a-pid7.log``).

Each poll:

1. List the directory: regular files named ``*-pid<N>.log`` (symlinks, FIFOs and other names are
   never opened), at most ``max_entries`` entries. A missing or unreadable directory is reported
   (``directory_present``, ``last_error``, logged once per change) and polled again next time.
2. Match files by inode, not name: a new inode under a known name (rotation: renamed away and
   recreated) is a new file read from its start; an inode gone from the listing is finished from
   its open handle, if one is open, then forgotten. A file smaller than the offset read so far
   was truncated: it is read again from its start.
3. Files present at the first poll are read from their end: their past lies before this agent
   started, their collectives belong to steps already summarised, and a long job's file can hold
   gigabytes that would delay every live record behind them. Files that appear later are read
   from their start.
4. Read at most ``max_bytes_per_poll`` in all, in chunks, least recently read file first. A file
   more than ``max_lag_bytes`` behind is skipped forward to its last ``max_lag_bytes`` (counted
   in ``bytes_skipped_total``): a backlog up to that is read over several polls, and what is
   dropped beyond it is counted, never silent.
5. Split at newlines. A partial last line is kept until its newline arrives, up to
   ``max_record_bytes``; a longer line is counted as ``line_too_long`` and skipped to the next
   newline. Each line goes through ``chopper.inspector.RecordDecoder`` (one per file, for v4.4
   marker headers); a refused line is counted by reason and skipped.
6. Close handles idle for ``idle_close_s``; never hold more than ``max_open_files``.
7. Call ``on_records`` once per file that gave records; an exception there is counted and logged
   (the first time), and the next poll goes on.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from chopper.inspector import DumpStats, InspectorFormatError, InspectorRecord, RecordDecoder, parse_line

log = logging.getLogger(__name__)

DUMP_NAME = re.compile(r".+-pid[0-9]+\.log")
MAX_REFUSED_VERSIONS = 8            # distinct refused version labels kept; the rest count as "other"
_CHUNK = 1 << 20                    # bytes read per system call


@dataclass(frozen=True, slots=True)
class WatcherHealth:
    """A snapshot of the watcher, taken at the end of a poll (counters are totals since start)."""

    directory: str
    directory_present: bool
    files_tracked: int
    files_open: int
    files_untracked: int            # matching files beyond max_files in the last listing
    bytes_read_total: int
    bytes_skipped_total: int        # jumped over: a file behind by more than max_lag_bytes
    records_total: int
    dump_stats_total: int
    plugin_dropped_total: int       # operations the plugin's ring overwrote (dump_stats, v4.1+)
    ignored_total: int              # lines of kinds not read (proxy_trace)
    rejected: Mapping[str, int]     # REJECTION_REASONS key -> lines
    refused_versions: Mapping[str, int]
    truncations_total: int
    rotations_total: int
    callback_errors_total: int
    poll_errors_total: int
    polls_total: int
    last_poll_s: float
    last_error: str


@dataclass
class _File:
    """One dump file being followed, by inode."""

    path: Path
    offset: int
    discarding: bool = False        # inside a line whose start was skipped: drop up to its newline
    partial: bytearray = field(default_factory=bytearray)
    decoder: RecordDecoder = field(default_factory=RecordDecoder)
    fd: int | None = None
    last_used: float = 0.0          # monotonic seconds of the last read or open


class DumpDirWatcher:
    """Follows one Inspector dump directory; see the module docstring for the rules.

    Args:
        directory: The directory the plugin writes (``NCCL_INSPECTOR_DUMP_DIR``), or one holding
            a dump directory per job.
        on_records: Called from the watcher's thread with one file's new records of a poll (never
            empty) and that file's path relative to ``directory``.
        poll_s: Seconds between polls on the thread.
        max_bytes_per_poll: Bytes read per poll over all files.
        max_lag_bytes: The most a file may be behind before it is skipped forward.
        max_record_bytes: The longest line kept; the plugin's lines are 0.3 to 3 KB (verbose, 64 channels).
        max_files: Files followed at once; further files are left alone (``files_untracked``).
        max_open_files: Handles held at once.
        idle_close_s: Seconds without a read after which a handle is closed.
        max_entries: Directory entries looked at per listing.
        clock: Monotonic seconds, for the idle rule (injected by tests).
    """

    def __init__(self, directory: str | Path, on_records: Callable[[list[InspectorRecord], str], object], *,
                 poll_s: float = 1.0, max_bytes_per_poll: int = 8 << 20, max_lag_bytes: int = 64 << 20,
                 max_record_bytes: int = 64 << 10, max_files: int = 4096, max_open_files: int = 64,
                 idle_close_s: float = 30.0, max_entries: int = 65536,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_lag_bytes < max_bytes_per_poll or max_record_bytes < 1 or max_open_files < 1:
            raise ValueError("need max_lag_bytes >= max_bytes_per_poll, max_record_bytes >= 1, max_open_files >= 1")
        self.directory = Path(directory)
        self.on_records = on_records
        self.poll_s = poll_s
        self.max_bytes_per_poll = max_bytes_per_poll
        self.max_lag_bytes = max_lag_bytes
        self.max_record_bytes = max_record_bytes
        self.max_files = max_files
        self.max_open_files = max_open_files
        self.idle_close_s = idle_close_s
        self.max_entries = max_entries
        self.clock = clock
        self._files: dict[tuple[int, int], _File] = {}
        self._paths: dict[Path, tuple[int, int]] = {}
        self._polled = False
        self._present: bool | None = None
        self._counts: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._versions: Counter[str] = Counter()
        self._logged_reasons: set[str] = set()
        self._untracked = 0
        self._last_error = ""
        self._last_poll_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._health = self._snapshot()

    # -- life -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Poll on a thread of its own until ``stop``."""
        self._thread = threading.Thread(target=self._run, name="chopper-inspector", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread and close every handle."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for f in self._files.values():
            self._close(f)
        self._health = self._snapshot()

    def health(self) -> WatcherHealth:
        """The snapshot of the last poll (a reference swap: no lock, never blocks a scrape)."""
        return self._health

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a reader bug must not end the thread or the agent
                self._counts["poll_errors"] += 1
                self._last_error = f"poll failed: {type(exc).__name__}: {exc}"
                log.exception("event=inspector_poll_failed dir=%s", self.directory)
                self._health = self._snapshot()
            self._stop.wait(self.poll_s)

    # -- one poll ---------------------------------------------------------------------------------

    def poll_once(self) -> int:
        """One poll (steps of the module docstring); returns the number of records delivered."""
        started = time.perf_counter()
        self._counts["polls"] += 1
        batches: dict[str, list[InspectorRecord]] = {}
        listed = self._list()
        if listed is not None:
            listing, complete = listed
            budget = self.max_bytes_per_poll - self._follow(listing, complete, batches)
            for key in sorted(self._files, key=lambda k: self._files[k].last_used):
                if budget <= 0:
                    break
                f = self._files[key]
                budget -= self._read(f, listing[key][1] if key in listing else -1, budget, self._batch(batches, f))
        self._polled = True
        self._close_idle()
        for path, records in batches.items():
            if records:
                self._deliver(records, path)
        self._last_poll_s = time.perf_counter() - started
        self._health = self._snapshot()
        return sum(len(records) for records in batches.values())

    def _batch(self, batches: dict[str, list[InspectorRecord]], f: _File) -> list[InspectorRecord]:
        """The list collecting ``f``'s records this poll, under its path relative to the directory."""
        try:
            path = f.path.relative_to(self.directory).as_posix()
        except ValueError:
            path = f.path.name
        return batches.setdefault(path, [])

    def _list(self) -> tuple[dict[tuple[int, int], tuple[Path, int]], bool] | None:
        """(device, inode) -> (path, size) of the dump files and whether every entry was looked at;
        None when the directory cannot be listed."""
        found: dict[tuple[int, int], tuple[Path, int]] = {}
        complete = True
        try:
            for seen, entry in enumerate(self._entries(self.directory, 0), 1):
                if seen > self.max_entries:
                    complete = False
                    self._note_error(f"inspector_dir {self.directory}: more than {self.max_entries} entries; "
                                     "the rest are not looked at (remove old dump directories)")
                    break
                if not DUMP_NAME.fullmatch(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed between listing and stat
                found[(st.st_dev, st.st_ino)] = (Path(entry.path), st.st_size)
        except OSError as exc:
            self._directory_state(False, f"inspector_dir {self.directory}: {_why(exc)}")
            for f in self._files.values():
                self._close(f)
            self._files.clear()
            self._paths.clear()
            return None
        self._directory_state(True, "")
        return found, complete

    def _entries(self, directory: Path, depth: int) -> Iterator[os.DirEntry[str]]:
        """Entries of ``directory`` and, one level down, of its subdirectories (never through a link)."""
        with os.scandir(directory) as it:  # lazily: max_entries bounds the work of a huge directory
            for entry in it:
                yield entry
                if depth == 0 and entry.is_dir(follow_symlinks=False):
                    try:
                        yield from self._entries(Path(entry.path), 1)
                    except OSError:
                        continue  # a job's subdirectory removed or unreadable: the others still count

    def _follow(self, listing: Mapping[tuple[int, int], tuple[Path, int]], complete: bool,
                batches: dict[str, list[InspectorRecord]]) -> int:
        """Step 2 and 3: new, replaced, truncated and gone files; returns the bytes read finishing gone ones."""
        start_at_end = not self._polled  # files there when the agent started, not a directory created later
        used = 0
        for key in [k for k in self._files if k not in listing] if complete else []:
            gone = self._files.pop(key)
            if gone.fd is not None:  # finish a rotated-away file from the handle still open on it
                used += self._read(gone, os.fstat(gone.fd).st_size, self.max_bytes_per_poll - used,
                                   self._batch(batches, gone))
            self._close(gone)
        self._untracked = 0
        paths: dict[Path, tuple[int, int]] = {}
        for key, (path, size) in listing.items():
            f = self._files.get(key)
            if f is None:
                if len(self._files) >= self.max_files:
                    self._untracked += 1
                    continue
                if self._paths.get(path, key) != key:
                    self._counts["rotations"] += 1
                f = self._files[key] = _File(path, size if start_at_end else 0)
                if start_at_end and size:
                    f.discarding = not self._ends_with_newline(path, size)
            elif size < f.offset:
                self._counts["truncations"] += 1
                log.info("event=inspector_file_truncated path=%s size=%d offset=%d", path, size, f.offset)
                f.offset, f.discarding, f.decoder = 0, False, RecordDecoder()
                f.partial.clear()
            f.path = path
            paths[path] = key
        self._paths = paths
        return used

    def _read(self, f: _File, size: int, budget: int, records: list[InspectorRecord]) -> int:
        """Step 4 and 5 for one file; returns the bytes read."""
        if size <= f.offset:
            return 0
        if size - f.offset > self.max_lag_bytes:
            skip_to = size - self.max_lag_bytes
            self._counts["bytes_skipped"] += skip_to - f.offset
            log.warning("event=inspector_file_behind path=%s skipped_bytes=%d", f.path, skip_to - f.offset)
            f.offset, f.discarding = skip_to, True
            f.partial.clear()
            f.decoder.forget()
        fd = self._open(f)
        if fd is None:
            return 0
        done = 0
        while done < budget and f.offset < size:
            try:
                data = os.pread(fd, min(_CHUNK, budget - done, size - f.offset), f.offset)
            except OSError as exc:
                self._note_error(f"{f.path}: read failed: {_why(exc)}")
                self._close(f)
                break
            if not data:
                break
            f.offset += len(data)
            done += len(data)
            self._split(f, data, records)
        f.last_used = self.clock()
        self._counts["bytes_read"] += done
        return done

    def _split(self, f: _File, data: bytes, records: list[InspectorRecord]) -> None:
        """Cut ``data`` at newlines, keeping an unfinished last line in ``f.partial``."""
        start = 0
        while True:
            newline = data.find(b"\n", start)
            if newline < 0:
                if not f.discarding:
                    if len(f.partial) + len(data) - start > self.max_record_bytes:
                        self._reject("line_too_long", f"{f.path}: a line longer than {self.max_record_bytes} bytes "
                                     "(no newline): skipped to the next newline; the file is not a plugin dump")
                        f.partial.clear()
                        f.discarding = True
                        f.decoder.forget()
                    else:
                        f.partial += data[start:]
                return
            if f.discarding:
                f.discarding = False
            elif len(f.partial) + newline - start > self.max_record_bytes:
                self._reject("line_too_long", f"{f.path}: a line longer than {self.max_record_bytes} bytes: "
                             "skipped; the file is not a plugin dump")
                f.partial.clear()
                f.decoder.forget()
            elif f.partial:
                f.partial += data[start:newline]
                self._line(f, bytes(f.partial), records)
                f.partial.clear()
            else:
                self._line(f, data[start:newline], records)
            start = newline + 1

    def _line(self, f: _File, line: bytes, records: list[InspectorRecord]) -> None:
        if not line.strip():
            return
        try:
            obj = parse_line(line)
        except InspectorFormatError as exc:
            f.decoder.forget()  # the line may have been a v4.4 marker
            self._reject(exc.reason, f"{f.path}: {exc}")
            return
        try:
            decoded = f.decoder.decode(obj)
        except InspectorFormatError as exc:
            if exc.reason == "unknown_version" and exc.version is not None:
                label = exc.version if (exc.version in self._versions
                                        or len(self._versions) < MAX_REFUSED_VERSIONS) else "other"
                self._versions[label] += 1
            self._reject(exc.reason, f"{f.path}: {exc}")
            return
        if isinstance(decoded, InspectorRecord):
            records.append(decoded)
            self._counts["records"] += 1
        elif isinstance(decoded, DumpStats):
            self._counts["dump_stats"] += 1
            self._counts["plugin_dropped"] += (decoded.coll_dropped_since_last_dump
                                               + decoded.p2p_dropped_since_last_dump)
        else:
            self._counts["ignored"] += 1

    # -- handles ----------------------------------------------------------------------------------

    def _open(self, f: _File) -> int | None:
        if f.fd is not None:
            return f.fd
        open_files = [g for g in self._files.values() if g.fd is not None]
        if len(open_files) >= self.max_open_files:  # evict the least recently used
            self._close(min(open_files, key=lambda g: g.last_used))
        try:
            fd = os.open(f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self._note_error(f"{f.path}: cannot open: {_why(exc)}")
            return None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._paths.get(f.path):
            os.close(fd)  # replaced between listing and open: next poll sees the new inode
            return None
        f.fd, f.last_used = fd, self.clock()
        return fd

    def _close(self, f: _File) -> None:
        if f.fd is not None:
            os.close(f.fd)
            f.fd = None

    def _close_idle(self) -> None:
        now = self.clock()
        for f in self._files.values():
            if f.fd is not None and now - f.last_used > self.idle_close_s:
                self._close(f)

    def _ends_with_newline(self, path: Path, size: int) -> bool:
        """Whether the byte before ``size`` is a newline: reading from the end starts at a line."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            return os.pread(fd, 1, size - 1) == b"\n"
        finally:
            os.close(fd)

    # -- reporting --------------------------------------------------------------------------------

    def _deliver(self, records: list[InspectorRecord], path: str) -> None:
        try:
            self.on_records(records, path)
        except Exception as exc:  # the consumer's bug must not stop reading
            self._counts["callback_errors"] += 1
            self._last_error = f"on_records failed: {type(exc).__name__}: {exc}"
            if self._counts["callback_errors"] == 1:
                log.exception("event=inspector_callback_failed records=%d path=%s", len(records), path)

    def _reject(self, reason: str, message: str) -> None:
        self._rejected[reason] += 1
        self._last_error = message
        if reason not in self._logged_reasons:  # one line per reason: a bad file repeats on every poll
            self._logged_reasons.add(reason)
            log.warning("event=inspector_line_refused reason=%s error=%r", reason, message)

    def _note_error(self, message: str) -> None:
        if message != self._last_error:
            log.warning("event=inspector_error error=%r", message)
        self._last_error = message

    def _directory_state(self, present: bool, message: str) -> None:
        if present != self._present:
            if present:
                log.info("event=inspector_dir_present dir=%s", self.directory)
            else:
                log.warning("event=inspector_dir_unreadable error=%r", message)
        self._present = present
        if message:
            self._last_error = message

    def _snapshot(self) -> WatcherHealth:
        c = self._counts
        return WatcherHealth(
            directory=str(self.directory), directory_present=bool(self._present),
            files_tracked=len(self._files), files_open=sum(f.fd is not None for f in self._files.values()),
            files_untracked=self._untracked, bytes_read_total=c["bytes_read"],
            bytes_skipped_total=c["bytes_skipped"], records_total=c["records"], dump_stats_total=c["dump_stats"],
            plugin_dropped_total=c["plugin_dropped"], ignored_total=c["ignored"],
            rejected=MappingProxyType(dict(self._rejected)), refused_versions=MappingProxyType(dict(self._versions)),
            truncations_total=c["truncations"], rotations_total=c["rotations"],
            callback_errors_total=c["callback_errors"], poll_errors_total=c["poll_errors"], polls_total=c["polls"],
            last_poll_s=self._last_poll_s, last_error=self._last_error)


def _why(exc: OSError) -> str:
    """An OSError in words, with the fix for the usual ones."""
    if exc.errno == errno.ENOENT:
        return ("does not exist (yet): create it for the jobs (the plugin makes only its own dump directory, "
                "one level deep); it is polled again")
    if exc.errno == errno.EACCES:
        return "permission denied: give the agent's user read access (the plugin makes files 0666)"
    if exc.errno == errno.ENOTDIR:
        return "is not a directory: set inspector_dir to the directory the plugin writes"
    return f"{os.strerror(exc.errno) if exc.errno else type(exc).__name__}"
