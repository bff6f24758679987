"""Disk full while ``chopper record`` writes a run: a clear error, no half-written tables, nothing lost.

"Full" is ``RLIMIT_FSIZE`` set on the recorder's process (``preexec_fn``, no root needed): a
write that would grow a file past 16 KiB fails with ``EFBIG``, as it would with ``ENOSPC``.
"""
from __future__ import annotations

import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from tests.faults.records import FaultRecord
from tests.support.daemons import AgentProcess

LIMIT_BYTES = 16 * 1024


def _record(agent: AgentProcess, out: Path, *extra: str, limit: int | None = None) -> subprocess.CompletedProcess[str]:
    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))  # type: ignore[arg-type]

    return subprocess.run(
        [sys.executable, "-m", "chopper.cli", "record", "--agent", agent.target, "--out", str(out), *extra],
        capture_output=True, text=True, timeout=60, preexec_fn=full_disk if limit is not None else None,
    )


def test_disk_full_while_recording(tmp_path: Path, fault_record: FaultRecord) -> None:
    rec = fault_record
    rec.fault = f"disk full while `chopper record` writes its run (RLIMIT_FSIZE {LIMIT_BYTES // 1024} KiB)"
    rec.promise = ("a clear error naming the directory, the cause and the fix; no half-written table; what was "
                   "recorded can be recorded again from the agent's buffers")
    agent = AgentProcess(tmp_path).start()
    out = tmp_path / "run"
    try:
        began_ns = time.time_ns()
        full = _record(agent, out, "--duration", "2", limit=LIMIT_BYTES)
        ended_ns = time.time_ns()
        left = sorted(p.name for p in out.iterdir()) if out.exists() else []
        again = _record(agent, out, "--duration", "0.5", "--since-buffer")
    finally:
        agent.terminate()
    message = full.stderr.strip().splitlines()[-1] if full.stderr.strip() else ""
    shown = message.replace(str(tmp_path), "TMP")
    found = re.search(r"the (\d+) samples and (\d+) markers recorded were not written", message)
    collected = int(found.group(1)) if found else -1
    samples = pd.read_parquet(out / "samples.parquet") if again.returncode == 0 else pd.DataFrame({"ts_ns": []})
    recovered = int(((samples["ts_ns"] >= began_ns) & (samples["ts_ns"] <= ended_ns)).sum())
    rec.lost = max(0, collected - recovered)
    rec.duplicated = int(samples.duplicated(["ts_ns", "gpu"]).sum()) if len(samples) else 0
    rec.counted_losses = 0
    rec.outcome = (f"exit {full.returncode}: \"{shown[:200]}…\"; files left: {left}; "
                   f"`--since-buffer` rerun wrote {recovered} of the {collected} samples of the failed window")
    assert full.returncode == 1, full.stderr
    assert found and str(out) in message and "File too large" in message and "--since-buffer" in message
    assert not left, "a half-written table was left behind"
    assert again.returncode == 0, again.stderr
    assert collected > 0 and recovered >= collected
    assert rec.duplicated == 0
