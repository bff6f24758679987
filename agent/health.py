"""Per-GPU health: the latest error counters, when they moved, and a health status from them.

The backend reads health at most once per ``health_interval_s`` and attaches the readings to that
tick's samples (``Sample.errors``, ``chopper.schema.ERROR_KINDS``). ``HealthTracker.update`` keeps,
per GPU, the latest value of each counter, keyed ``(kind, window, detail)``, and an event for every
counter or gauge that grew between two readings: ``(after_ns, at_ns, kind, detail, delta)``, the
growth happened in ``(after_ns, at_ns]``. A GPU's first reading is its baseline, not an event.

Status (``status``), for ``chopper_gpu_health_status``, from the events of the last
``STATUS_WINDOW_NS`` and the current states:

- 2 critical: an uncorrected ECC error, an XID of ``CRITICAL_XIDS``, a page retired for a
  double-bit error, a row remapped for an uncorrectable error, or ``remap_failed`` set.
- 1 warning: any other counter moved (corrected or deferred ECC, PCIe replays or NAKs, NVLink
  errors, bad pages, an XID outside ``APPLICATION_XIDS``), a repair pending, or an XGMI error set.
- 0 healthy otherwise. XIDs the driver raises for the application's own faults
  (``APPLICATION_XIDS``: illegal address, MMU fault from a kernel, a stopped app) are counted but
  leave the status alone.

Steps (``moved_between``): a step whose window overlaps an event's interval on its GPU is flagged
``gpu_errors`` with the kinds that moved. Memory: at most ``MAX_EVENTS`` events per GPU (oldest
dropped) and at most ``MAX_XID_CODES`` distinct XID codes per GPU, the rest summed as ``other``.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from chopper.schema import ERROR_KINDS, ErrorCount

STATUS_WINDOW_NS = 600 * 10**9
MAX_EVENTS = 256
MAX_XID_CODES = 32
# XIDs whose NVIDIA resolution is a GPU reset, a node reboot or a support case (NVIDIA's Xid catalog,
# docs.nvidia.com/deploy/xid-errors): double-bit ECC, microcontroller halts, row-remap failure, NVLink
# errors, fallen off the bus, contained/uncontained ECC, GSP errors, unrecovered ECC.
CRITICAL_XIDS = frozenset({"48", "61", "62", "64", "74", "79", "94", "95", "119", "120", "140"})
# XIDs raised for the application's own faults, not the GPU's (catalog bucket RESTART_APP / CHECK_APP):
# graphics engine exception, GPU memory page fault, application stopped, preemptive cleanup.
APPLICATION_XIDS = frozenset({"13", "31", "43", "45"})
HEALTHY, WARNING, CRITICAL = 0, 1, 2
_REPAIR_STATES = ("retirement_pending", "remap_pending", "remap_failed")


@dataclass(frozen=True)
class HealthEvent:
    """A health counter of one GPU that grew between two readings.

    Attributes:
        after_ns: The previous reading's sample time, ns: the growth happened after it.
        at_ns: The reading that saw it, ns.
        kind: ``ERROR_KINDS`` key.
        detail: The counter's split (XID code, RAS block, cause, ...).
        delta: How much it grew (events, pages, rows).
    """

    after_ns: int
    at_ns: int
    kind: str
    detail: str
    delta: float


@dataclass
class GpuHealth:
    """What the tracker holds for one GPU: latest values, their reading time, recent events."""

    values: dict[tuple[str, str, str], ErrorCount] = field(default_factory=dict)
    readings: int = 0
    read_ns: int = 0
    events: deque[HealthEvent] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))


def _severity(e: HealthEvent) -> int:
    """How bad one event is (module docstring): ``HEALTHY``, ``WARNING`` or ``CRITICAL``."""
    if e.kind == "xid":
        if e.detail in APPLICATION_XIDS:
            return HEALTHY
        return CRITICAL if e.detail in CRITICAL_XIDS else WARNING
    if e.kind == "ecc_uncorrected" or (e.kind == "retired_pages" and e.detail == "double_bit") or (
            e.kind == "remapped_rows" and e.detail == "uncorrectable"):
        return CRITICAL
    return WARNING


class HealthTracker:
    """Latest health counters and their growth, per GPU. Not thread-safe: the agent calls it under its
    state lock (the sampler thread updates it, scrapes and step summaries read it)."""

    def __init__(self) -> None:
        self._gpus: dict[int, GpuHealth] = {}

    def update(self, gpu: int, ts_ns: int, errors: tuple[ErrorCount, ...]) -> None:
        """Take one health reading of ``gpu`` at ``ts_ns``; record what grew since the last one."""
        h = self._gpus.setdefault(gpu, GpuHealth())
        first = h.readings == 0
        for e in self._bounded(h, errors):
            key = (e.kind, e.window, e.detail)
            old = h.values.get(key)
            before = old.value if old is not None else 0.0  # a counter new to this reading grew from 0
            if not first and ERROR_KINDS.get(e.kind) in ("counter", "gauge") and e.value > before:
                h.events.append(HealthEvent(h.read_ns, ts_ns, e.kind, e.detail, e.value - before))
            h.values[key] = e
        h.readings += 1
        h.read_ns = ts_ns

    @staticmethod
    def _bounded(h: GpuHealth, errors: tuple[ErrorCount, ...]) -> list[ErrorCount]:
        """``errors`` with XID codes beyond the first ``MAX_XID_CODES`` of this GPU summed as ``other``."""
        known = {k[2] for k in h.values if k[0] == "xid"}
        kept: list[ErrorCount] = []
        other: ErrorCount | None = None
        for e in errors:
            if e.kind == "xid" and e.detail not in known:
                if len(known) < MAX_XID_CODES and e.detail != "other":
                    known.add(e.detail)
                else:
                    other = e._replace(detail="other", value=e.value + (other.value if other else 0.0))
                    continue
            kept.append(e)
        return [*kept, other] if other is not None else kept

    def counters(self, gpu: int) -> tuple[ErrorCount, ...]:
        """The latest value of every counter of ``gpu``, in first-seen order; () before a reading."""
        h = self._gpus.get(gpu)
        return tuple(h.values.values()) if h is not None else ()

    def status(self, gpu: int, now_ns: int) -> int | None:
        """``HEALTHY``, ``WARNING`` or ``CRITICAL`` (module docstring); None before a reading."""
        h = self._gpus.get(gpu)
        if h is None or not h.readings:
            return None
        worst = HEALTHY
        for e in h.events:
            if now_ns - e.at_ns <= STATUS_WINDOW_NS:
                worst = max(worst, _severity(e))
        for (kind, _, _), count in h.values.items():
            if count.value > 0 and kind in _REPAIR_STATES:
                worst = max(worst, CRITICAL if kind == "remap_failed" else WARNING)
            elif count.value > 0 and kind == "xgmi_error":
                worst = max(worst, WARNING)
        return worst

    def moved_between(self, gpu: int, begin_ns: int, end_ns: int) -> tuple[str, ...]:
        """Kinds of ``gpu``'s counters that grew during ``[begin_ns, end_ns]``, sorted; () when none.

        An event counts when its interval ``(after_ns, at_ns]`` overlaps the window: the readings
        cannot say when inside the interval the error happened.
        """
        h = self._gpus.get(gpu)
        if h is None:
            return ()
        return tuple(sorted({e.kind for e in h.events if e.after_ns < end_ns and e.at_ns >= begin_ns}))
