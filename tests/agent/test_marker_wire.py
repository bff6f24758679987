"""Marker rows in wire form: byte for byte what protobuf writes, and the same account on either ingest path."""
from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.marker_wire import marker_bytes, marker_message, message_row, record_bytes
from agent.markers import MarkerIngest
from chopper.proto.chopper.v1 import agent_pb2 as pb
from tests.support.markers import marker_columns

INT64 = st.integers(-(2**63), 2**63 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
NOW = 1_800_000_000_000_000_000
# Timestamps of this century (the 28-bit split of marker_wire), and any int64 (the general varint).
STAMPS = st.one_of(st.integers(NOW - 10**15, NOW + 10**15), INT64)
ROWS = st.tuples(STAMPS, INT32, INT64, st.text(max_size=40), st.floats(allow_nan=False) | st.just(-0.0),
                 INT64, INT64, INT32)


@settings(max_examples=400, deadline=None)
@given(st.lists(ROWS, max_size=20))
def test_rows_encode_as_protobuf_encodes_the_same_marker(rows: list) -> None:
    assert marker_bytes(rows) == [marker_message(r).SerializeToString() for r in rows]
    prefix = pb.MarkerRecord(job="j", node="n", rank=3, gpu=-1).SerializeToString()
    assert record_bytes(prefix, rows) == [
        pb.MarkerRecord(job="j", node="n", rank=3, gpu=-1, marker=marker_message(r)).SerializeToString() for r in rows]
    assert [message_row(marker_message(r)) for r in rows] == rows


def test_negative_zero_flops_is_kept_as_protobuf_keeps_it() -> None:
    row = (NOW, pb.MARKER_KIND_STEP_END, 1, "", -0.0, 0, 0, 0)
    assert marker_bytes([row]) == [pb.Marker(kind=pb.MARKER_KIND_STEP_END, step=1, ts_ns=NOW, flops=-0.0)
                                   .SerializeToString()]
    assert math.copysign(1.0, pb.Marker.FromString(marker_bytes([row])[0]).flops) < 0


KINDS = st.sampled_from([pb.MARKER_KIND_STEP_BEGIN, pb.MARKER_KIND_STEP_END, pb.MARKER_KIND_PHASE_BEGIN,
                         pb.MARKER_KIND_PHASE_END, pb.MARKER_KIND_COLLECTIVE_BEGIN, pb.MARKER_KIND_COLLECTIVE_END,
                         0, 99])  # and two kinds no agent knows
MARKERS = st.builds(
    lambda kind, step, dt, name, flops, tokens, nbytes: pb.Marker(
        kind=kind, step=step, ts_ns=NOW + dt, name=name, flops=flops, tokens=tokens, bytes=nbytes),
    KINDS, st.integers(-1, 3), st.one_of(st.integers(0, 10**9), st.just(10**18)),
    st.sampled_from(["", "forward", "all_reduce", "bad\x00name", "x" * 300]),
    st.sampled_from([0.0, 1e12, -1.0, math.nan, math.inf]), st.sampled_from([0, 256, -1]),
    st.sampled_from([0, 1 << 20, -5]))


@settings(max_examples=300, deadline=None)
@given(st.lists(MARKERS, max_size=24))
def test_a_batch_checked_whole_is_accounted_as_marker_by_marker(markers: list[pb.Marker]) -> None:
    """The whole-batch check only chooses the path: what is kept, refused, dropped and closed is the same."""
    whole = MarkerIngest("n1", 8)
    each = MarkerIngest("n1", 8)
    each._passes_whole = lambda rows, now_ns: False  # type: ignore[method-assign]  # every batch marker by marker
    accounts: dict[str, list[tuple]] = {"whole": [], "each": []}
    for path, ingest in (("whole", whole), ("each", each)):
        for form in ("messages", "columns"):  # the second batch goes on from the first's state
            batch = pb.MarkerBatch(job="j", rank=1, gpu=1, seq=1, pid=9)
            if form == "messages":
                batch.markers.extend(markers)
            else:
                batch.columns.CopyFrom(marker_columns(markers))
            result = ingest.ingest(batch, NOW)
            accounts[path].append((result.accepted, dict(result.rejected), result.errors, result.closed_steps,
                                   dict(result.dropped_fields), result.field_problems, result.encoded_records()))
    assert accounts["whole"] == accounts["each"]
    assert whole.ranks[("j", 1)].received == each.ranks[("j", 1)].received
