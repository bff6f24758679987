"""Where a rank is now, from the marker state the agent holds: ``RankState`` -> ``chopper.v1.RankPosition``.

Algorithm (``position``), for one ``(job, rank)``:

1. The open step and when it began (``RankState.open_step``); -1 and 0 when none is open.
2. The innermost open phase: of every phase begun and not ended (``RankState.open_phases``, FIFO
   per name of ``(step, begin_ns)``), the one begun last; likewise the innermost collective.
   Ties go to the first name in the table's order (the one begun first). The tables hold at
   most ``agent.markers.MAX_OPEN_INTERVALS`` entries, so this is bounded per rank.
3. ``last_marker_ns`` is when the agent last received markers from the rank (its activity clock),
   ``as_of_ns`` the agent's clock at the read, ``last_step`` the last step the rank finished.

Which of these the rank is *inside* (the later begun of the collective and the phase, else the
step) and the one-line summary over ranks are ``chopper.positions``, shared with the CLI and the
aggregator. Pure: no locks (the caller holds the marker lock), no I/O.
"""
from __future__ import annotations

from collections import deque

from agent.markers import RankState
from chopper.proto.chopper.v1 import agent_pb2 as pb


def innermost(table: dict[str, deque[tuple[int, int]]]) -> tuple[str, int]:
    """The name and begin time (ns) of the interval begun last in an open-interval table; ("", 0) when empty."""
    name, begin_ns = "", 0
    for candidate, opened in table.items():
        for _, began in opened:
            if not name or began > begin_ns:
                name, begin_ns = candidate, began
    return name, begin_ns


def position(job: str, node: str, rank: int, state: RankState, last_marker_ns: int, as_of_ns: int) -> pb.RankPosition:
    """The position of one rank (module docstring)."""
    phase, phase_begin_ns = innermost(state.open_phases)
    collective, collective_begin_ns = innermost(state.open_collectives)
    open_step = state.open_step
    return pb.RankPosition(
        job=job, node=node, rank=rank, gpu=state.gpu,
        step=-1 if open_step is None else open_step.step,
        step_begin_ns=0 if open_step is None else open_step.begin_ns,
        phase=phase, phase_begin_ns=phase_begin_ns, collective=collective, collective_begin_ns=collective_begin_ns,
        last_marker_ns=last_marker_ns, as_of_ns=as_of_ns, last_step=state.last_step,
    )
