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
