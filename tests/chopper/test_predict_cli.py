"""``chopper predict`` on real recorded runs (an agent process, real 2- and 3-rank gloo training,
``chopper record``), text and JSON, checked against the trainers' own step clocks; and its refusals
of bad input."""
from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from chopper.cli import main
from chopper.demo.run import metric_sum
from chopper.predict import PredictInputError, PredictionRefused, load_inputs, predict
from chopper.runs.record import record
from chopper.runs.rundir import read_run, write_run
from tests.support.attribution_scenarios import ALL_SCENARIOS
from tests.support.daemons import AgentProcess
from tests.support.polling import wait_until
from tests.support.training import finish_training, start_training

RANKS = (2, 3)
# Loopback all-reduces of 2 and 3 CPU ranks on a shared 2-core machine differ by scheduling noise more
# than by their volumes, so a free α can come out anywhere (even with β < 0, which is refused): these
# tests fix it, and test_one_run_is_refused_until_alpha_is_fixed checks the free fit's refusal.
FIXED_ALPHA = ["--latency-us", "10"]


def _record_training(agent: AgentProcess, out: Path, ranks: int) -> float:
    """Record a real ``ranks``-rank gloo job into ``out``; the trainers' own median step seconds (mean
    over ranks): the statistic predict keeps, which a few steps slowed by a loaded machine do not move."""
    summaries = metric_sum(agent.metrics(), "chopper_agent_step_summaries_total")
    stop = threading.Event()
    recorder = threading.Thread(target=record, args=(agent.target, out, None, time.time_ns(), stop))
    recorder.start()
    sent = finish_training(start_training(agent.target, ranks=ranks, duration_s=4.0))
    steps = sum(n["steps"] for n in sent.values())
    # Every step summarised means a sample after the last step end reached the recorder's stream.
    wait_until(lambda: metric_sum(agent.metrics(), "chopper_agent_step_summaries_total") >= summaries + steps,
               timeout_s=60)
    time.sleep(1.0)
    stop.set()
    recorder.join(30)
    return statistics.mean(n["median_step_s"] for n in sent.values())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, tuple[Path, float]]]:
    work = tmp_path_factory.mktemp("predict")
    agent = AgentProcess(work).start()
    try:
        yield {n: (work / f"run{n}", _record_training(agent, work / f"run{n}", n)) for n in RANKS}
    finally:
        agent.terminate()


