"""``chopper attribute`` as a user runs it, on good and bad recorded runs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from chopper.cli import main
from chopper.runs.rundir import read_run, write_run
from tests.support.attribution_scenarios import ALL_SCENARIOS


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return ALL_SCENARIOS["hot_straggler"]().write(tmp_path / "run")


def rewrite(run_dir: Path, *, samples=None, markers=None, devices=None) -> Path:  # type: ignore[no-untyped-def]
    run = read_run(run_dir)
    out = run_dir.parent / "edited"
    write_run(out, run.devices if devices is None else devices, run.samples if samples is None else samples,
              run.markers if markers is None else markers)
    return out


def test_table_and_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:4] == ["job", "rank", "step", "step_ms"]
    assert "slowest ranks" in table and "cause thermal" in table
    assert main(["attribute", str(run_dir), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = doc["steps"][0]
    assert set(first["dvfs_by_cause"]) == {"power", "thermal", "current", "other", "unattributed"}
    assert {"job", "rank", "step", "step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s",
            "straggler_wait_s", "idle_s", "mfu", "flags"} <= set(first)
    assert [j["job"] for j in doc["summary"]["jobs"]] == ["hot_straggler"]
    assert len(doc["summary"]["ranks"]) == 4 and doc["summary"]["stragglers"][0]["cause"] == "thermal"
    # Phase times: each phase is marked once per step here, so its time is its end minus its begin.
    markers = read_run(run_dir).markers
    ts = markers[markers["kind"].str.startswith("phase")].set_index(["rank", "step", "name", "kind"])["ts_ns"]
    ts = ts.unstack("kind")  # int64 nanoseconds: a float pivot would round them to 256 ns
    windows = (ts["phase_end"] - ts["phase_begin"]) / 1e9
    for row in doc["steps"]:
        expected = windows.loc[(row["rank"], row["step"])]
        assert row["phase_s"] == pytest.approx(expected.to_dict(), abs=1e-9)
    assert set(doc["steps"][0]["phase_s"]) == {"forward", "backward", "optimizer"}
    assert "phases, mean per rank-step: backward" in table


def test_job_filter(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attribute", str(run_dir), "--job", "nope"]) == 2
    assert "job 'nope' has no markers in this run; check --job" in capsys.readouterr().err


def test_missing_table(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run_dir / "markers.parquet").unlink()
    assert main(["attribute", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "markers" in err and "markers.parquet" in err and "markers.csv" in err


def test_renamed_column(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = read_run(run_dir)
    run.samples.rename(columns={"busy_ratio": "gpu_util"}).to_csv(run_dir / "samples.csv", index=False)
    (run_dir / "samples.parquet").unlink()
    assert main(["attribute", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "busy_ratio" in err and "gpu_util" in err


def test_counters_out_of_order(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = read_run(run_dir).samples
    gpu0 = samples.index[(samples["node"] == samples["node"].iloc[0]) & (samples["gpu"] == 0)]
    # Swap the energy readings of two samples: what a reordered or spliced table looks like.
    a, b = gpu0[3], gpu0[4]
    samples.loc[[a, b], "energy_j"] = samples.loc[[b, a], "energy_j"].to_numpy()
    assert main(["attribute", str(rewrite(run_dir, samples=samples))]) == 2
    assert "cumulative counter energy_j goes backwards" in capsys.readouterr().err


def test_repeated_timestamps(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = read_run(run_dir).samples
    duplicated = samples.iloc[[5]]
    import pandas as pd

    assert main(["attribute", str(rewrite(run_dir, samples=pd.concat([samples, duplicated])))]) == 2
    assert "repeated timestamps" in capsys.readouterr().err


def test_unpaired_markers_are_reported_and_skipped(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    markers = read_run(run_dir).markers
    drop = markers.index[(markers["rank"] == 1) & (markers["step"] == 3) & (markers["kind"] == "step_begin")]
    phase_ends = markers.index[(markers["rank"] == 0) & (markers["step"] == 4) & (markers["kind"] == "phase_end")]
    drop = drop.append(phase_ends[:1])
    assert main(["attribute", str(rewrite(run_dir, markers=markers.drop(drop))), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    problems = doc["summary"]["problems"]
    assert any("rank 1: 1 step_end markers without a step_begin (steps 3); skipped" in p for p in problems)
    assert any("rank 0: 1 phase/collective begins without an end (steps 4); skipped" in p for p in problems)
    assert (1, 3) not in {(s["rank"], s["step"]) for s in doc["steps"]}


def test_unknown_device_and_missing_flops_are_flagged(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    markers = read_run(run_dir).markers
    markers.loc[markers["rank"] == 3, "gpu"] = 7  # no such device on that node
    markers.loc[(markers["kind"] == "step_end") & (markers["rank"] == 0), "flops"] = float("nan")
    assert main(["attribute", str(rewrite(run_dir, markers=markers)), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rank3 = [s for s in doc["steps"] if s["rank"] == 3]
    assert all("no_gpu" in s["flags"] and "no_samples" in s["flags"] for s in rank3)
    assert any("gpu 7, which is not in the devices table" in p for p in doc["summary"]["problems"])
    rank0 = [s for s in doc["steps"] if s["rank"] == 0]
    assert all(s["ideal_s"] is None and s["mfu"] is None and s["matrix_util_loss_s"] is None for s in rank0)
    assert all("no_flops" in s["flags"] and s["dvfs_loss_s"] is not None for s in rank0)


def test_run_without_steps(tmp_path: Path, run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    markers = read_run(run_dir).markers
    only_phases = markers[~markers["kind"].str.startswith("step")]
    assert main(["attribute", str(rewrite(run_dir, markers=only_phases))]) == 2
    assert "no complete step" in capsys.readouterr().err
