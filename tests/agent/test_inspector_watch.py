"""The Inspector dump-directory watcher on real files: appends, rotation, truncation, torn lines, garbage,
a vanishing directory, a 1 GB file and many files, with memory, time and handles measured.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from agent.inspector import DumpDirWatcher
from chopper.inspector import InspectorRecord
from tests.support.fake_clock import FakeClock
from tests.support.hazards import HazardOutcome
from tests.support.inspector_dumps import Collective, Comm, coll_line
from tests.support.polling import wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "inspector"
T0_US = 1_764_662_400_000_000
MiB = 1 << 20


def comm(pid: int = 41001, rank: int = 0) -> Comm:
    return Comm("0x5d1c0ffee1a2b3", rank, 2, 1, "node-a", pid)


def line(seq: int, pid: int = 41001, version: str = "v4.0") -> str:
    return coll_line(comm(pid), Collective("AllReduce", seq, 8 * MiB, 100, T0_US + seq * 1000), version=version)


class Sink:
    """Collects what the watcher delivers."""

    def __init__(self) -> None:
        self.records: list[InspectorRecord] = []
        self.paths: list[str] = []

    def __call__(self, records: list[InspectorRecord], path: str) -> None:
        self.paths.append(path)
        self.records.extend(records)

    def seqs(self) -> list[int]:
        return [r.seq for r in self.records]


def append(path: Path, text: str | bytes) -> None:
    with path.open("ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def open_fds_under(directory: Path) -> int:
    """Descriptors of this process open on files under ``directory``, read from /proc (outside the watcher)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory)):
                count += 1
        except OSError:
            continue
    return count


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    directory = tmp_path / "dump"
    directory.mkdir()
    return directory


def test_appends_are_read_once_each_in_order_on_the_watchers_thread(dump: Path) -> None:
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink, poll_s=0.02)
    watcher.poll_once()  # the empty directory of a job that has not started
    path = dump / "node-a-pid41001.log"
    append(path, line(1) + line(2) + line(3))
    assert watcher.poll_once() == 3
    append(path, line(4) + line(5))
    assert watcher.poll_once() == 2
    assert watcher.poll_once() == 0
    assert sink.seqs() == [1, 2, 3, 4, 5] and set(sink.paths) == {"node-a-pid41001.log"}
    watcher.start()
    try:
        assert "chopper-inspector" in {t.name for t in threading.enumerate()}
        append(path, line(6))
        assert wait_until(lambda: sink.seqs()[-1:] == [6], timeout_s=5)
    finally:
        watcher.stop()
    health = watcher.health()
    assert (health.records_total, health.rejected, health.files_open) == (6, {}, 0)
    assert health.bytes_read_total == path.stat().st_size
    with pytest.raises(dataclasses.FrozenInstanceError):
        health.records_total = 0  # type: ignore[misc]


def test_files_present_at_start_are_read_from_their_end(dump: Path) -> None:
    path = dump / "node-a-pid41001.log"
    half = line(6)[:70]
    append(path, line(1) + line(2) + line(3) + line(4) + line(5) + half)
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    assert watcher.poll_once() == 0
    assert watcher.health().bytes_read_total == 0
    append(path, line(6)[70:] + line(7))
    assert watcher.poll_once() == 1
    # The line begun before the agent started is dropped whole, not counted as garbage.
    assert sink.seqs() == [7] and watcher.health().rejected == {}


def test_a_file_renamed_away_and_recreated_is_finished_then_followed_anew(dump: Path) -> None:
    path = dump / "node-a-pid41001.log"
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    append(path, line(1) + line(2))
    assert watcher.poll_once() == 2
    path.rename(dump / "node-a-pid41001.log.1")   # logrotate's rename; the writer keeps its handle
    append(dump / "node-a-pid41001.log.1", line(3))
    append(path, line(10) + line(11))               # a new file under the old name
    assert watcher.poll_once() == 3
    assert sorted(sink.seqs()) == [1, 2, 3, 10, 11]
    health = watcher.health()
    assert (health.rotations_total, health.files_tracked, health.rejected) == (1, 1, {})


def test_a_truncated_file_is_read_again_from_its_start(dump: Path) -> None:
    path = dump / "node-a-pid41001.log"
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    append(path, line(1) + line(2) + line(3))
    watcher.poll_once()
    with path.open("w") as f:    # the plugin's fopen(..., "w") by a new process of the same pid
        f.write(line(1))
    assert watcher.poll_once() == 1
    assert sink.seqs() == [1, 2, 3, 1]
    assert watcher.health().truncations_total == 1


def test_a_partial_line_is_kept_until_its_newline_arrives(dump: Path) -> None:
    path = dump / "node-a-pid41001.log"
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    whole = line(1) + line(2)
    for cut in (40, 41, 300, 301, len(whole)):  # stdio buffers split records anywhere
        append(path, whole[path.stat().st_size if path.exists() else 0:cut])
        watcher.poll_once()
    assert sink.seqs() == [1, 2] and watcher.health().rejected == {}