@pytest.mark.slow
def test_json_on_real_runs_matches_the_trainers_clocks(runs: dict[int, tuple[Path, float]],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(runs[n][0]) for n in RANKS]
    for n in RANKS:
        assert main(["predict", *paths, "--world-size", str(n), *FIXED_ALPHA, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        fit = next(f for f in out["fits"] if f["collective"] == "all_reduce")
        assert fit["pairs"] >= 4 and fit["world_sizes"] == [2, 3] and fit["rms_rel"] >= 0
        assert [i["world_size"] for i in out["inputs"]] == list(RANKS)
        assert {i["collective_source"] for i in out["inputs"]} == {"markers"}
        p = out["prediction"]
        # The demo's all_reduce runs outside every phase: all of it is exposed.
        assert p["exposed_share"] == pytest.approx(1.0, abs=0.05)
        assert p["step_time_s"] == pytest.approx(p["noncomm_s"] + p["exposed_comm_s"], rel=1e-9)
        # The trainers timed their steps with perf_counter, no markers: the prediction at a size
        # that was run is within 25% of that (4 s of steps on a shared 2-core machine).
        measured = runs[n][1]
        assert p["step_time_s"] == pytest.approx(measured, rel=0.25), (n, p, measured)
        assert p["tokens_per_s"] == pytest.approx(n * 1024 / p["step_time_s"], rel=1e-9)
    # More ranks, the same gradient bytes: the ring all-reduce's 2(n-1)/n grows, so must its time.
    assert main(["predict", *paths, "--world-size", "8", *FIXED_ALPHA, "--json"]) == 0
    at8 = json.loads(capsys.readouterr().out)["prediction"]
    assert at8["comm_s"] > p["comm_s"]


@pytest.mark.slow
def test_text_prints_fits_residuals_and_the_step(runs: dict[int, tuple[Path, float]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", *(str(runs[n][0]) for n in RANKS), "--world-size", "6", "--parallelism", "zero3",
                 *FIXED_ALPHA]) == 0
    text = capsys.readouterr().out
    assert "fits (t = α·L + β·V):" in text and "RMS" in text and "N 2–3" in text and "α 10.0 µs fixed" in text
    assert "prediction at N=6" in text and "zero3" in text and "step time" in text
    # ZeRO-3's step: two all-gathers of the parameters and one reduce-scatter of the gradients.
    assert "2 × all_gather of" in text and "1 × reduce_scatter of" in text
    assert "all_gather: no fit of its own (never observed); the all_reduce fit is used by bus bytes" in text


@pytest.mark.slow
@pytest.mark.hazard(item=3, input="one real 2-rank run: one all-reduce size at one world size",
                    promise="refused (exit 3) as not identifiable, naming --latency-us; predicted once α is fixed")
def test_one_run_is_refused_until_alpha_is_fixed(runs: dict[int, tuple[Path, float]], hazard,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    run = str(runs[2][0])
    assert main(["predict", run, "--world-size", "4"]) == 3
    err = capsys.readouterr().err
    assert "β is not identifiable" in err and "--latency-us" in err
    assert main(["predict", run, "--world-size", "4", "--latency-us", "50", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fits"][0]
    assert fit["alpha_fixed"] and fit["alpha_s"] == pytest.approx(50e-6)
    hazard.outcome = f"exit 3: {err.strip()[:100]}...; with --latency-us 50 a fit of {fit['pairs']} pairs"


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ALL_SCENARIOS["clean"]().write(tmp_path_factory.mktemp("clean") / "run")


@pytest.fixture(scope="module")
def no_collectives(clean: Path) -> Path:
    """A run whose job marks steps and phases but no collective."""
    run = read_run(clean)
    markers = run.markers[~run.markers["kind"].str.startswith("collective")]
    return write_run(clean.parent / "no_collectives", run.devices, run.samples, markers)


@pytest.fixture(scope="module")
def no_steps(clean: Path) -> Path:
    """A run whose steps never end (every step_end lost)."""
    run = read_run(clean)
    markers = run.markers[run.markers["kind"] != "step_end"]
    return write_run(clean.parent / "no_steps", run.devices, run.samples, markers)


@pytest.mark.hazard(item=3, input="chopper predict of a missing path, a run without collectives, a run without a "
                                  "complete step, --world-size 0, two --run-bandwidth for one input, a run "
                                  "bandwidth of -1",
                    promise="exit 2 (3 for the run that cannot support a fit) with a message naming the problem")
@pytest.mark.parametrize(("args", "code", "message"), [
    (["/nonexistent/run", "--world-size", "4"], 2, "does not exist; pass a recorded run directory"),
    (["{run}", "--world-size", "4"], 3, "no input has timed collectives"),
    (["{no_steps}", "--world-size", "4"], 2, "no complete step (no step_begin/step_end pair)"),
    (["{run}", "--world-size", "0"], 2, "--world-size must be at least 1"),
    (["{run}", "--world-size", "2", "--run-bandwidth", "1", "--run-bandwidth", "2"], 2, "2 --run-bandwidth for 1"),
    (["{run}", "--world-size", "2", "--run-bandwidth", "-1"], 2, "must be a positive number of GB/s"),
])
def test_bad_input_exits_with_a_message(args: list[str], code: int, message: str, no_collectives: Path,
                                        no_steps: Path, hazard, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", *(a.format(run=no_collectives, no_steps=no_steps) for a in args)]
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err, err
    hazard.outcome = f"exit {code}: {err.strip()[:120]}"


def test_api_refuses_mixed_bandwidths_and_empty_input(no_collectives: Path) -> None:
    with pytest.raises(PredictInputError, match="no input"):
        predict([], 2)
    one = load_inputs(no_collectives)
    assert one.world_size == 2 and one.collective_source == "none" and len(one.steps) == 10
    with pytest.raises(PredictionRefused, match="no input has timed collectives"):
        predict([one], 2)
