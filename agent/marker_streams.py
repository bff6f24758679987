"""What the agent does with a trainer's marker stream, whichever transport carries it.

A stream is a sequence of ``MarkerBatch`` messages from one training process, ended by one
``PushMarkersResponse``: gRPC's ``PushMarkers`` (``agent.server``) and the marker socket
(``agent.marker_socket``) both hand each batch to ``MarkerStreams.take``, which passes it to
``Agent.push_markers`` and adds the outcome to the stream's response. An open stream counts in
``chopper_agent_open_streams{rpc="PushMarkers"}`` on either transport.

Logs are bounded: rejections and dropped fields at most once per ``REJECTION_LOG_INTERVAL_S``,
unknown-device warnings (once per rank each, in ``agent.markers``) ``DEVICE_WARNINGS_PER_PERIOD``
per ``DEVICE_WARNING_PERIOD_S``; the counters on ``/metrics`` keep the totals.
"""
from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from agent.daemon import Agent
from chopper.daemon.logs import LogGate

log = logging.getLogger(__name__)

REJECTION_LOG_INTERVAL_S = 10.0
# Unknown-device warnings (one per rank) let through per period; the rest are counted in the next line.
DEVICE_WARNINGS_PER_PERIOD = 20
DEVICE_WARNING_PERIOD_S = 60.0
# Error texts a stream's response carries at most.
RESPONSE_ERRORS = 8


class LogBudget:
    """Lets ``burst`` log lines through per ``period_s``; those held back are counted for the next one let through.

    Warnings that are once per rank (an unresolved GPU) are once per made-up rank under a flood of
    them: this keeps the log to a bounded rate while the counters on ``/metrics`` keep the totals.
    """

    def __init__(self, burst: int, period_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.period_s = period_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = -math.inf
        self._used = 0
        self._held = 0

    def take(self) -> int | None:
        """None when this line is to be held back; else the number held back since the last line let through."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.period_s:
                self._window_start, self._used = now, 0
            if self._used >= self.burst:
                self._held += 1
                return None
            self._used += 1
            held, self._held = self._held, 0
            return held


class MarkerStreams:
    """The agent's marker streams: each batch taken in, counted in its stream's response; safe from any thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._log_gate = LogGate(REJECTION_LOG_INTERVAL_S)
        self._device_log = LogBudget(DEVICE_WARNINGS_PER_PERIOD, DEVICE_WARNING_PERIOD_S)

    @contextlib.contextmanager
    def open(self) -> Iterator[None]:
        """Count a stream as open for the block."""
        agent = self.agent
        agent.count(agent.open_streams, "PushMarkers")
        try:
            yield
        finally:
            agent.count(agent.open_streams, "PushMarkers", -1)

    def take(self, batch: Any, response: Any) -> None:
        """Take ``batch`` (a ``MarkerBatch``) in; add what became of it to ``response`` (a ``PushMarkersResponse``)."""
        result = self.agent.push_markers(batch)
        for warning in result.warnings:  # each once per rank and problem (agent.markers)
            held = self._device_log.take()
            if held is not None:
                log.warning("event=unknown_device problem=%r held_back=%d", warning, held)
        response.accepted += len(result.accepted)
        rejected = sum(result.rejected.values())
        if rejected:
            response.rejected += rejected
            room = RESPONSE_ERRORS - len(response.errors)
            response.errors.extend(result.errors[: max(0, room)])
            self._log_rejections(result.errors)
        if result.field_problems:
            self._log_field_problems(result.field_problems)

    def _log_rejections(self, errors: list[str]) -> None:
        if errors and self._log_gate.due("rejections"):
            log.warning("event=markers_rejected first=%r", errors[0])

    def _log_field_problems(self, problems: list[str]) -> None:
        if self._log_gate.due("fields"):
            log.warning("event=marker_fields_dropped first=%r note='the markers were kept'", problems[0])
