"""Play a recorded run's samples back on the live clock, as if its GPUs were on this node.

Pacing. The first ``sample(now_ns)`` call anchors the replay: ``start_ns = now_ns`` and
``rec_t0`` = the earliest recorded sample timestamp of the (selected) node. Each call then
returns every recorded sample not yet returned whose offset satisfies
``(rec_ts − rec_t0) / speed ≤ now_ns − start_ns``, re-timestamped to
``ts_ns = start_ns + round((rec_ts − rec_t0) / speed)``, in recorded order. A tick that falls
between two recorded samples returns nothing for that GPU (the recording's own cadence wins over
the sampler's). All other fields, cumulative counters included, are the recorded values.

Identity. Device rows and samples carry this agent's ``node`` (not the recorded one) and the
recorded ``gpu`` indices, vendor, model and UUIDs: the trainers' markers arriving at this agent
name this node, and step alignment joins markers and samples on ``(node, gpu)``. A run recorded
on several nodes needs ``recorded_node`` to choose one.

End of run. Without ``loop`` every later call returns ``[]`` and ``finished`` turns True. With
``loop`` the run restarts one recorded sample interval after its last sample, and cumulative
counters continue from where they were (each cycle adds the recorded span ``last − first``
per GPU), so consumers that difference counters never see them go backwards. Cycles that ended
before the current one began are skipped, not emitted, so one call returns at most the rest of
the cycle it was in and the due part of the current one (a stalled sampler, or a recording a few
nanoseconds long, cannot make it replay millions).

Links. A run's ``links`` table (``chopper.runs.rundir``) becomes each replayed sample's
``Sample.links``, matched on the sample's recorded ``ts_ns`` and ``gpu``; each link's counters
grow per cycle by that link's own recorded span. A run without the table replays with empty
``links``, and its summed ``link_tx_bytes``/``link_rx_bytes`` as recorded.

Health. A run's ``errors`` table becomes ``Sample.errors`` the same way; counters
(``ERROR_KINDS`` "counter") grow per cycle by their recorded span, gauges and states replay as
recorded.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from agent.backends.base import BackendError, BackendUnavailable
from chopper.runs.rundir import RunDirError, read_run
from chopper.schema import ERROR_KINDS, SAMPLE_COLUMNS, DeviceInfo, ErrorCount, LinkBytes, Sample

if TYPE_CHECKING:
    import pandas as pd

T = TypeVar("T")
# Cumulative sample columns; everything after gpu that is not listed here is an interval mean.
CUMULATIVE_COLUMNS: tuple[str, ...] = (
    "energy_j", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes",
    "throttle_power_s", "throttle_thermal_s", "throttle_current_s", "throttle_other_s",
)
_VALUE_COLUMNS: tuple[str, ...] = SAMPLE_COLUMNS[3:]
# A recording longer than this is not in nanoseconds; it also keeps offsets far from int64 overflow.
MAX_SPAN_NS = 100 * 365 * 24 * 3600 * 10**9


class ReplayBackend:
    """Replays ``samples`` of a recorded run directory (see ``chopper.runs.rundir``).

    Args:
        node: This agent's node name, written into every device row and sample.
        run_dir: Recorded run directory.
        speed: Playback speed; 10 replays ten recorded seconds per live second. Must be > 0.
        loop: Restart at the end instead of finishing.
        recorded_node: Which recorded node to play when the run holds several.

    Attributes:
        finished: True once every recorded sample was returned (never with ``loop``).
        start_ns: The live time the replay was anchored to (first ``sample`` call), or None.

    Raises:
        ValueError: ``speed`` is not a finite number above 0.
    """

    name = "replay"

    def __init__(self, node: str, run_dir: str | Path, speed: float = 1.0, loop: bool = False,
                 recorded_node: str | None = None) -> None:
        if not (isinstance(speed, int | float) and math.isfinite(speed) and speed > 0):
            raise ValueError(f"replay speed must be a finite number above 0 (1 = real time), got {speed!r}")
        self.node, self.run_dir, self.speed, self.loop = node, Path(run_dir), float(speed), loop
        self.recorded_node = recorded_node
        self.finished = False
        self.start_ns: int | None = None
        self._opened = False

    def open(self) -> list[DeviceInfo]:
        """Read and validate the run; return its GPUs under this node's name.

        Raises:
            BackendUnavailable: The run directory is missing or malformed (the message carries the
                ``RunDirError`` that names the problem), holds no samples, or holds several nodes
                and ``recorded_node`` does not pick one of them.
        """
        try:
            run = read_run(self.run_dir)
        except RunDirError as exc:
            raise BackendUnavailable(f"replay: cannot use recorded run: {exc}") from exc
        nodes = sorted(set(run.devices["node"]))
        chosen = self.recorded_node
        if chosen is None:
            if len(nodes) > 1:
                raise BackendUnavailable(f"replay: {self.run_dir} holds nodes {', '.join(nodes)}; "
                                         "set recorded_node to the one to replay")
            chosen = nodes[0] if nodes else None
        elif chosen not in nodes:
            raise BackendUnavailable(f"replay: recorded_node {chosen!r} is not in {self.run_dir} "
                                     f"(it holds {', '.join(nodes) or 'no devices'})")
        devices = run.devices[run.devices["node"] == chosen].sort_values("gpu")
        samples = run.samples[run.samples["node"] == chosen]
        if samples.empty:
            raise BackendUnavailable(f"replay: {self.run_dir} has no samples for node {chosen!r}; "
                                     "nothing to replay")

        ts = samples["ts_ns"].to_numpy(dtype=np.int64)  # read_run sorted by ts_ns
        span = int(ts[-1]) - int(ts[0])  # Python ints: the int64 difference could wrap
        if span > MAX_SPAN_NS:
            raise BackendUnavailable(f"replay: {self.run_dir} samples span {span} ns (over 100 years); ts_ns must be "
                                     "nanoseconds since the epoch, as chopper record writes them")
        self._offsets = ts - ts[0]
        self._gpus = samples["gpu"].to_numpy(dtype=np.int64)
        self._values = samples[list(_VALUE_COLUMNS)].to_numpy(dtype=np.float64)
        self._cum_idx = np.array([_VALUE_COLUMNS.index(c) for c in CUMULATIVE_COLUMNS])
        # Per GPU, how much each cumulative counter grows over one pass through the recording.
        gpu_ids = sorted(set(self._gpus.tolist()))
        self._cycle_growth: dict[int, np.ndarray] = {}
        for g in gpu_ids:
            rows = self._values[self._gpus == g][:, self._cum_idx]
            self._cycle_growth[g] = rows[-1] - rows[0]
        gaps = np.concatenate([np.diff(self._offsets[self._gpus == g]) for g in gpu_ids])
        gaps = gaps[gaps > 0]
        # A cycle lasts the recorded span plus one typical interval, so that the next cycle's first
        # sample does not share a timestamp with the previous cycle's last (typical = per-GPU median).
        self._period_ns = int(self._offsets[-1]) + (int(np.median(gaps)) if gaps.size else 1_000_000)
        self._links, self._link_growth = _recorded_links(samples, run.links[run.links["node"] == chosen])
        self._errors, self._error_growth = _recorded_errors(samples, run.errors[run.errors["node"] == chosen])
        self._cursor, self._cycle = 0, 0
        self.finished, self.start_ns = False, None
        self._opened = True
        return [
            DeviceInfo(node=self.node, gpu=int(r.gpu), vendor=str(r.vendor), model=str(r.model),
                       uuid=str(r.uuid), max_gfx_clock_mhz=float(r.max_gfx_clock_mhz),
                       peak_flops=float(r.peak_flops), memory_bytes=int(r.memory_bytes),
                       power_cap_w=float(r.power_cap_w), pci_bus_id=str(r.pci_bus_id), partition=str(r.partition),
                       memory_partition=str(r.memory_partition), chip_uuid=str(r.chip_uuid),
                       compute_share=float(r.compute_share))
            for r in devices.itertuples(index=False)
        ]

    def sample(self, now_ns: int) -> list[Sample]:
        """Return the recorded samples due by ``now_ns``, re-timestamped onto the live clock."""
        if not self._opened:
            raise BackendError("replay backend: sample() called before open() or after close()")
        if self.start_ns is None:
            self.start_ns = int(now_ns)
        if self.finished:
            return []
        # Recorded nanoseconds since the recording's start that have played by now.
        played = (int(now_ns) - self.start_ns) * self.speed
        out: list[Sample] = []
        while True:
            if self._cursor == 0 and self.loop:
                # Cycles wholly in the past are skipped, not emitted: a recording whose period is a
                # few ns (timestamps in seconds, say) would otherwise be replayed millions of
                # times per call. Counters stay monotonic: they grow by whole cycles regardless.
                self._cycle = max(self._cycle, int(played // self._period_ns))
            base = self._cycle * self._period_ns
            end = int(np.searchsorted(self._offsets, played - base, side="right"))
            if end > self._cursor:
                out.extend(self._rows(self._cursor, end, base))
                self._cursor = end
            if self._cursor < len(self._offsets):
                return out
            if not self.loop:
                self.finished = True
                return out
            if played < base + self._period_ns:
                return out
            self._cycle, self._cursor = self._cycle + 1, 0

    def _rows(self, lo: int, hi: int, base: int) -> list[Sample]:
        values = self._values[lo:hi]
        if self._cycle:
            values = values.copy()
            for i, g in enumerate(self._gpus[lo:hi].tolist()):
                values[i, self._cum_idx] += self._cycle * self._cycle_growth[g]
        start, speed, node = self.start_ns or 0, self.speed, self.node
        out = []
        for off, g, vals, links, errors in zip(self._offsets[lo:hi].tolist(), self._gpus[lo:hi].tolist(),
                                               values.tolist(), self._links[lo:hi], self._errors[lo:hi], strict=True):
            s = Sample(start + round((base + off) / speed), node, g, *vals)
            s.links = self._cycle_links(links, g)
            s.errors = self._cycle_errors(errors, g)
            out.append(s)
        return out

    def _cycle_links(self, links: tuple[LinkBytes, ...], gpu: int) -> tuple[LinkBytes, ...]:
        """A sample's recorded links, advanced by whole cycles of each link's growth."""
        if not links or not self._cycle:
            return links
        grow, c = self._link_growth, self._cycle
        return tuple(LinkBytes(k, tx + c * grow[(gpu, k)][0], rx + c * grow[(gpu, k)][1]) for k, tx, rx in links)

    def _cycle_errors(self, errors: tuple[ErrorCount, ...], gpu: int) -> tuple[ErrorCount, ...]:
        """A sample's recorded health counters, counters advanced by whole cycles of their growth."""
        if not errors or not self._cycle:
            return errors
        grow, c = self._error_growth, self._cycle
        return tuple(e._replace(value=e.value + c * grow.get((gpu, e.kind, e.window, e.detail), 0.0)) for e in errors)

    def close(self) -> None:
        """Forget the loaded run; safe to call twice."""
        self._opened = False


