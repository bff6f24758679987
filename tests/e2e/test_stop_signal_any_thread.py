"""Both daemons stop cleanly on a SIGTERM that the kernel hands to one of their other threads.

Linux may deliver a process-directed signal to any thread; CPython acts on it only in the main
thread (``chopper/daemon/stopsignals.py``). The test sends SIGTERM straight to a non-main thread with
``tgkill``, the worst case a ``systemctl stop`` can produce, and expects the clean stop path: exit
0 and ``event=stopped`` in the log. An untimed wait in the main thread ignored it until killed.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.daemons import AgentProcess, AggregatorProcess

STOP_WITHIN_S = 10.0


def signal_other_thread(proc: subprocess.Popen[bytes], sig: signal.Signals) -> int:
    """Send ``sig`` to one thread of ``proc`` that is not its main thread; return that thread's id."""
    others = sorted(int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task") if int(tid) != proc.pid)
    assert others, "the daemon runs no thread besides its main one"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(proc.pid, others[-1], int(sig)) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")
    return others[-1]


@pytest.mark.parametrize("daemon", ["agent", "aggregator"])
def test_sigterm_to_another_thread_stops_the_daemon_cleanly(tmp_path: Path, daemon: str) -> None:
    process = AgentProcess(tmp_path).start() if daemon == "agent" else AggregatorProcess(tmp_path).start()
    assert process.proc is not None
    signal_other_thread(process.proc, signal.SIGTERM)
    try:
        code = process.proc.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        process.proc.kill()
        process.proc.wait(10)
        raise AssertionError(f"the {daemon} ignored SIGTERM sent to one of its threads") from None
    assert code == 0, process.log()
    assert "event=stopped" in process.log()
