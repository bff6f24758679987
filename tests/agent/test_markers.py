"""Marker validation: every malformed marker or field refused alone with a reason, the rest of its batch kept."""
from __future__ import annotations

import math

import pytest

from agent.backends.simulated import SimulatedBackend
from agent.markers import UNKNOWN_DEVICE, MarkerIngest
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.hazards import HazardOutcome
from tests.support.markers import marker_columns

NOW = 1_800_000_000 * 10**9


def marker(kind: int, step: int, ts: int, name: str = "", **kw: float) -> pb.Marker:
    return pb.Marker(kind=kind, step=step, ts_ns=NOW + ts, name=name, clock=pb.CLOCK_SOURCE_CPU, **kw)


def batch(*markers: pb.Marker, job: str = "j", rank: int = 0, gpu: int = 0, seq: int = 1, pid: int = 7,
          dropped: int = 0, uuid: str = "") -> pb.MarkerBatch:
    return pb.MarkerBatch(job=job, rank=rank, gpu=gpu, seq=seq, pid=pid, markers=markers, client_dropped_total=dropped,
                          device_uuid=uuid)


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
    records = result.records()
    assert records[0].node == "n1" and records[0].job == "j" and records[0].marker == result.markers()[0]
    # The wire form built from the batch's header is the records' own encoding.
    assert result.encoded_records() == [r.SerializeToString() for r in records]
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
    assert ingest.ingest(batch(*full_step(0, 0), job=""), NOW).rejected == {"bad_job": 6}
    assert ingest.ingest(batch(*full_step(0, 0), rank=-1), NOW).rejected == {"bad_rank": 6}


# -- device identity (docs/IDENTITY.md): the agent's devices are the simulated backend's, as the daemon sets them


@pytest.fixture
def node() -> MarkerIngest:
    devices = SimulatedBackend("n1", gpus=8).open()
    return MarkerIngest("n1", len(devices), {d.uuid: d.gpu for d in devices})


def test_a_device_uuid_of_this_node_names_the_gpu_in_any_spelling(node: MarkerIngest) -> None:
    sim5 = next(u for u, gpu in node.device_uuids.items() if gpu == 5)
    for rank, spelling in enumerate((sim5, sim5.lower(), sim5.upper(), sim5[:12])):
        result = node.ingest(batch(*full_step(0, 0), rank=rank, gpu=-1, uuid=spelling), NOW)
        assert (result.gpu, result.closed_steps[0].gpu, result.closed_steps[0].flags) == (5, 5, ())
        assert {r.gpu for r in result.records()} == {5} and not result.warnings


def test_nvml_and_torch_spellings_of_one_uuid_match() -> None:
    ingest = MarkerIngest("n1", 2, {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6": 1,
                                    "GPU-aaaa0000-0000-0000-0000-000000000000": 0})
    # torch's get_device_properties().uuid prints without NVML's "GPU-" prefix
    result = ingest.ingest(batch(*full_step(0, 0), gpu=-1, uuid="8932f937-d72c-4106-c12f-20bd9faed9f6"), NOW)
    assert result.gpu == 1 and not result.closed_steps[0].flags
    # a MIG instance is never its parent GPU
    mig = ingest.ingest(batch(*full_step(0, 0), rank=1, gpu=-1, uuid="MIG-8932f937-d72c-4106-c12f-20bd9faed9f6"), NOW)
    assert mig.gpu == -1 and mig.closed_steps[0].flags == (UNKNOWN_DEVICE,)


def test_the_uuid_wins_over_a_disagreeing_index_and_says_why_once(node: MarkerIngest) -> None:
    sim3 = next(u for u, gpu in node.device_uuids.items() if gpu == 3)
    first = node.ingest(batch(*full_step(0, 0), gpu=1, uuid=sim3), NOW)
    assert first.gpu == 3 and first.closed_steps[0].gpu == 3 and first.closed_steps[0].flags == ()
    (warning,) = first.warnings
    assert "is GPU 3 of this node, but its environment gave GPU 1; using GPU 3" in warning
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in warning
    assert not node.ingest(batch(*full_step(1, 100), gpu=1, uuid=sim3, seq=2), NOW).warnings


def test_a_uuid_this_node_does_not_have_is_flagged_never_another_gpu(node: MarkerIngest) -> None:
    other = SimulatedBackend("another-node", gpus=8).open()[5].uuid
    first = node.ingest(batch(*full_step(0, 0), gpu=5, uuid=other), NOW)
    assert not first.rejected and len(first.accepted) == 6  # training's markers are kept
    assert (first.gpu, first.closed_steps[0].gpu, first.closed_steps[0].flags) == (-1, -1, (UNKNOWN_DEVICE,))
    assert {r.gpu for r in first.records()} == {-1}
    (warning,) = first.warnings
    assert f"job 'j' rank 0 drives device {other!r}, which is not a GPU of node 'n1' (8 GPUs" in warning
    assert "set CHOPPER_GPU" in warning and "CUDA_VISIBLE_DEVICES" not in warning.split(";")[0]
    second = node.ingest(batch(*full_step(1, 100), gpu=5, uuid=other, seq=2), NOW)
    assert second.closed_steps[0].flags == (UNKNOWN_DEVICE,) and not second.warnings  # warned once per rank


