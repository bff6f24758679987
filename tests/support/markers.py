"""Marker batches as a trainer's client sends them to the agent."""
from __future__ import annotations

import os

from chopper.proto.chopper.v1 import agent_pb2 as pb

BEGIN, END = pb.MARKER_KIND_STEP_BEGIN, pb.MARKER_KIND_STEP_END


def steps_batch(first: int, count: int, t0: int, job: str = "j") -> pb.MarkerBatch:
    """Steps ``first`` .. ``first + count - 1`` of rank 1 on GPU 1, one every 40 ms from ``t0`` (ns).

    Each step is 35 ms: a "forward" phase from 1 ms to 30 ms, and a step end that reports 1e12
    FLOPs and 256 tokens; four markers per step, in one batch (seq 1) from this process.
    """
    markers = []
    for i, step in enumerate(range(first, first + count)):
        t = t0 + i * 40_000_000
        markers += [
            pb.Marker(kind=BEGIN, step=step, ts_ns=t),
            pb.Marker(kind=pb.MARKER_KIND_PHASE_BEGIN, step=step, ts_ns=t + 1_000_000, name="forward"),
            pb.Marker(kind=pb.MARKER_KIND_PHASE_END, step=step, ts_ns=t + 30_000_000, name="forward"),
            pb.Marker(kind=END, step=step, ts_ns=t + 35_000_000, flops=1e12, tokens=256),
        ]
    return pb.MarkerBatch(job=job, rank=1, gpu=1, seq=1, pid=os.getpid(), markers=markers)


def marker_columns(markers: list[pb.Marker]) -> pb.MarkerColumns:
    """``markers`` in column form as ``chopper.Client`` sends them: a column of all zeros left empty."""
    names = list(dict.fromkeys(m.name for m in markers))
    index = {name: i for i, name in enumerate(names)}
    columns = pb.MarkerColumns(ts_ns=[m.ts_ns for m in markers], kind=[m.kind for m in markers],
                               step=[m.step for m in markers], name=[index[m.name] for m in markers], names=names)
    for field in ("flops", "tokens", "bytes"):
        values = [getattr(m, field) for m in markers]
        if any(values):
            getattr(columns, field).extend(values)
    if any(m.clock != pb.CLOCK_SOURCE_CPU for m in markers):  # an empty clock column means CPU
        columns.clock.extend(m.clock for m in markers)
    return columns
