"""A rank's position from the marker state the agent builds from real marker batches."""
from __future__ import annotations

from agent.markers import MarkerIngest
from agent.positions import innermost, position
from chopper.positions import where
from chopper.proto.chopper.v1 import agent_pb2 as pb

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
K = pb


def _ingest(*markers: tuple[int, int, int, str]) -> MarkerIngest:
    """One batch of rank 3 of job "j" on GPU 0: (kind, step, ms after T0, name) each."""
    ingest = MarkerIngest("n1", gpu_count=1)
    batch = pb.MarkerBatch(job="j", rank=3, gpu=0, seq=1, pid=7, markers=[
        pb.Marker(kind=kind, step=step, ts_ns=T0 + ms * MS, name=name) for kind, step, ms, name in markers])
    result = ingest.ingest(batch, T0)
    assert not result.rejected, result.errors
    return ingest


def test_inside_a_collective_begun_after_its_phase() -> None:
    ingest = _ingest(
        (K.MARKER_KIND_STEP_BEGIN, 5, 0, ""),
        (K.MARKER_KIND_PHASE_BEGIN, 5, 1, "forward"), (K.MARKER_KIND_PHASE_END, 5, 9, "forward"),
        (K.MARKER_KIND_PHASE_BEGIN, 5, 10, "backward"),
        (K.MARKER_KIND_COLLECTIVE_BEGIN, 5, 12, "all_reduce"),
    )
    p = position("j", "n1", 3, ingest.ranks[("j", 3)], last_marker_ns=T0 + 13 * MS, as_of_ns=T0 + 20 * MS)
    assert (p.job, p.node, p.rank, p.gpu, p.step, p.step_begin_ns) == ("j", "n1", 3, 0, 5, T0)
    assert (p.phase, p.phase_begin_ns) == ("backward", T0 + 10 * MS)
    assert (p.collective, p.collective_begin_ns) == ("all_reduce", T0 + 12 * MS)
    assert (p.last_marker_ns, p.as_of_ns, p.last_step) == (T0 + 13 * MS, T0 + 20 * MS, -1)
    w = where(p)
    assert (w.kind, w.name, w.step, w.since_ns) == ("collective", "all_reduce", 5, T0 + 12 * MS)
    assert w.seconds(p.as_of_ns) == 0.008


def test_ended_collective_leaves_the_phase_innermost() -> None:
    ingest = _ingest(
        (K.MARKER_KIND_STEP_BEGIN, 5, 0, ""), (K.MARKER_KIND_PHASE_BEGIN, 5, 1, "backward"),
        (K.MARKER_KIND_COLLECTIVE_BEGIN, 5, 2, "all_reduce"), (K.MARKER_KIND_COLLECTIVE_END, 5, 3, "all_reduce"),
    )
    p = position("j", "n1", 3, ingest.ranks[("j", 3)], 0, T0)
    assert (p.phase, p.collective) == ("backward", "")
    assert where(p).kind == "phase"


def test_between_steps_after_the_last_step() -> None:
    ingest = _ingest((K.MARKER_KIND_STEP_BEGIN, 5, 0, ""), (K.MARKER_KIND_STEP_END, 5, 4, ""))
    p = position("j", "n1", 3, ingest.ranks[("j", 3)], last_marker_ns=T0 + 4 * MS, as_of_ns=T0 + 1004 * MS)
    assert (p.step, p.step_begin_ns, p.phase, p.collective, p.last_step) == (-1, 0, "", "", 5)
    w = where(p)
    assert (w.kind, w.step, w.seconds(p.as_of_ns)) == ("between_steps", 5, 1.0)


def test_innermost_is_the_latest_begun_of_any_name_and_repeat() -> None:
    from collections import deque
    table = {"a": deque([(1, 10), (1, 40)]), "b": deque([(1, 30)])}
    assert innermost(table) == ("a", 40)
    assert innermost({}) == ("", 0)


def _agent(now: list[int]):  # type: ignore[no-untyped-def]
    from agent.backends.simulated import SimulatedBackend
    from agent.config import load_settings
    from agent.daemon import Agent

    settings = load_settings(["--node", "n1", "--backend", "simulated", "--sim-gpus", "2"], env={})
    agent = Agent(settings, SimulatedBackend(settings.node, gpus=2), realtime_ns=lambda: now[0])
    agent.open_backend()
    return agent


def _push(agent, rank: int, *markers: tuple[int, int, int, str]) -> None:  # type: ignore[no-untyped-def]
    batch = pb.MarkerBatch(job="j", rank=rank, gpu=rank, seq=1, pid=100 + rank, markers=[
        pb.Marker(kind=kind, step=step, ts_ns=T0 + ms * MS, name=name) for kind, step, ms, name in markers])
    assert not agent.push_markers(batch).rejected


def test_metrics_say_where_each_rank_is_one_series_per_rank() -> None:
    from agent.metrics import AgentCollector
    from tests.support.scrape import scrape

    now = [T0 + 1000 * MS]
    agent = _agent(now)
    _push(agent, 0, (K.MARKER_KIND_STEP_BEGIN, 7, 0, ""), (K.MARKER_KIND_PHASE_BEGIN, 7, 1, "backward"),
          (K.MARKER_KIND_PHASE_END, 7, 2, "backward"), (K.MARKER_KIND_COLLECTIVE_BEGIN, 7, 3, "all_reduce"))
    _push(agent, 1, (K.MARKER_KIND_STEP_BEGIN, 7, 0, ""), (K.MARKER_KIND_PHASE_BEGIN, 7, 1, "backward"))
    collector = AgentCollector(agent.view)
    now[0] = T0 + 121_001 * MS
    m = scrape(collector)
    rl = {"node": "n1", "training_job": "j"}
    assert m["chopper_rank_open_step"] == {
        tuple(sorted({**rl, "rank": str(r), "gpu": str(r)}.items())): 7.0 for r in (0, 1)}
    assert m["chopper_rank_position_seconds"] == {
        tuple(sorted({**rl, "rank": "0", "gpu": "0", "kind": "collective", "name": "all_reduce"}.items())): 120.998,
        tuple(sorted({**rl, "rank": "1", "gpu": "1", "kind": "phase", "name": "backward"}.items())): 121.0,
    }
    # The step ends: no open step series, and the rank is between steps since its last batch.
    _push(agent, 1, (K.MARKER_KIND_PHASE_END, 7, 2, "backward"), (K.MARKER_KIND_STEP_END, 7, 5, ""))
    now[0] += 2 * 10**9
    m = scrape(collector)
    assert {dict(k)["rank"] for k in m["chopper_rank_open_step"]} == {"0"}
    between = {dict(k)["rank"]: (dict(k)["kind"], v) for k, v in m["chopper_rank_position_seconds"].items()}
    assert between["1"] == ("between_steps", 2.0)


def test_names_beyond_the_cap_read_other() -> None:
    from agent.positions import NameLabels

    labels = NameLabels(limit=2)
    assert [labels.label(n) for n in ("a", "b", "c", "a", "", "c")] == ["a", "b", "other", "a", "", "other"]