def test_an_index_beyond_this_node_is_flagged_not_rejected(node: MarkerIngest) -> None:
    result = node.ingest(batch(*full_step(0, 0), gpu=9), NOW)
    assert not result.rejected and result.closed_steps[0].flags == (UNKNOWN_DEVICE,) and result.gpu == -1
    assert "names GPU 9, but node 'n1' has GPUs 0..7" in result.warnings[0]


def test_a_device_the_client_could_not_resolve_is_flagged_with_its_reason(node: MarkerIngest) -> None:
    why = "ordinal 3 (LOCAL_RANK=3) is beyond the 2 devices of CUDA_VISIBLE_DEVICES='4,5'"
    result = node.ingest(batch(*full_step(0, 0), gpu=-1, uuid="unresolved:" + why), NOW)
    assert result.closed_steps[0].flags == (UNKNOWN_DEVICE,) and result.gpu == -1
    assert f"cannot tell which GPU it drives ({why})" in result.warnings[0]


def test_an_old_client_without_uuid_keeps_its_index(node: MarkerIngest) -> None:
    result = node.ingest(batch(*full_step(0, 0), gpu=6), NOW)
    assert (result.gpu, result.closed_steps[0].flags, result.warnings) == (6, (), [])
    assert node.ingest(batch(*full_step(0, 0), rank=1, gpu=-1), NOW).closed_steps[0].flags == ()