def _per_sample(samples: pd.DataFrame, rows: pd.DataFrame, columns: list[str],
                make: Callable[..., T]) -> list[tuple[T, ...]]:
    """Per sample row (in ``samples`` order), what ``make`` builds from each of its rows of a per-sample
    table (links, errors: matched on ``ts_ns`` and ``gpu``), given the row's ``columns``, in table order."""
    per_sample: list[tuple[T, ...]] = [()] * len(samples)
    if rows.empty:
        return per_sample
    position = {(int(t), int(g)): i for i, (t, g) in enumerate(zip(samples["ts_ns"].tolist(),
                                                                   samples["gpu"].tolist(), strict=True))}
    grouped: dict[int, list[T]] = {}
    for t, g, *values in rows[["ts_ns", "gpu", *columns]].itertuples(index=False):
        grouped.setdefault(position[(int(t), int(g))], []).append(make(*values))
    for i, entries in grouped.items():
        per_sample[i] = tuple(entries)
    return per_sample


def _recorded_links(samples: pd.DataFrame, links: pd.DataFrame
                    ) -> tuple[list[tuple[LinkBytes, ...]], dict[tuple[int, int], tuple[float, float]]]:
    """Per sample row (in ``samples`` order), its links; and per ``(gpu, link)`` the (tx, rx) growth of one cycle.

    Args:
        samples: The node's samples, sorted by ``ts_ns`` as ``read_run`` returns them.
        links: The node's rows of the run's links table (``read_run`` sorts them by ``ts_ns``, then link).
    """
    per_sample = _per_sample(samples, links, ["link", "tx_bytes", "rx_bytes"],
                             lambda k, tx, rx: LinkBytes(int(k), float(tx), float(rx)))
    if links.empty:
        return per_sample, {}
    ordered = links.sort_values("ts_ns", kind="stable").groupby(["gpu", "link"])
    first, last = ordered[["tx_bytes", "rx_bytes"]].first(), ordered[["tx_bytes", "rx_bytes"]].last()
    growth = {(int(g), int(k)): (float(v.tx_bytes), float(v.rx_bytes))
              for (g, k), v in (last - first).iterrows()}
    return per_sample, growth


def _recorded_errors(samples: pd.DataFrame, errors: pd.DataFrame
                     ) -> tuple[list[tuple[ErrorCount, ...]], dict[tuple[int, str, str, str], float]]:
    """Per sample row (in ``samples`` order), its health counters; and per ``(gpu, kind, window,
    detail)`` of a counter kind, its growth over one cycle.

    Args:
        samples: The node's samples, sorted by ``ts_ns`` as ``read_run`` returns them.
        errors: The node's rows of the run's errors table.
    """
    per_sample = _per_sample(
        samples, errors, ["kind", "window", "detail", "value", "chip_wide"],
        lambda kind, window, detail, value, chip_wide: ErrorCount(str(kind), str(window), str(detail), float(value),
                                                                   bool(chip_wide)))
    counters = errors[errors["kind"].map(ERROR_KINDS.get) == "counter"]
    ordered = counters.sort_values("ts_ns", kind="stable").groupby(["gpu", "kind", "window", "detail"])
    span = ordered["value"].last() - ordered["value"].first()
    growth = {(int(g), str(k), str(w), str(d)): float(v) for (g, k, w, d), v in span.items()}
    return per_sample, growth
