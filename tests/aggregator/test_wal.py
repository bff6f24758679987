"""Write-ahead log: records round-trip, one fsync serves many waiters, a torn tail is ignored, old segments go."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from aggregator.wal import BATCH, FILES, LEDGER, Wal, WalError, read_segment, summary_id


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("segment-*.log"))


def test_records_replay_in_order_and_a_new_life_continues_the_count(tmp_path: Path) -> None:
    wal = Wal(tmp_path / "wal", commit_interval_s=0.0)
    wal.start([(LEDGER, b"snapshot")])
    lsns = [wal.append(BATCH, f"batch {i}".encode()) for i in range(5)]
    wal.sync(lsns[-1])
    assert wal.durable_lsn == lsns[-1] == 6 and wal.stats()["records_total"] == 6
    wal.close()
    again = Wal(tmp_path / "wal")
    got = [(r.kind, r.lsn, r.payload) for r in again.replay()]
    assert got == [(LEDGER, 1, b"snapshot"), *((BATCH, 2 + i, f"batch {i}".encode()) for i in range(5))]
    assert again.stats()["replayed_records_total"] == 6 and again.stats()["torn_records_total"] == 0
    again.start()
    assert again.append(FILES, b"x") == 7  # lsns never repeat, so summary ids never collide across lives
    again.close()
    assert [p.name for p in segments(tmp_path / "wal")] == ["segment-00000000000000000001.log",
                                                            "segment-00000000000000000007.log"]
    assert summary_id(7, 3) == (7 << 24) | 3


def test_one_fsync_releases_many_waiting_streams(tmp_path: Path) -> None:
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        # A disk that takes 10 ms per fsync. Not the real fsync as well: under disk load it takes
        # hundreds of ms, and what is checked here is how appends share fsyncs, not durability.
        time.sleep(0.01)

    # A long interval, so that appends spread over seconds by a starved runner still share commits.
    wal = Wal(tmp_path, commit_interval_s=0.25)
    wal.start()
    start = threading.Barrier(64)
    waited: list[float] = []

    def stream() -> None:
        start.wait()
        t = time.monotonic()
        wal.wait(wal.append(BATCH, b"x" * 100))
        waited.append(time.monotonic() - t)

    os.fsync = slow_fsync  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=stream) for _ in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        os.fsync = real_fsync
    wal.close()
    assert len(waited) == 64
    # 64 appends share fsyncs (group commit: about 4 each at the least), not one fsync each.
    assert wal.stats()["fsyncs_total"] <= 16, wal.stats()
    # Each waiter is released by the commit after its append (an interval plus an fsync); the
    # bound, seconds, only catches a waiter that is not woken by that commit.
    assert max(waited) < 5, max(waited)
    assert len(read_segment(segments(tmp_path)[0])[0]) == 64


def test_torn_tail_is_ignored_and_counted(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    wal.start()
    for i in range(3):
        wal.append(BATCH, bytes([i]) * 50)
    wal.sync(3)
    wal.close()
    path = segments(tmp_path)[0]
    data = path.read_bytes()
    path.write_bytes(data[:-10])  # kill -9 in the middle of the last write
    again = Wal(tmp_path)
    assert [r.lsn for r in again.replay()] == [1, 2]
    assert again.stats()["torn_records_total"] == 1 and again.stats()["corrupt_records_total"] == 0
    again.start()  # the new segment continues at the torn record's lsn: it was never acknowledged
    assert again.append(BATCH, b"x") == 3
    again.close()
    assert [p.name[-8:-4] for p in segments(tmp_path)] == ["0001", "0003"]


def test_truncate_deletes_closed_durable_segments_below_the_oldest_needed(tmp_path: Path) -> None:
    wal = Wal(tmp_path)
    wal.start([(LEDGER, b"s1")])
    wal.sync(wal.append(BATCH, b"a"))  # lsn 2
    wal.rotate([(LEDGER, b"s2")])  # segment from lsn 3
    wal.sync(wal.append(BATCH, b"b"))  # lsn 4
    wal.rotate([(LEDGER, b"s3")])  # segment from lsn 5
    wal.sync(5)
    assert wal.stats()["segments"] == 3 and len(segments(tmp_path)) == 3
    assert wal.truncate(below=2) == 0  # lsn 2 is still needed (its summary is in an open step)
    assert wal.truncate(below=4) == 1  # the first segment's records are all stored
    assert [p.name[-8:-4] for p in segments(tmp_path)] == ["0003", "0005"]
    assert wal.truncate(below=10**9) == 1  # never the active segment
    assert len(segments(tmp_path)) == 1 and wal.stats()["bytes"] == segments(tmp_path)[0].stat().st_size
    wal.close()


def test_failed_fsync_fails_every_waiter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal = Wal(tmp_path)
    wal.start()
    wal.sync(wal.appended_lsn)

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    lsn = wal.append(BATCH, b"x")
    with pytest.raises(WalError, match="Input/output error"):
        wal.wait(lsn, timeout_s=5)
    assert wal.stats()["failed"] == 1
    wal.close()


_FULL_DISK = """
import resource, sys, time
from pathlib import Path
from aggregator.wal import BATCH, LEDGER, Wal, WalError, read_segment
wal = Wal(Path(sys.argv[1]), commit_interval_s=0.0)
wal.start([(LEDGER, b"snapshot")])
wal.sync(wal.append(BATCH, b"before" * 100))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
# The disk fills up 10 bytes into the next record: a partial write the retry must cut off.
size = sorted(Path(sys.argv[1]).glob("segment-*.log"))[-1].stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 10, hard))
lsn = wal.append(BATCH, b"during" * 100)
try:
    wal.wait(lsn, timeout_s=5)
    sys.exit("acknowledged on a full disk")
except WalError:
    pass
assert wal.failing and wal.stats()["failed"] == 1 and wal.stats()["write_errors_total"] >= 1
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space is back
deadline = time.monotonic() + 10
while wal.failing and time.monotonic() < deadline:  # waiters are refused at once until a retry succeeds
    time.sleep(0.05)
wal.wait(lsn, timeout_s=1)
wal.sync(wal.append(BATCH, b"after"))
wal.close()
records, torn = read_segment(sorted(Path(sys.argv[1]).glob("segment-*.log"))[-1])
assert not torn and [r.payload[:6] for r in records] == [b"snapsh", b"before", b"during", b"after"], records
"""


def test_a_full_disk_fails_the_acks_then_the_log_retries_by_itself(tmp_path: Path) -> None:
    # RLIMIT_FSIZE makes writes fail like ENOSPC (EFBIG; Python ignores SIGXFSZ); it is set in a
    # child process so that nothing else of the test run is cut off.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(tmp_path / "wal")], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