@pytest.mark.hazard(item=16, input="a dump whose last record is cut after 100 bytes (no newline), completed later",
                    promise="the whole records are read at once, the torn one is kept, not counted as garbage, and "
                    "read once its rest arrives")
def test_the_truncated_fixture_reads_two_records_and_waits_for_the_third(dump: Path, hazard: HazardOutcome) -> None:
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    source = FIXTURES / "truncated" / "node-a-pid41010.log"
    shutil.copy(source, dump / source.name)
    assert watcher.poll_once() == 2
    assert watcher.health().rejected == {}
    # The torn record is the ReduceScatter that rank 0 wrote in plain/, as rank 1 in process 41002.
    plain = (FIXTURES / "plain" / "node-a-pid41001.log").read_text().splitlines(keepends=True)[2]
    full = plain.replace('"rank":0', '"rank":1').replace('"pid":41001', '"pid":41002')
    torn = source.read_text().rsplit("\n", 1)[1]
    assert full.startswith(torn) and len(torn) == 100
    append(dump / source.name, full[len(torn):])
    watcher.poll_once()
    assert len(sink.records) == 3 and watcher.health().rejected == {}
    assert sink.records[2].collective == "ReduceScatter" and sink.records[2].comm_rank == 1
    hazard.outcome = ("2 records read, the 100-byte torn one held with 0 rejections; "
                      f"completed with {len(full) - len(torn)} more bytes, it read as the third record")


def test_fixture_jobs_read_through_the_watcher(dump: Path) -> None:
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    for mode in ("plain", "verbose", "v4.4"):
        shutil.copytree(FIXTURES / mode, dump / mode)     # one dump directory per job, under inspector_dir
    watcher.poll_once()
    by_pid: dict[int, int] = {}
    for record in sink.records:
        by_pid[record.pid] = by_pid.get(record.pid, 0) + 1
    assert by_pid == {41001: 20, 41002: 20, 41003: 3}
    # One call per file, named relative to inspector_dir: the first part names the job's directory.
    expected = [f"{mode}/node-a-pid{pid}.log" for mode in ("plain", "verbose") for pid in (41001, 41002)]
    assert sorted(sink.paths) == sorted([*expected, "v4.4/node-a-pid41003.log"])
    health = watcher.health()
    assert (health.dump_stats_total, health.plugin_dropped_total, health.files_tracked) == (1, 5, 5)


@pytest.mark.hazard(item=16, input="a dump file mixing records with text, binary junk, a 70 KB line without a "
                    "newline, and records of 10 unknown versions",
                    promise="each bad line is counted by reason and skipped to the next newline; the good records "
                    "around them are read; at most 8 refused versions are named, the rest count as other")