def test_garbled_fields_rejected_one_by_one() -> None:
    result = MarkerIngest("n1", 1).ingest(
        batch(
            pb.Marker(kind=99, step=1, ts_ns=NOW),
            marker(pb.MARKER_KIND_STEP_BEGIN, -1, 0),
            pb.Marker(kind=pb.MARKER_KIND_STEP_BEGIN, step=1, ts_ns=5),
            marker(pb.MARKER_KIND_PHASE_BEGIN, 1, 0, ""),
            marker(pb.MARKER_KIND_PHASE_END, 1, 0, "backward"),
            marker(pb.MARKER_KIND_PHASE_BEGIN, 1, 0, "x" * 257),
        ),
        NOW,
    )
    assert result.rejected == {
        "bad_kind": 1, "bad_step": 1, "bad_timestamp": 1, "bad_name": 2, "end_without_begin": 1,
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


def test_senders_of_a_rank_are_bounded_and_their_drops_never_uncounted() -> None:
    """A rank restarted thousands of times (or a client inventing pids) keeps a bounded table."""
    from agent.markers import MAX_SENDERS_PER_RANK

    ingest = MarkerIngest("n1", 1)
    senders = 10 * MAX_SENDERS_PER_RANK
    for pid in range(1, senders + 1):
        ingest.ingest(batch(seq=1, pid=pid, dropped=1), NOW)
    ingest.ingest(batch(seq=3, pid=senders, dropped=2), NOW)  # the newest sender: its gap is still seen
    state = ingest.ranks[("j", 0)]
    assert len(state.last_seq) == len(state.client_dropped) == MAX_SENDERS_PER_RANK
    assert state.client_dropped_total == senders + 1  # every sender's drops, the forgotten ones too
    assert state.batches_lost == 1


def test_new_step_while_open_abandons_the_old_one() -> None:
    ingest = MarkerIngest("n1", 1)
    result = ingest.ingest(
        batch(marker(pb.MARKER_KIND_STEP_BEGIN, 1, 0), *full_step(2, 10)), NOW,
    )
    assert ingest.ranks[("j", 0)].steps_abandoned == 1
    assert [c.step for c in result.closed_steps] == [2]


@pytest.mark.hazard(item=11, input="step_end with NaN, inf or negative FLOPs, negative tokens; a collective with "
                                   "negative bytes; a step marker with a 300-character name",
                    promise="the bad field is dropped and counted, the marker and its step kept, the step flagged")
def test_a_bad_field_costs_the_field_never_the_step(hazard: HazardOutcome) -> None:
    ingest = MarkerIngest("n1", gpu_count=1)
    bad_flops = [math.nan, math.inf, -1.0]
    markers = []
    for step, flops in enumerate(bad_flops):
        markers += [marker(pb.MARKER_KIND_STEP_BEGIN, step, 100 * step),
                    marker(pb.MARKER_KIND_STEP_END, step, 100 * step + 50, flops=flops, tokens=512)]
    steps = full_step(3, 300)
    steps[3].bytes = steps[4].bytes = -8  # the collective's begin and end
    steps[5].tokens = -1
    steps[0].name = "s" * 300
    result = ingest.ingest(batch(*markers, *steps), NOW)
    assert not result.rejected and len(result.accepted) == 12
    assert [(c.step, c.flops, c.tokens, c.flags) for c in result.closed_steps] == [
        (0, 0.0, 512, ("bad_flops",)), (1, 0.0, 512, ("bad_flops",)), (2, 0.0, 512, ("bad_flops",)),
        (3, 6e9, 0, ("bad_bytes", "bad_tokens")),
    ]
    stored = result.markers()
    assert all(0 <= m.flops < math.inf and m.tokens >= 0 and m.bytes >= 0 and len(m.name) <= 256 for m in stored)
    assert result.dropped_fields == {"flops": 3, "bytes": 2, "tokens": 1, "name": 1}
    assert "flops=nan; flops must be a finite number >= 0" in result.field_problems[0]
    assert "flagged bad_flops" in result.field_problems[0] and "flagged bad_bytes" in " ".join(result.field_problems)
    hazard.outcome = (f"{len(result.accepted)} of 12 markers kept, 0 rejected; 4 steps closed and flagged "
                      f"({', '.join(f'step {c.step}: {c.flags}' for c in result.closed_steps)}); fields dropped "
                      f"{dict(result.dropped_fields)}")


def test_a_field_dropped_from_a_marker_that_is_then_rejected_flags_nothing() -> None:
    ingest = MarkerIngest("n1", gpu_count=1)
    result = ingest.ingest(batch(marker(pb.MARKER_KIND_STEP_END, 9, 0, flops=math.nan)), NOW)
    assert result.rejected == {"step_never_began": 1} and not result.dropped_fields


def test_a_gpu_index_below_minus_one_is_flagged_not_rejected(node: MarkerIngest) -> None:
    result = node.ingest(batch(*full_step(0, 0), gpu=-2), NOW)
    assert not result.rejected and len(result.accepted) == 6
    assert result.closed_steps[0].gpu == -1 and result.closed_steps[0].flags == (UNKNOWN_DEVICE,)
    assert "names GPU -2" in result.warnings[0]


def test_encoded_records_equal_the_records_encoding_at_every_length() -> None:
    # A marker longer than 127 bytes takes a two-byte length on the wire.
    ingest = MarkerIngest("n1", gpu_count=8)
    markers = [marker(pb.MARKER_KIND_STEP_BEGIN, 1, 100)]
    markers += [marker(pb.MARKER_KIND_PHASE_BEGIN, 1, 101 + i, "p" * n) for i, n in enumerate((1, 60, 120, 250))]
    result = ingest.ingest(batch(*markers), NOW)
    assert len(result.accepted) == 5 and max(m.ByteSize() for m in result.markers()) > 127
    assert result.encoded_records() == [r.SerializeToString() for r in result.records()]


def test_a_batch_in_columns_is_ingested_as_the_same_markers_as_messages() -> None:
    steps = full_step(3, 100) + full_step(4, 200)
    as_messages = MarkerIngest("n1", 8).ingest(batch(*steps), NOW)
    sparse = batch()
    sparse.columns.CopyFrom(marker_columns(steps))
    assert not sparse.columns.clock  # empty: every marker's clock is the CPU's
    full = batch()
    full.columns.CopyFrom(sparse.columns)
    full.columns.clock.extend(m.clock for m in steps)
    for form in (full, sparse):
        result = MarkerIngest("n1", 8).ingest(form, NOW)
        assert result.accepted == as_messages.accepted and result.closed_steps == as_messages.closed_steps
        assert result.encoded_records() == as_messages.encoded_records()
    both = batch(*steps[:6])  # messages first, then columns: one batch's order
    both.columns.CopyFrom(marker_columns(steps[6:]))
    assert MarkerIngest("n1", 8).ingest(both, NOW).accepted == as_messages.accepted


@pytest.mark.parametrize("garble", [
    lambda c: c.step.pop(),  # a column shorter than ts_ns
    lambda c: c.flops.pop(),  # an optional column neither full nor empty
    lambda c: c.name.__setitem__(0, 9),  # a name index beyond the names
])
def test_columns_that_do_not_line_up_reject_the_batch_with_the_fix(garble: object) -> None:
    b = batch()
    b.columns.CopyFrom(marker_columns(full_step(3, 100)))
    garble(b.columns)  # type: ignore[operator]
    result = MarkerIngest("n1", 8).ingest(b, NOW)
    assert result.rejected == {"bad_columns": 6} and not result.accepted
    assert "send every column with one entry per marker" in result.errors[0]
