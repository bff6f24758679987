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

import threading
from collections import deque

from agent.markers import RankState
from chopper.attribution.phases import OTHER
from chopper.proto.chopper.v1 import agent_pb2 as pb

# Phase and collective names with a ``name`` label of their own on ``chopper_rank_position_seconds``;
# later names read ``OTHER``, so a client that invents names cannot grow the series without bound.
MAX_POSITION_NAMES = 64


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


class NameLabels:
    """The ``name`` label of a position: the first ``limit`` distinct names keep theirs, later ones are ``OTHER``.

    Shared by every scrape of one agent (each may run on its own thread), so a name keeps its label
    for the agent's life.
    """

    def __init__(self, limit: int = MAX_POSITION_NAMES) -> None:
        self.limit = limit
        self._names: set[str] = set()
        self._lock = threading.Lock()

    def label(self, name: str) -> str:
        if not name:
            return name
        with self._lock:
            if name in self._names:
                return name
            if len(self._names) < self.limit:
                self._names.add(name)
                return name
        return OTHER