def test_garbage_is_counted_by_reason_and_skipped(dump: Path, hazard: HazardOutcome,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = dump / "node-a-pid41001.log"
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    versions = "".join(line(100 + i, version=f"v9.{i}") for i in range(10))
    append(path, line(1) + "this is not json\n" + line(2))
    append(path, b"\x00\xff\xfe junk \x9c\n" + b"x" * (70 << 10) + b"\n" + versions.encode() + line(3).encode())
    with caplog.at_level(logging.WARNING, logger="agent.inspector.watch"):
        watcher.poll_once()
        append(path, "still not json\n" + line(4))
        watcher.poll_once()
    health = watcher.health()
    assert sink.seqs() == [1, 2, 3, 4]
    assert dict(health.rejected) == {"not_json": 3, "line_too_long": 1, "unknown_version": 10}
    assert len(health.refused_versions) == 9 and health.refused_versions["other"] == 2
    assert sum(health.refused_versions.values()) == 10
    assert "v9.9" in health.last_error or "not" in health.last_error
    refused_logs = [r for r in caplog.records if "inspector_line_refused" in r.getMessage()]
    assert len(refused_logs) == 3  # one per reason, not one per line
    hazard.outcome = (f"4 of 4 good records read; refused {dict(health.rejected)}; versions named: "
                      f"{len(health.refused_versions) - 1} + other={health.refused_versions['other']}; "
                      f"{len(refused_logs)} log lines")


@pytest.mark.hazard(item=16, input="inspector_dir missing at start, then created with a dump, then removed, "
                    "then created again",
                    promise="the watcher keeps polling, reports the directory absent with the reason, and reads "
                    "every dump that appears once the directory is back")
def test_a_directory_that_vanishes_and_returns(tmp_path: Path, hazard: HazardOutcome) -> None:
    directory = tmp_path / "dump"
    sink = Sink()
    watcher = DumpDirWatcher(directory, sink)
    watcher.poll_once()
    missing = watcher.health()
    assert not missing.directory_present and "does not exist" in missing.last_error
    directory.mkdir()
    append(directory / "node-a-pid41001.log", line(1) + line(2))
    watcher.poll_once()
    assert sink.seqs() == [1, 2] and watcher.health().directory_present
    shutil.rmtree(directory)
    watcher.poll_once()
    gone = watcher.health()
    assert (gone.directory_present, gone.files_tracked, gone.files_open) == (False, 0, 0)
    directory.mkdir()
    append(directory / "node-a-pid41002.log", line(3, pid=41002))
    watcher.poll_once()
    assert sink.seqs() == [1, 2, 3] and watcher.health().directory_present
    reason = missing.last_error.split(": ", 1)[1]
    hazard.outcome = (f"absent: {reason[:60]}...; after removal files_tracked=0, "
                      f"polls={watcher.health().polls_total}, all 3 records of both incarnations read")


@pytest.mark.hazard(item=16, input="a sparse 1 GB dump file (zeros) with a record after it, appearing while the "
                    "agent runs; and a 1 GB file present when the agent starts",
                    promise="each poll reads at most max_bytes_per_poll with bounded memory and time; the backlog "
                    "beyond max_lag_bytes is skipped and counted; the record after it is read")
def test_a_1_gb_file_is_read_with_bounded_memory_and_time(dump: Path, hazard: HazardOutcome) -> None:
    old = dump / "node-a-pid40000.log"
    with old.open("wb") as f:
        f.truncate(1 << 30)
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    started = time.perf_counter()
    watcher.poll_once()
    first_poll_s = time.perf_counter() - started
    assert watcher.health().bytes_read_total == 0   # present at start: read from its end
    big = dump / "node-a-pid41001.log"
    with big.open("wb") as f:
        f.truncate(1 << 30)
        f.seek(1 << 30)
        f.write(b"\n" + line(1).encode())
    peaks, times, reads = [], [], []
    tracemalloc.start()
    try:
        while not sink.records and len(times) < 40:
            before = watcher.health().bytes_read_total
            tracemalloc.reset_peak()
            started = time.perf_counter()
            watcher.poll_once()
            times.append(time.perf_counter() - started)
            peaks.append(tracemalloc.get_traced_memory()[1])
            reads.append(watcher.health().bytes_read_total - before)
    finally:
        tracemalloc.stop()
    health = watcher.health()
    assert sink.seqs() == [1]
    assert max(reads) <= watcher.max_bytes_per_poll
    assert max(peaks) < 4 * MiB, peaks
    assert max(times) < 2.0 and first_poll_s < 1.0, times
    assert health.bytes_skipped_total == (1 << 30) + 1 + len(line(1)) - watcher.max_lag_bytes
    assert health.bytes_read_total == watcher.max_lag_bytes
    hazard.outcome = (f"{len(times)} polls, each reading <= {max(reads) // MiB} MiB in <= {max(times):.3f} s with "
                      f"a memory peak <= {max(peaks) / MiB:.2f} MiB; {health.bytes_skipped_total // MiB} MiB "
                      f"skipped and counted; the record after the zeros read; a 1 GB file present at start "
                      f"cost {first_poll_s * 1000:.1f} ms and 0 bytes")


def test_handles_stay_bounded_and_idle_ones_are_closed(dump: Path) -> None:
    clock = FakeClock(100.0)
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink, max_open_files=4, idle_close_s=30.0, clock=clock)
    watcher.poll_once()
    for pid in range(20):
        append(dump / f"node-a-pid{50000 + pid}.log", line(1, pid=50000 + pid) + line(2, pid=50000 + pid))
    watcher.poll_once()
    assert len(sink.records) == 40
    assert watcher.health().files_open <= 4 and open_fds_under(dump) <= 4
    for pid in range(20):
        append(dump / f"node-a-pid{50000 + pid}.log", line(3, pid=50000 + pid))
    watcher.poll_once()
    assert len(sink.records) == 60 and open_fds_under(dump) <= 4
    clock.now += 31.0
    watcher.poll_once()
    assert watcher.health().files_open == 0 and open_fds_under(dump) == 0


def test_a_failing_consumer_is_counted_and_logged_once(dump: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(records: list[InspectorRecord], path: str) -> None:
        raise RuntimeError("consumer bug")

    watcher = DumpDirWatcher(dump, broken)
    watcher.poll_once()
    path = dump / "node-a-pid41001.log"
    with caplog.at_level(logging.WARNING, logger="agent.inspector.watch"):
        for seq in (1, 2, 3):
            append(path, line(seq))
            watcher.poll_once()
    health = watcher.health()
    assert (health.callback_errors_total, health.records_total) == (3, 3)
    assert "consumer bug" in health.last_error
    assert sum("inspector_callback_failed" in r.getMessage() for r in caplog.records) == 1


def test_only_regular_dump_files_are_opened(dump: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0\n")
    (dump / "evil-pid1.log").symlink_to(secret)
    os.mkfifo(dump / "fifo-pid2.log")               # would block an open without O_NONBLOCK
    (dump / "nccl_inspector_metrics_GPU0.prom").write_text("nccl_bus_bandwidth_gbs 1\n")
    (dump / "job7").mkdir()
    (dump / "job7" / "linked").symlink_to(tmp_path)  # a link to a directory is not followed
    sink = Sink()
    watcher = DumpDirWatcher(dump, sink)
    watcher.poll_once()
    append(dump / "job7" / "node-b-pid3.log", line(1, pid=3))
    watcher.poll_once()
    health = watcher.health()
    assert sink.seqs() == [1] and health.files_tracked == 1 and health.rejected == {}
