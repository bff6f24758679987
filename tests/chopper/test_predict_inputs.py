"""What a prediction reads from a run: each step's critical path from the attribution columns, and
one row per collective call, from Inspector records when the run has them, else from the markers."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from chopper.attribution import attribute_run
from chopper.predict import PredictInputError, load_inputs
from chopper.runs.rundir import read_run, write_run
from tests.support.attribution_scenarios import ALL_SCENARIOS

MS = 1e-3


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 ranks; per step a 25 ms all_reduce of 14 GB after backward and an 8 ms all_gather of 7 GB."""
    return ALL_SCENARIOS["exposed_collectives"]().write(tmp_path_factory.mktemp("exposed") / "run")


def test_steps_are_the_critical_path_of_the_attribution(exposed: Path) -> None:
    inputs = load_inputs(exposed)
    steps = attribute_run(exposed).steps
    assert inputs.world_size == 2 and inputs.job == "exposed_collectives" and len(inputs.steps) == 12
    by_step = steps.assign(compute=steps["step_time_s"] - steps["exposed_comm_s"] - steps["idle_s"].fillna(0)
                           - steps["straggler_wait_s"]).groupby("step")
    assert np.allclose(inputs.steps["compute_s"], by_step["compute"].max().to_numpy())
    assert np.allclose(inputs.steps["exposed_comm_s"],
                       (steps["exposed_comm_s"] + steps["straggler_wait_s"]).groupby(steps["step"]).min().to_numpy())
    # The scenario's ground truth: 25 ms + 3 of the all-gather's 8 ms are exposed; both collectives last 33 ms.
    assert inputs.steps["exposed_comm_s"].to_numpy() == pytest.approx(28 * MS, abs=0.1 * MS)
    assert inputs.steps["collective_s"].to_numpy() == pytest.approx(33 * MS, abs=0.1 * MS)


def test_marker_calls_take_the_fastest_rank_and_the_whole_array(exposed: Path) -> None:
    calls = load_inputs(exposed).collectives
    assert set(calls["source"]) == {"markers"} and len(calls) == 24
    gather = calls[calls["collective"] == "all_gather"]
    # all_gather's marker bytes are one rank's shard: S = 2 × 7 GB.
    assert set(gather["size"]) == {14e9} and set(calls.loc[calls["collective"] == "all_reduce", "size"]) == {14e9}
    assert gather["seconds"].to_numpy() == pytest.approx(8 * MS, abs=0.1 * MS)


def test_inspector_records_are_preferred_and_joined_across_ranks(exposed: Path, tmp_path: Path) -> None:
    run = read_run(exposed)
    m = run.markers
    begins, ends = m[m["kind"] == "collective_begin"], m[m["kind"] == "collective_end"]
    rows = []
    for seq, ((_, b), (_, e)) in enumerate(zip(begins.iterrows(), ends.iterrows(), strict=True)):
        # Rank 1 waits 5 ms in each call for rank 0: the call's time is rank 0's.
        extra = 5e-3 if b["rank"] == 1 else 0.0
        rows.append({"job": b["job"], "node": b["node"], "rank": b["rank"], "gpu": b["gpu"],
                     "collective": {"all_reduce": "AllReduce", "all_gather": "AllGather"}[b["name"]],
                     "begin_ns": b["ts_ns"], "end_ns": e["ts_ns"], "placed": True,
                     "exec_s": (e["ts_ns"] - b["ts_ns"]) / 1e9 + extra, "timing_source": "kernel_gpu",
                     # NCCL counts AllGather per rank, and the scenario's all-reduce is 14 GB.
                     "bytes": int(b["bytes"]), "algo_bandwidth_gbs": 1.0, "bus_bandwidth_gbs": 1.0, "comm_id": "c0",
                     "comm_rank": b["rank"], "comm_ranks": 2, "comm_nodes": 1, "seq": seq // 2, "pid": 1,
                     "format_version": "v4.0"})
    path = write_run(tmp_path / "with_records", run.devices, run.samples, m, pd.DataFrame(rows))
    inputs = load_inputs(path)
    calls = inputs.collectives
    assert inputs.collective_source == "inspector" and len(calls) == 24
    assert set(calls["world"]) == {2} and set(calls["size"]) == {14e9}
    reduce = calls[calls["collective"] == "all_reduce"]
    assert reduce["seconds"].to_numpy() == pytest.approx(25 * MS, abs=0.1 * MS)
    assert sorted(set(calls["step"])) == list(range(1, 13))


@pytest.mark.hazard(item=3, input="chopper predict of a run with two jobs and no --job",
                    promise="refused, naming the jobs and --job")
def test_several_jobs_need_a_job(exposed: Path, tmp_path: Path, hazard) -> None:
    run = read_run(exposed)
    other = run.markers.assign(job="other", rank=run.markers["rank"] + 2)
    path = write_run(tmp_path / "two_jobs", run.devices, run.samples, pd.concat([run.markers, other]))
    with pytest.raises(PredictInputError, match="holds 2 jobs") as refused:
        load_inputs(path)
    assert load_inputs(path, job="other").job == "other"
    hazard.outcome = str(refused.value)
