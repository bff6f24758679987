"""One rule finds the trace files of ``chopper trace``, ``report``, ``attribute`` and ``capture``."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from chopper.cli import main
from chopper.report import find_inputs
from chopper.runs import capture_join
from chopper.trace.discover import TRACES_DIR, trace_files
from tests.support.attribution_scenarios import ALL_SCENARIOS
from tests.support.kineto_data import KINETO_DIR, requires_kineto

NCCL = [KINETO_DIR / "nccl_128ranks_rank0.json.gz", KINETO_DIR / "nccl_128ranks_rank1.json.gz"]


def test_the_rule_takes_json_and_json_gz_at_any_depth_and_nothing_else(tmp_path: Path) -> None:
    names = ["a.json", "b.pt.trace.json.gz", "rank3/c.json", "x/y/z/d.json.gz",
             "capture.jsonl", "samples.parquet", "markers.csv", "e.json.tmp", "f.gz"]
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "dir.json").mkdir()  # a directory named like a trace is not one
    found = [p.relative_to(tmp_path).as_posix() for p in trace_files(tmp_path)]
    assert found == ["a.json", "b.pt.trace.json.gz", "rank3/c.json", "x/y/z/d.json.gz"]
    assert trace_files(tmp_path / "a.json") == [tmp_path / "a.json"]
    assert trace_files(tmp_path / "capture.jsonl") == [] and trace_files(tmp_path / "absent") == []


@pytest.fixture
def capture_dir(tmp_path: Path) -> Path:
    """What ``chopper capture`` leaves: the run's tables, ``capture.jsonl`` and ``traces/rank<R>.pt.trace.json.gz``."""
    run = ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "capture")
    (run / TRACES_DIR).mkdir()
    for rank, trace in enumerate(NCCL):
        shutil.copy(trace, run / TRACES_DIR / f"rank{rank}.pt.trace.json.gz")
    (run / "capture.jsonl").write_text(json.dumps({"capture_id": "c1", "job": "hot_straggler"}) + "\n")
    return run


@requires_kineto
def test_every_command_reads_the_same_traces_of_a_capture_directory(
        capture_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [capture_dir / TRACES_DIR / f"rank{rank}.pt.trace.json.gz" for rank in (0, 1)]
    assert trace_files(capture_dir) == expected
    # chopper trace: the ranks it analyzed, by path.
    assert main(["trace", str(capture_dir), "--json", "--top", "1"]) == 0
    assert [r["path"] for r in json.loads(capsys.readouterr().out)["ranks"]] == [str(p) for p in expected]
    # chopper report: the traces beside the run it found.
    assert find_inputs(capture_dir) == ("run", expected)
    # chopper attribute: the traces its capture join read.
    joined: list[Path] = []
    real = capture_join.load_traces

    def spy(files, require_gpu=True):  # type: ignore[no-untyped-def]
        joined.extend(files)
        return real(files, require_gpu=require_gpu)

    monkeypatch.setattr(capture_join, "load_traces", spy)
    assert main(["attribute", str(capture_dir), "--json"]) == 0
    assert "capture" in json.loads(capsys.readouterr().out) and joined == expected
