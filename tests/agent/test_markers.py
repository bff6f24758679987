"""Marker validation: every malformed or out-of-order marker rejected with a reason, the rest of its batch kept."""
from __future__ import annotations

from agent.markers import MarkerIngest
from chopper.proto.chopper.v1 import agent_pb2 as pb

NOW = 1_800_000_000 * 10**9


def marker(kind: int, step: int, ts: int, name: str = "", **kw: float) -> pb.Marker:
    return pb.Marker(kind=kind, step=step, ts_ns=NOW + ts, name=name, clock=pb.CLOCK_SOURCE_CPU, **kw)


def batch(*markers: pb.Marker, job: str = "j", rank: int = 0, gpu: int = 0, seq: int = 1, pid: int = 7,
          dropped: int = 0) -> pb.MarkerBatch:
    return pb.MarkerBatch(job=job, rank=rank, gpu=gpu, seq=seq, pid=pid, markers=markers, client_dropped_total=dropped)


def full_step(step: int, t0: int) -> list[pb.Marker]:
    return [
        marker(pb.MARKER_KIND_STEP_BEGIN, step, t0),
        marker(pb.MARKER_KIND_PHASE_BEGIN, step, t0 + 1, "forward"),
        marker(pb.MARKER_KIND_PHASE_END, step, t0 + 10, "forward"),
        marker(pb.MARKER_KIND_COLLECTIVE_BEGIN, step, t0 + 11, "all_reduce", bytes=1024),
        marker(pb.MARKER_KIND_COLLECTIVE_END, step, t0 + 20, "all_reduce", bytes=1024),
        marker(pb.MARKER_KIND_STEP_END, step, t0 + 30, flops=6e9, tokens=512),
    ]


def test_full_step_is_accepted_and_closed() -> None:
    ingest = MarkerIngest("n1", gpu_count=8)
    result = ingest.ingest(batch(*full_step(3, 100)), NOW)
    assert len(result.accepted) == 6 and not result.rejected
    assert result.accepted[0].node == "n1" and result.accepted[0].job == "j"
    (closed,) = result.closed_steps
    assert (closed.step, closed.begin_ns, closed.end_ns) == (3, NOW + 100, NOW + 130)
    assert (closed.flops, closed.tokens, closed.phases, closed.collectives) == (6e9, 512, 1, 1)
    state = ingest.ranks[("j", 0)]
    assert state.last_step == 3 and state.last_step_time_s == 30e-9


def test_step_end_that_never_began_is_rejected_with_fix() -> None:
    result = MarkerIngest("n1", 8).ingest(batch(marker(pb.MARKER_KIND_STEP_END, 5, 0)), NOW)
    assert result.rejected == {"step_never_began": 1}
    assert "step_end for step 5 that never began on this agent; wrap the step in `with chopper.step(5)`" in (
        result.errors[0]
    )
    assert "job 'j' rank 0" in result.errors[0]


def test_bad_header_rejects_whole_batch() -> None:
    ingest = MarkerIngest("n1", 2)
    result = ingest.ingest(batch(*full_step(0, 0), gpu=5), NOW)
    assert result.rejected == {"bad_gpu": 6} and not result.accepted
    assert "names GPU 5, but this node has GPUs 0..1" in result.errors[0]
    assert ingest.ingest(batch(*full_step(0, 0), job=""), NOW).rejected == {"bad_job": 6}


def test_garbled_fields_rejected_one_by_one() -> None:
    result = MarkerIngest("n1", 1).ingest(
        batch(
            pb.Marker(kind=99, step=1, ts_ns=NOW),
            marker(pb.MARKER_KIND_STEP_BEGIN, -1, 0),
            pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=1, ts_ns=5),
            marker(pb.MARKER_KIND_PHASE_BEGIN, 1, 0, ""),
            marker(pb.MARKER_KIND_PHASE_END, 1, 0, "backward"),
            marker(pb.MARKER_KIND_STEP_BEGIN, 1, 0, tokens=-1),
        ),
        NOW,
    )
    assert result.rejected == {
        "bad_kind": 1, "bad_step": 1, "bad_timestamp": 1, "bad_name": 1, "end_without_begin": 1, "bad_payload": 1,
    }
    assert not result.accepted
    expected = "phase_end 'backward' of step 1 without its begin; use `with chopper.phase('backward')`"
    assert expected in " ".join(result.errors)


def test_seq_gaps_and_client_drops_are_tracked_per_sender() -> None:
    ingest = MarkerIngest("n1", 1)
    ingest.ingest(batch(seq=1, pid=1), NOW)
    ingest.ingest(batch(seq=4, pid=1, dropped=10), NOW)  # 2 and 3 never arrived
    ingest.ingest(batch(seq=1, pid=2, dropped=5), NOW)  # a restarted trainer starts again at 1
    state = ingest.ranks[("j", 0)]
    assert state.batches_lost == 2
    assert state.client_dropped_total == 15


def test_new_step_while_open_abandons_the_old_one() -> None:
    ingest = MarkerIngest("n1", 1)
    result = ingest.ingest(
        batch(marker(pb.MARKER_KIND_STEP_BEGIN, 1, 0), *full_step(2, 10)), NOW,
    )
    assert ingest.ranks[("j", 0)].steps_abandoned == 1
    assert [c.step for c in result.closed_steps] == [2]
