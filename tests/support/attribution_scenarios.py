"""Ground-truth scenarios for the attribution model: recorded runs whose answer is known.

Each scenario builds, per GPU, an exact *true timeline*: piecewise-constant segments (integer
nanosecond boundaries) of busy (0/1), matrix activity (0–1), graphics clock (MHz), power (W),
temperature (°C), link and PCIe traffic (bytes/s) and throttle residency rate per cause (seconds
per second, 0–1). From it the module derives, exactly as a backend would:

* **samples** on a fixed grid: a sample at ``ts`` holds the time-average of busy, matrix, clock,
  power and temperature over ``(previous ts of that GPU, ts]`` and the value at ``ts`` of the
  cumulative counters (energy, link/PCIe bytes, ``throttle_*_s``), which start from non-zero
  "since boot" offsets so a consumer must difference them;
* **markers** at the true times (``step_begin``/``step_end`` with ``flops`` and ``tokens`` on the
  end, ``phase_*`` named ``forward``/``backward``/``optimizer``, ``collective_*`` named
  ``all_reduce``/``all_gather`` with ``bytes``), except where a scenario skews them on purpose;
* **truth** per ``(job, rank, step)`` computed from the true timeline and the true marker windows,
  never from samples, with the DESIGN attribution model:

  1. ``idle_s`` I = time not busy in ``[b, e]``;
  2. exposed communication X = measure of (union of collective windows − union of phase windows)
     inside ``[b, e]``, capped so ``I + X <= T``;
  3. K = T − I − X; f̄ = busy-weighted mean clock; ``dvfs_loss_s`` D = K (1 − f̄/f_max), split
     over causes in proportion to the residency accrued in ``[b, e]`` (``dvfs_unattributed_s``
     when none accrued);
  4. ``ideal_s`` = flops / peak_flops (NaN when flops is 0 or NaN) and ``matrix_util_loss_s``
     U = K f̄/f_max − ideal (NaN with it); ``compute_at_clock_s`` = K f̄/f_max = ideal + U;
  5. job level, per ``(job, step)``: ``straggler_wait_s`` W_r = X_r − min_r X and
     ``exposed_comm_s`` = min_r X, so ``ideal + U + D + X + W + I = T`` on every row.

By construction the GPU is busy (ratio 1) in every phase and in every collective (collective
kernels occupy the GPU, overlapped or not) and idle (0) only in gaps: data-loader stalls, launch
gaps and the idle time before the first and after the last step.

**When the samples determine the truth.** A sample only tells averages over its interval, so a
per-step quantity read from samples is exact only where every sample interval that a step window
cuts is *uniform* in what that quantity depends on. The scenarios keep to these rules, which are
the exact conditions for recoverability (with G the sample grid):

* busy / idle: a busy↔idle change happens either on a grid tick, or only in steps that repeat an
  identical pattern (stationary activity). For a stationary pattern of period T with idle time g
  per period and sample period P, a sampled idle estimate is off by at most ``g·T/P`` per step
  (``short_steps``: 1 ms · 30/100 = 0.3 ms);
* clock: the sampled ``gfx_clock_mhz`` is a plain time-average, while the model's f̄ is
  busy-weighted. They agree exactly when the clock is constant over every sample interval that
  holds busy time; so the clock changes only on grid ticks, and it may drop (idle clock) only in
  sample intervals that are entirely idle (``dataloader_gaps``);
* throttle split: only the *proportions* of residency matter, so they must be constant across a
  cut interval (constant per-cause rates during busy time, changes only on grid ticks);
* dropped samples (``missing_samples``): a sample is dropped only where the two intervals it
  separates have identical busy, clock and residency rates, so the merged interval is uniform;
* after the last step the GPU stays in its last state up to the next grid tick, so the interval
  holding the last ``step_end`` is uniform;
* exposed communication, step time and FLOPs come from markers and are exact, except in
  ``cpu_timestamps`` where every marker is a constant ≤ 1 ms early (CPU launch-ahead), which moves
  each window edge by that skew and so each term by at most that much.

Under these rules every term is recoverable from ``devices``/``samples``/``markers`` within
``tolerance_s(T) = max(2 ms, 1 % of T)``; in all scenarios except ``short_steps`` and
``cpu_timestamps`` it is recoverable exactly (to float rounding).

Devices are an AMD Instinct MI300X (f_max 2100 MHz, 1307.4 TFLOP/s dense BF16) and an NVIDIA H100
SXM (1980 MHz, 989.4 TFLOP/s); NVIDIA samples carry ``matrix_ratio`` NaN, as NVML cannot read
tensor activity. Every scenario is deterministic for a given seed.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from chopper.runs.rundir import write_run
from chopper.schema import DEVICE_COLUMNS, MARKER_COLUMNS, SAMPLE_COLUMNS, THROTTLE_CAUSES, DeviceInfo

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

NAN = math.nan
MS = 1_000_000  # nanoseconds per millisecond
# A fixed epoch above 2**53 so timestamps do not survive a float64 round trip by accident.
T0_NS = 1_717_000_000_000_000_000
TOLERANCE_ABS_S = 2e-3
TOLERANCE_REL = 0.01

TRUTH_COLUMNS: tuple[str, ...] = (
    "job", "rank", "step", "step_time_s", "ideal_s", "matrix_util_loss_s", "compute_at_clock_s",
    "dvfs_loss_s", "dvfs_power_s", "dvfs_thermal_s", "dvfs_current_s", "dvfs_other_s",
    "dvfs_unattributed_s", "exposed_comm_s", "straggler_wait_s", "idle_s",
)

# Per-segment quantities of a true timeline. busy/matrix/mem_busy are 0–1, clock MHz, power W,
# temp °C, link/pcie bytes per second, thr_* residency seconds per second.
_SEG_FIELDS: tuple[str, ...] = (
    "busy", "matrix", "mem_busy", "clock", "power", "temp", "link", "pcie",
    *(f"thr_{c}" for c in THROTTLE_CAUSES),
)


def tolerance_s(step_time_s: float | FloatArray) -> float | FloatArray:
    """Largest error, seconds, allowed for a term recovered from samples: max(2 ms, 1 % of T)."""
    return np.maximum(TOLERANCE_ABS_S, TOLERANCE_REL * np.asarray(step_time_s, dtype=float))


@dataclass(frozen=True)
class DeviceSpec:
    """A GPU model.

    Attributes:
        vendor: ``amd`` or ``nvidia``.
        model: Marketing name.
        max_gfx_clock_mhz: Maximum graphics clock, MHz.
        peak_flops: Dense BF16 FLOP/s at the maximum clock.
        memory_bytes: Device memory, bytes.
        power_cap_w: Power cap, watts.
        idle_power_w: Power when idle, watts.
        mem_clock_mhz: Memory clock, MHz.
        reads_matrix: Whether the backend can read matrix-core activity (NaN otherwise).
    """

    vendor: str
    model: str
    max_gfx_clock_mhz: float
    peak_flops: float
    memory_bytes: int
    power_cap_w: float
    idle_power_w: float
    mem_clock_mhz: float
    reads_matrix: bool


MI300X = DeviceSpec("amd", "AMD Instinct MI300X", 2100.0, 1307.4e12, 192 * 1024**3, 750.0, 140.0, 1300.0, True)
H100 = DeviceSpec("nvidia", "NVIDIA H100 80GB HBM3", 1980.0, 989.4e12, 80 * 1024**3, 700.0, 70.0, 2619.0, False)


@dataclass
class Scenario:
    """A recorded run with its known attribution.

    Attributes:
        name: Scenario name (a key of ``ALL_SCENARIOS``).
        devices: One row per GPU, columns ``DEVICE_COLUMNS``.
        samples: One row per GPU per tick, columns ``SAMPLE_COLUMNS``, sorted by ``ts_ns``.
        markers: One row per event, columns ``MARKER_COLUMNS``, ``kind`` as labels, sorted by
            ``ts_ns`` (stable: at equal timestamps an end precedes the next begin).
        truth: One row per ``(job, rank, step)``, columns ``TRUTH_COLUMNS``, seconds.
        description: What the scenario injects, in words.
        marker_skew_ns: How much earlier than the true GPU time every marker is, ns (0 unless
            the scenario models CPU timestamps).
        gpu_busy: One row per GPU (``node, gpu, busy_s``): true busy seconds over the whole
            timeline, including the stretch after the last step that is held up to the next
            sample tick (so it can exceed the steps' busy time by less than one sample period).
    """

    name: str
    devices: pd.DataFrame
    samples: pd.DataFrame
    markers: pd.DataFrame
    truth: pd.DataFrame
    description: str = ""
    marker_skew_ns: int = 0
    gpu_busy: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["node", "gpu", "busy_s"]))

    def write(self, path: str | Path) -> Path:
        """Write the run (devices, samples, markers) as a recorded-run directory; returns it."""
        return write_run(path, self.devices, self.samples, self.markers)


# --------------------------------------------------------------------------------------------
# True timelines and what a backend would sample from them
# --------------------------------------------------------------------------------------------


@dataclass
class _Timeline:
    """Piecewise-constant values over ``[bounds[i], bounds[i+1])``; bounds in ns from the origin."""

    bounds: IntArray
    values: dict[str, FloatArray]
    _cum: dict[str, FloatArray] = field(default_factory=dict)

    def integral(self, name: str, at_ns: IntArray | Sequence[int]) -> FloatArray:
        """∫ value dt from the origin to each time in ``at_ns``, value·seconds.

        Exact: the integral of a piecewise-constant function is piecewise linear, so linear
        interpolation between segment boundaries loses nothing. ``busy_clock`` is busy × clock.
        """
        if name not in self._cum:
            v = self.values["busy"] * self.values["clock"] if name == "busy_clock" else self.values[name]
            dur = np.diff(self.bounds).astype(np.float64) / 1e9
            self._cum[name] = np.concatenate(([0.0], np.cumsum(v * dur)))
        return np.interp(np.asarray(at_ns, dtype=np.float64), self.bounds.astype(np.float64), self._cum[name])


@dataclass
class _Gpu:
    """One GPU's identity and the counter offsets its backend reports (counters since boot)."""

    node: str
    gpu: int
    spec: DeviceSpec
    node_offset_ns: int = 0
    energy0_j: float = 0.0
    link0_bytes: float = 0.0
    pcie0_bytes: float = 0.0
    throttle0_s: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    mem_used_bytes: float = 0.0


def _sample_columns(tl: _Timeline, ts_rel: IntArray, first_prev_rel: int, gpu: _Gpu) -> dict[str, object]:
    """Samples of one GPU at ``ts_rel`` (ns from the origin), as the backend would report them."""
    prev = np.concatenate(([first_prev_rel], ts_rel[:-1]))
    dt = (ts_rel - prev).astype(np.float64) / 1e9

    def mean(name: str) -> FloatArray:
        return (tl.integral(name, ts_rel) - tl.integral(name, prev)) / dt

    n = ts_rel.size
    link = gpu.link0_bytes + tl.integral("link", ts_rel)
    pcie = gpu.pcie0_bytes + tl.integral("pcie", ts_rel)
    cols: dict[str, object] = {
        "ts_ns": T0_NS + gpu.node_offset_ns + ts_rel,
        "node": np.full(n, gpu.node, dtype=object),
        "gpu": np.full(n, gpu.gpu, dtype=np.int64),
        "gfx_clock_mhz": mean("clock"),
        "mem_clock_mhz": np.full(n, gpu.spec.mem_clock_mhz),
        "busy_ratio": mean("busy"),
        "matrix_ratio": mean("matrix") if gpu.spec.reads_matrix else np.full(n, NAN),
        "mem_busy_ratio": mean("mem_busy"),
        "power_w": mean("power"),
        "energy_j": gpu.energy0_j + tl.integral("power", ts_rel),
        "temp_c": mean("temp"),
        "mem_used_bytes": np.full(n, gpu.mem_used_bytes),
        "link_tx_bytes": link,
        "link_rx_bytes": link,  # an all-reduce sends and receives the same volume
        "pcie_tx_bytes": gpu.pcie0_bytes + 0.05 * tl.integral("pcie", ts_rel),
        "pcie_rx_bytes": pcie,
    }
    for i, cause in enumerate(THROTTLE_CAUSES):
        cols[f"throttle_{cause}_s"] = gpu.throttle0_s[i] + tl.integral(f"thr_{cause}", ts_rel)
    return cols


def _device_row(gpu: _Gpu) -> dict[str, object]:
    s = gpu.spec
    return asdict(DeviceInfo(gpu.node, gpu.gpu, s.vendor, s.model, f"GPU-{gpu.node}-{gpu.gpu:02d}",
                             s.max_gfx_clock_mhz, s.peak_flops, s.memory_bytes, s.power_cap_w))


# --------------------------------------------------------------------------------------------
# Building a rank's timeline step by step
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Step:
    """One training step of one rank, in true GPU time.

    Attributes:
        gap_ns: Idle (data-loader) time at the start of the step.
        forward_ns / backward_ns / optimizer_ns: Phase durations.
        comm_ns: Exposed ``all_reduce`` after backward (0: none).
        overlap_comm: An ``all_reduce`` bucket inside backward (hidden by compute).
        gather_ns / gather_lead_ns: An ``all_gather`` from the step start lasting ``gather_ns``,
            with the forward phase (and the gap) starting ``gather_lead_ns`` after the step start,
            so ``gather_lead_ns`` of it is exposed (0: none).
        clock_mhz: Graphics clock while busy.
        idle_clock_mhz: Clock during the gap (the busy clock when None).
        throttle: Residency seconds per busy second for (power, thermal, current, other).
        flops: Model FLOPs of the step (NaN or 0: unknown).
        tokens: Tokens of the step.
        comm_bytes: Bytes of each collective.
        temp_c: Hotspot temperature.
        busy_power_w: Power while busy (None: a simple clock-and-matrix power model).
    """

    forward_ns: int
    backward_ns: int
    optimizer_ns: int
    clock_mhz: float
    flops: float
    gap_ns: int = 0
    comm_ns: int = 0
    overlap_comm: bool = True
    gather_ns: int = 0
    gather_lead_ns: int = 0
    idle_clock_mhz: float | None = None
    throttle: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    tokens: float = 8 * 4096.0
    comm_bytes: float = 2.0 * 7e9  # bf16 gradients of a 7B-parameter model
    temp_c: float = 70.0
    busy_power_w: float | None = None


class _Rank:
    """Accumulates one rank's true timeline, true markers and step windows."""

    def __init__(self, job: str, rank: int, gpu: _Gpu, *, lead_ns: int, idle_clock_mhz: float) -> None:
        self.job, self.rank, self.gpu = job, rank, gpu
        self.idle_clock_mhz = idle_clock_mhz
        self.bounds: list[int] = [0]
        self.values: dict[str, list[float]] = {f: [] for f in _SEG_FIELDS}
        self.markers: list[dict[str, object]] = []
        self.steps: list[tuple[int, int, int, float]] = []  # (step, begin, end, flops)
        self.idle(lead_ns)

    @property
    def now(self) -> int:
        return self.bounds[-1]

    def _segment(self, dur_ns: int, **vals: float) -> None:
        if dur_ns <= 0:
            return
        self.bounds.append(self.now + int(dur_ns))
        for f in _SEG_FIELDS:
            self.values[f].append(float(vals.get(f, 0.0)))

    def idle(self, dur_ns: int, clock_mhz: float | None = None, temp_c: float = 45.0, pcie: float = 0.0) -> None:
        """Append an idle stretch (busy 0, no throttling), at ``clock_mhz`` or the idle clock."""
        self._segment(dur_ns, busy=0.0, clock=self.idle_clock_mhz if clock_mhz is None else clock_mhz,
                      power=self.gpu.spec.idle_power_w, temp=temp_c, pcie=pcie)

    def busy(self, dur_ns: int, st: _Step, matrix: float, link: float = 0.0) -> None:
        """Append a busy stretch at the step's clock, accruing its throttle residency."""
        spec = self.gpu.spec
        if st.busy_power_w is not None:
            power = st.busy_power_w
        else:
            # Dynamic power grows with clock and matrix activity; keeps the numbers plausible.
            frac = st.clock_mhz / spec.max_gfx_clock_mhz
            power = spec.idle_power_w + (spec.power_cap_w - spec.idle_power_w) * (0.5 + 0.4 * matrix) * frac**2
        thr = {f"thr_{c}": r for c, r in zip(THROTTLE_CAUSES, st.throttle, strict=True)}
        self._segment(dur_ns, busy=1.0, matrix=matrix, mem_busy=0.45, clock=st.clock_mhz, power=power,
                      temp=st.temp_c, link=link, pcie=5e7, **thr)

    def marker(self, kind: str, step: int, at: int, name: str = "", *, flops: float = NAN, tokens: float = NAN,
               nbytes: float = NAN) -> None:
        self.markers.append({"ts_rel": at, "job": self.job, "node": self.gpu.node, "rank": self.rank,
                             "gpu": self.gpu.gpu, "kind": kind, "step": step, "name": name, "flops": flops,
                             "tokens": tokens, "bytes": nbytes})

    def step(self, step: int, st: _Step) -> None:
        """Append one step: [all_gather lead] [gap] forward, backward (+bucket), [all_reduce], optimizer."""
        b = self.now
        self.marker("step_begin", step, b)
        if st.gather_ns:
            self.marker("collective_begin", step, b, "all_gather", nbytes=st.comm_bytes / 2)
            self.marker("collective_end", step, b + st.gather_ns, "all_gather", nbytes=st.comm_bytes / 2)
            # The gather is alone on the GPU until forward starts, then runs beside it.
            self.busy(st.gather_lead_ns, st, matrix=0.0, link=st.comm_bytes / 2 / (st.gather_ns / 1e9))
        gap_clock = st.clock_mhz if st.idle_clock_mhz is None else st.idle_clock_mhz
        self.idle(st.gap_ns, clock_mhz=gap_clock, temp_c=st.temp_c - 5.0, pcie=2e9)
        f0 = self.now
        self.marker("phase_begin", step, f0, "forward")
        self.busy(st.forward_ns, st, matrix=0.55)
        self.marker("phase_end", step, self.now, "forward")
        w0 = self.now
        self.marker("phase_begin", step, w0, "backward")
        if st.overlap_comm:
            # Gradient bucket all-reduce over the middle of backward: fully hidden by compute.
            c0 = w0 + st.backward_ns // 2
            c1 = w0 + (st.backward_ns * 9) // 10
            self.busy(c0 - w0, st, matrix=0.6)
            self.marker("collective_begin", step, c0, "all_reduce", nbytes=st.comm_bytes)
            self.busy(c1 - c0, st, matrix=0.6, link=st.comm_bytes / ((c1 - c0) / 1e9))
            self.marker("collective_end", step, c1, "all_reduce", nbytes=st.comm_bytes)
            self.busy(w0 + st.backward_ns - c1, st, matrix=0.6)
        else:
            self.busy(st.backward_ns, st, matrix=0.6)
        self.marker("phase_end", step, self.now, "backward")
        if st.comm_ns:
            self.marker("collective_begin", step, self.now, "all_reduce", nbytes=st.comm_bytes)
            self.busy(st.comm_ns, st, matrix=0.0, link=st.comm_bytes / (st.comm_ns / 1e9))
            self.marker("collective_end", step, self.now, "all_reduce", nbytes=st.comm_bytes)
        self.marker("phase_begin", step, self.now, "optimizer")
        self.busy(st.optimizer_ns, st, matrix=0.1)
        self.marker("phase_end", step, self.now, "optimizer")
        self.marker("step_end", step, self.now, flops=st.flops, tokens=st.tokens)
        self.steps.append((step, b, self.now, st.flops))

    def finish(self, period_ns: int, tail_ns: int) -> None:
        """Hold the last state up to the next grid tick (keeps the last interval uniform), then idle."""
        pad = (-self.now) % period_ns
        if pad:
            self.bounds.append(self.now + pad)
            for f in _SEG_FIELDS:
                self.values[f].append(self.values[f][-1])
        self.idle(tail_ns)

    def timeline(self) -> _Timeline:
        return _Timeline(np.asarray(self.bounds, dtype=np.int64),
                         {f: np.asarray(v, dtype=np.float64) for f, v in self.values.items()})


# --------------------------------------------------------------------------------------------
# Ground truth from the true timeline
# --------------------------------------------------------------------------------------------


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _exposed_ns(collectives: list[tuple[int, int]], phases: list[tuple[int, int]], b: int, e: int) -> int:
    """Measure, ns, of (∪ collectives − ∪ phases) ∩ [b, e]."""
    total = 0
    covers = _merge(phases)
    for lo, hi in _merge(collectives):
        lo, hi = max(lo, b), min(hi, e)
        if hi <= lo:
            continue
        covered = sum(max(0, min(hi, c1) - max(lo, c0)) for c0, c1 in covers)
        total += (hi - lo) - covered
    return total


def _windows(markers: list[dict[str, object]], kind: str) -> list[tuple[int, int]]:
    """Begin/end windows of one kind (``phase`` or ``collective``), paired per name in order."""
    open_: dict[str, list[int]] = {}
    out: list[tuple[int, int]] = []
    for m in markers:
        name = str(m["name"])
        if m["kind"] == f"{kind}_begin":
            open_.setdefault(name, []).append(int(m["ts_rel"]))  # type: ignore[call-overload]
        elif m["kind"] == f"{kind}_end":
            out.append((open_[name].pop(0), int(m["ts_rel"])))  # type: ignore[call-overload]
    return out


def _snap(x: FloatArray) -> FloatArray:
    """``x`` with values under a picosecond in magnitude set to exactly 0."""
    return np.where(np.abs(x) < 1e-12, 0.0, x)


def _rank_truth(
    job: str, rank: int, spec: DeviceSpec, tl: _Timeline,
    steps: IntArray, begin: IntArray, end: IntArray, flops: FloatArray, exposed_ns: IntArray,
) -> dict[str, object]:
    """Rank-level truth (X before the job-level straggler split), vectorized over steps."""
    t = (end - begin).astype(np.float64) / 1e9
    busy = tl.integral("busy", end) - tl.integral("busy", begin)
    # Float rounding leaves ±1e-17 s where a term is zero by construction; a picosecond is noise.
    idle = _snap(t - busy)
    x = np.minimum(exposed_ns.astype(np.float64) / 1e9, t - idle)
    k = t - idle - x
    busy_clock = tl.integral("busy_clock", end) - tl.integral("busy_clock", begin)
    with np.errstate(invalid="ignore", divide="ignore"):
        fbar = np.where(busy > 0, busy_clock / np.where(busy > 0, busy, 1.0), spec.max_gfx_clock_mhz)
    dvfs = _snap(k * (1.0 - fbar / spec.max_gfx_clock_mhz))
    at_clock = k - dvfs
    res = np.stack([tl.integral(f"thr_{c}", end) - tl.integral(f"thr_{c}", begin) for c in THROTTLE_CAUSES])
    res_total = res.sum(axis=0)
    share = np.divide(res, res_total, out=np.zeros_like(res), where=res_total > 0)
    known = np.isfinite(flops) & (flops > 0)
    ideal = np.where(known, np.where(known, flops, 0.0) / spec.peak_flops, NAN)
    out: dict[str, object] = {
        "job": job, "rank": rank, "step": steps, "step_time_s": t, "ideal_s": ideal,
        "matrix_util_loss_s": at_clock - ideal, "compute_at_clock_s": at_clock, "dvfs_loss_s": dvfs,
    }
    for i, cause in enumerate(THROTTLE_CAUSES):
        out[f"dvfs_{cause}_s"] = dvfs * share[i]
    out["dvfs_unattributed_s"] = np.where(res_total > 0, 0.0, dvfs)
    out["exposed_comm_s"] = x
    out["idle_s"] = idle
    return out


def _job_split(rows: pd.DataFrame) -> pd.DataFrame:
    """Move each rank's exposed communication above the job's minimum into straggler wait."""
    xmin = rows.groupby(["job", "step"])["exposed_comm_s"].transform("min")
    rows["straggler_wait_s"] = rows["exposed_comm_s"] - xmin
    rows["exposed_comm_s"] = xmin
    return rows[list(TRUTH_COLUMNS)].sort_values(["job", "step", "rank"], ignore_index=True)


# --------------------------------------------------------------------------------------------
# Assembling a scenario
# --------------------------------------------------------------------------------------------


def _assemble(
    name: str, ranks: list[_Rank], period_ns: int, *, description: str, skew_ns: int = 0,
    drop: Callable[[_Rank, IntArray, dict[str, object]], npt.NDArray[np.bool_]] | None = None,
) -> Scenario:
    """Sample every rank's timeline, emit its markers and compute the truth."""
    sample_parts: list[pd.DataFrame] = []
    marker_rows: list[dict[str, object]] = []
    truth_parts: list[pd.DataFrame] = []
    busy_rows: list[dict[str, object]] = []
    for r in ranks:
        tl = r.timeline()
        busy_rows.append({"node": r.gpu.node, "gpu": r.gpu.gpu,
                          "busy_s": float(tl.integral("busy", tl.bounds[-1:])[0])})
        # Samples at every grid tick after the origin; the first one's interval starts at the origin.
        ts_rel = np.arange(period_ns, int(tl.bounds[-1]) + 1, period_ns, dtype=np.int64)
        cols = _sample_columns(tl, ts_rel, 0, r.gpu)
        if drop is not None:
            keep = ~drop(r, ts_rel, cols)
            ts_rel = ts_rel[keep]
            cols = _sample_columns(tl, ts_rel, 0, r.gpu)
        sample_parts.append(pd.DataFrame(cols, columns=list(SAMPLE_COLUMNS)))
        for m in r.markers:
            row = dict(m)
            row["ts_ns"] = T0_NS + r.gpu.node_offset_ns + int(row.pop("ts_rel")) - skew_ns  # type: ignore[call-overload]
            marker_rows.append(row)
        steps = np.array([s[0] for s in r.steps], dtype=np.int64)
        begin = np.array([s[1] for s in r.steps], dtype=np.int64)
        end = np.array([s[2] for s in r.steps], dtype=np.int64)
        flops = np.array([s[3] for s in r.steps], dtype=np.float64)
        exposed = np.zeros(steps.size, dtype=np.int64)
        for i, (s, b, e) in enumerate(zip(steps, begin, end, strict=True)):
            own = [m for m in r.markers if m["step"] == s]
            exposed[i] = _exposed_ns(_windows(own, "collective"), _windows(own, "phase"), int(b), int(e))
        truth_parts.append(pd.DataFrame(_rank_truth(r.job, r.rank, r.gpu.spec, tl, steps, begin, end, flops, exposed)))
    devices = pd.DataFrame([_device_row(r.gpu) for r in ranks], columns=list(DEVICE_COLUMNS))
    samples = pd.concat(sample_parts, ignore_index=True).sort_values("ts_ns", kind="stable", ignore_index=True)
    markers = pd.DataFrame(marker_rows, columns=list(MARKER_COLUMNS))
    markers = markers.sort_values("ts_ns", kind="stable", ignore_index=True)
    truth = _job_split(pd.concat(truth_parts, ignore_index=True))
    return Scenario(name, devices, samples, markers, truth, description=description, marker_skew_ns=skew_ns,
                    gpu_busy=pd.DataFrame(busy_rows, columns=["node", "gpu", "busy_s"]))


def _gpu(rng: np.random.Generator, node: str, gpu: int, spec: DeviceSpec, node_offset_ns: int = 0) -> _Gpu:
    """A GPU with random "since boot" counter offsets (consumers must difference counters)."""
    return _Gpu(node, gpu, spec, node_offset_ns=node_offset_ns,
                energy0_j=float(rng.uniform(1e6, 5e7)), link0_bytes=float(rng.uniform(1e12, 1e14)),
                pcie0_bytes=float(rng.uniform(1e11, 1e13)),
                throttle0_s=tuple(float(x) for x in rng.uniform(0.0, 5e3, 4)),  # type: ignore[arg-type]
                mem_used_bytes=float(0.8 * spec.memory_bytes))


def _ranks(job: str, n: int, spec: DeviceSpec, rng: np.random.Generator, *, period_ns: int,
           gpus_per_node: int = 8, node_offsets_ns: Sequence[int] = ()) -> list[_Rank]:
    out = []
    for r in range(n):
        node = r // gpus_per_node
        off = node_offsets_ns[node] if node < len(node_offsets_ns) else 0
        gpu = _gpu(rng, f"{job}-node{node}", r % gpus_per_node, spec, off)
        out.append(_Rank(job, r, gpu, lead_ns=2 * period_ns, idle_clock_mhz=0.4 * spec.max_gfx_clock_mhz))
    return out


def _flops(spec: DeviceSpec, compute_ns: float, mfu: float = 0.6) -> float:
    """FLOPs that would take ``mfu`` × ``compute_ns`` at peak: keeps U > 0 at any clock ≥ mfu·f_max."""
    return mfu * compute_ns / 1e9 * spec.peak_flops


def _jitter(rng: np.random.Generator, ms: float) -> int:
    """A random duration change of at most ±``ms`` milliseconds, whole microseconds."""
    return int(rng.integers(-int(ms * 1000), int(ms * 1000) + 1)) * 1000


# --------------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------------


def clean(seed: int = 0) -> Scenario:
    """2 MI300X ranks at full clock, no gaps, all-reduce hidden in backward: D = X = I = W = 0."""
    rng = np.random.default_rng(seed)
    period = 20 * MS  # 50 Hz
    ranks = _ranks("clean", 2, MI300X, rng, period_ns=period)
    for step in range(1, 11):
        fwd, bwd = 120 * MS + _jitter(rng, 5), 240 * MS + _jitter(rng, 5)
        st = _Step(fwd, bwd, 40 * MS, MI300X.max_gfx_clock_mhz, _flops(MI300X, fwd + bwd))
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("clean", ranks, period, description="full clock, collectives hidden: only ideal and U")


def power_capped(seed: int = 0) -> Scenario:
    """2 H100 ranks held at 80 % clock by the power cap: D = 0.2·T, all of it power."""
    rng = np.random.default_rng(seed)
    period = 50 * MS  # 20 Hz
    spec = H100
    ranks = _ranks("power_capped", 2, spec, rng, period_ns=period)
    for step in range(1, 9):
        fwd, bwd = 180 * MS + _jitter(rng, 10), 360 * MS + _jitter(rng, 10)
        st = _Step(fwd, bwd, 60 * MS, 0.8 * spec.max_gfx_clock_mhz, _flops(spec, fwd + bwd, 0.5),
                   throttle=(1.0, 0.0, 0.0, 0.0), busy_power_w=spec.power_cap_w, temp_c=78.0)
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("power_capped", ranks, period, description="clock 80 % under power cap: D all power")


def mixed_throttle(seed: int = 0) -> Scenario:
    """2 MI300X ranks at 85 % clock with power:thermal residency 3:1 (D split 75/25); steps 6–7 at
    90 % clock with no residency (D unattributed). Steps are 0.5 s on a 20 Hz grid, so the clock
    changes fall on sample ticks."""
    rng = np.random.default_rng(seed)
    period = 50 * MS
    spec = MI300X
    ranks = _ranks("mixed_throttle", 2, spec, rng, period_ns=period)
    for step in range(1, 11):
        fwd = 140 * MS + _jitter(rng, 5)
        bwd = 290 * MS + _jitter(rng, 5)
        opt = 500 * MS - fwd - bwd  # fixed 0.5 s steps: boundaries stay on the grid
        if step in (6, 7):
            st = _Step(fwd, bwd, opt, 0.9 * spec.max_gfx_clock_mhz, _flops(spec, fwd + bwd), temp_c=70.0)
        else:
            st = _Step(fwd, bwd, opt, 0.85 * spec.max_gfx_clock_mhz, _flops(spec, fwd + bwd),
                       throttle=(0.75, 0.25, 0.0, 0.0), temp_c=88.0)
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("mixed_throttle", ranks, period,
                     description="power:thermal 3:1 at 85 % clock; steps 6-7 at 90 % clock, unattributed")


HOT_RANK = 2  # the thermally throttled rank of ``hot_straggler``


def hot_straggler(seed: int = 0) -> Scenario:
    """4 MI300X ranks on 2 nodes; rank 2 runs at 80 % clock with thermal residency, so its compute
    is 25 % longer and the others wait for it in an exposed all-reduce. Truth: the hot rank's
    exposed_comm_s is the all-reduce itself (30 ms) and straggler_wait_s 0; the fast ranks keep
    exposed_comm_s = that minimum and straggler_wait_s = their extra wait (~112 ms). Node 1's
    clock runs 37.5 ms ahead of node 0's (markers and samples alike): ranks join by step only."""
    rng = np.random.default_rng(seed)
    period = 20 * MS
    spec = MI300X
    ranks = _ranks("hot_straggler", 4, spec, rng, period_ns=period, gpus_per_node=2,
                   node_offsets_ns=(0, 37_500_000))
    fmax = spec.max_gfx_clock_mhz
    for step in range(1, 11):
        base_fwd, base_bwd = 150 * MS, 300 * MS
        flops = _flops(spec, base_fwd + base_bwd)
        plans: list[tuple[int, int, float, tuple[float, float, float, float], float]] = []
        for r in ranks:
            ratio = 0.8 if r.rank == HOT_RANK else 1.0
            # Compute time scales with 1/clock; a little per-rank noise keeps the min meaningful.
            fwd = int(base_fwd / ratio) + _jitter(rng, 2)
            bwd = int(base_bwd / ratio) + _jitter(rng, 2)
            thr = (0.0, 1.0, 0.0, 0.0) if r.rank == HOT_RANK else (0.0, 0.0, 0.0, 0.0)
            plans.append((fwd, bwd, ratio * fmax, thr, 96.0 if r.rank == HOT_RANK else 72.0))
        done = max(f + b for f, b, *_ in plans)
        for r, (fwd, bwd, clock, thr, temp) in zip(ranks, plans, strict=True):
            # Everyone leaves the all-reduce together: 30 ms after the slowest rank enters it.
            comm = done - (fwd + bwd) + 30 * MS
            r.step(step, _Step(fwd, bwd, 30 * MS, clock, flops, comm_ns=comm, overlap_comm=False,
                               throttle=thr, temp_c=temp))
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("hot_straggler", ranks, period,
                     description="rank 2 thermally throttled to 80 %: straggler wait on ranks 0, 1, 3")


def exposed_collectives(seed: int = 0) -> Scenario:
    """2 H100 ranks; a 25 ms all-reduce after backward, not overlapped, and an all-gather at the
    step start of which the first 3 ms precede forward: X = 28 ms per step."""
    rng = np.random.default_rng(seed)
    period = 10 * MS  # 100 Hz
    spec = H100
    ranks = _ranks("exposed_collectives", 2, spec, rng, period_ns=period)
    for step in range(1, 13):
        fwd, bwd = 70 * MS + _jitter(rng, 3), 140 * MS + _jitter(rng, 3)
        st = _Step(fwd, bwd, 15 * MS, spec.max_gfx_clock_mhz, _flops(spec, fwd + bwd), comm_ns=25 * MS,
                   overlap_comm=False, gather_ns=8 * MS, gather_lead_ns=3 * MS)
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("exposed_collectives", ranks, period, description="X = 25 ms all_reduce + 3 ms all_gather")


def dataloader_gaps(seed: int = 0) -> Scenario:
    """2 MI300X ranks; each 0.5 s step starts with a data-loader stall of 40 ms (odd steps) or 80 ms
    (even steps), on the 50 Hz grid, with the clock dropping to 900 MHz while idle: I = the gap."""
    rng = np.random.default_rng(seed)
    period = 20 * MS
    spec = MI300X
    ranks = _ranks("dataloader_gaps", 2, spec, rng, period_ns=period)
    for step in range(1, 11):
        gap = (40 if step % 2 else 80) * MS
        fwd, bwd = 130 * MS + _jitter(rng, 5), 260 * MS + _jitter(rng, 5)
        opt = 500 * MS - gap - fwd - bwd
        st = _Step(fwd, bwd, opt, spec.max_gfx_clock_mhz, _flops(spec, fwd + bwd), gap_ns=gap, idle_clock_mhz=900.0)
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("dataloader_gaps", ranks, period, description="idle gap of 40/80 ms at each step start")


def short_steps(seed: int = 0) -> Scenario:
    """2 H100 ranks, 20 identical 30 ms steps sampled at 10 Hz: 1 ms launch gap, 90 % clock under
    power throttling. Each sample spans 3⅓ steps, so per-step terms come from stationarity; the
    sampled idle is off by at most 1 ms · 30/100 = 0.3 ms."""
    del seed  # identical steps by design: stationarity is what makes them recoverable
    rng = np.random.default_rng(0)
    period = 100 * MS
    spec = H100
    ranks = _ranks("short_steps", 2, spec, rng, period_ns=period)
    clock = 0.9 * spec.max_gfx_clock_mhz
    st = _Step(9 * MS, 16 * MS, 4 * MS, clock, _flops(spec, 25 * MS, 0.5), gap_ns=1 * MS, idle_clock_mhz=clock,
               throttle=(1.0, 0.0, 0.0, 0.0), comm_bytes=2e8, tokens=4096.0)
    for step in range(1, 21):  # 20 × 30 ms = 600 ms: the last step ends on a sample tick
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("short_steps", ranks, period, description="30 ms steps, 100 ms samples, stationary")


def missing_samples(seed: int = 0) -> Scenario:
    """2 MI300X ranks (40 ms data-loader gaps, 20 ms exposed all-reduce, 90 % clock under power
    throttling), with ~40 % of the samples dropped wherever the two intervals they separate are
    identical, so merged intervals stay uniform and every term is still exact."""
    rng = np.random.default_rng(seed)
    period = 20 * MS
    spec = MI300X
    ranks = _ranks("missing_samples", 2, spec, rng, period_ns=period)
    clock = 0.9 * spec.max_gfx_clock_mhz
    for step in range(1, 11):
        fwd, bwd = 100 * MS + _jitter(rng, 5), 200 * MS + _jitter(rng, 5)
        opt = 400 * MS - 40 * MS - 20 * MS - fwd - bwd
        st = _Step(fwd, bwd, opt, clock, _flops(spec, fwd + bwd), gap_ns=40 * MS, comm_ns=20 * MS,
                   overlap_comm=False, idle_clock_mhz=1000.0, throttle=(1.0, 0.0, 0.0, 0.0))
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)

    def drop(r: _Rank, ts_rel: IntArray, cols: dict[str, object]) -> npt.NDArray[np.bool_]:
        # Interval i ends at sample i; dropping sample i merges intervals i and i+1.
        keys = [np.asarray(cols["busy_ratio"]), np.asarray(cols["gfx_clock_mhz"])]
        keys += [np.diff(np.asarray(cols[f"throttle_{c}_s"]), prepend=np.nan) for c in THROTTLE_CAUSES]
        same = np.ones(ts_rel.size, dtype=bool)
        for k in keys:
            same[:-1] &= np.isclose(k[:-1], k[1:], rtol=1e-12, atol=1e-12)
        same[0] = same[-1] = False  # the first and last samples anchor the run
        return same & (rng.random(ts_rel.size) < 0.4)

    return _assemble("missing_samples", ranks, period, drop=drop,
                     description="~40 % of samples dropped in uniform stretches")


CPU_SKEW_NS = 800_000  # markers 0.8 ms ahead of the GPU in ``cpu_timestamps``


def cpu_timestamps(seed: int = 0) -> Scenario:
    """2 H100 ranks, 0.3 s steps at 100 Hz with 20 ms gaps, a 20 ms exposed all-reduce and 90 %
    clock ("other" throttle cause); every marker is 0.8 ms earlier than the GPU activity it marks
    (CPU launch-ahead). Truth is the GPU's; each term is recoverable within 0.8 ms."""
    rng = np.random.default_rng(seed)
    period = 10 * MS
    spec = H100
    ranks = _ranks("cpu_timestamps", 2, spec, rng, period_ns=period)
    clock = 0.9 * spec.max_gfx_clock_mhz
    for step in range(1, 11):
        fwd, bwd = 80 * MS + _jitter(rng, 4), 150 * MS + _jitter(rng, 4)
        opt = 300 * MS - 20 * MS - 20 * MS - fwd - bwd
        st = _Step(fwd, bwd, opt, clock, _flops(spec, fwd + bwd), gap_ns=20 * MS, comm_ns=20 * MS,
                   overlap_comm=False, throttle=(0.0, 0.0, 0.0, 1.0))
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("cpu_timestamps", ranks, period, skew_ns=CPU_SKEW_NS,
                     description="markers 0.8 ms early (CPU clock); 'other' throttling")


def no_flops(seed: int = 0) -> Scenario:
    """2 H100 ranks at 95 % clock ("current" throttle cause); steps 1–2 carry FLOPs, odd steps ≥ 3
    carry NaN and even steps ≥ 4 carry 0: ideal_s and matrix_util_loss_s are NaN there, and
    compute_at_clock_s closes the account instead."""
    rng = np.random.default_rng(seed)
    period = 50 * MS
    spec = H100
    ranks = _ranks("no_flops", 2, spec, rng, period_ns=period)
    for step in range(1, 9):
        fwd, bwd = 150 * MS + _jitter(rng, 5), 300 * MS + _jitter(rng, 5)
        flops = _flops(spec, fwd + bwd) if step <= 2 else (NAN if step % 2 else 0.0)
        st = _Step(fwd, bwd, 50 * MS, 0.95 * spec.max_gfx_clock_mhz, flops, throttle=(0.0, 0.0, 1.0, 0.0))
        for r in ranks:
            r.step(step, st)
    for r in ranks:
        r.finish(period, 2 * period)
    return _assemble("no_flops", ranks, period, description="flops NaN/0 from step 3; 'current' throttling")


ALL_SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "clean": clean,
    "power_capped": power_capped,
    "mixed_throttle": mixed_throttle,
    "hot_straggler": hot_straggler,
    "exposed_collectives": exposed_collectives,
    "dataloader_gaps": dataloader_gaps,
    "short_steps": short_steps,
    "missing_samples": missing_samples,
    "cpu_timestamps": cpu_timestamps,
    "no_flops": no_flops,
}


# --------------------------------------------------------------------------------------------
# A large run for benchmarks
# --------------------------------------------------------------------------------------------

# Segment layout of one big_run step: gap, forward, backward, all-reduce, optimizer.
_BIG_MARKERS: tuple[tuple[str, str, int], ...] = (
    # (kind, name, boundary index within the step: 0 = step begin ... 5 = step end)
    ("step_begin", "", 0),
    ("phase_begin", "forward", 1), ("phase_end", "forward", 2),
    ("phase_begin", "backward", 2), ("phase_end", "backward", 3),
    ("collective_begin", "all_reduce", 3), ("collective_end", "all_reduce", 4),
    ("phase_begin", "optimizer", 4), ("phase_end", "optimizer", 5),
    ("step_end", "", 5),
)


def big_run(ranks: int, steps: int, sample_hz: float, seed: int = 0) -> Scenario:
    """A large synchronous data-parallel run of MI300X ranks (8 per node), for benchmarks.

    Steps last about 1 s (a whole number of sample periods); each starts with a one-period
    data-loader gap when a step spans at least 10 periods. About 1 % of ranks are thermally
    throttled to 85 % clock; everyone leaves the all-reduce 30 ms after the slowest rank enters
    it. Built with numpy (one ``np.interp`` per GPU and counter); 1,000 ranks × 100 steps at
    10 Hz takes a few seconds. The truth is computed from the construction (cheap, exact).

    Args:
        ranks: Number of ranks (one GPU each).
        steps: Steps per rank.
        sample_hz: Sample rate per GPU, Hz.
        seed: Seed of the per-rank, per-step compute noise and the choice of hot ranks.
    """
    rng = np.random.default_rng(seed)
    spec = MI300X
    fmax = spec.max_gfx_clock_mhz
    period = round(1e9 / sample_hz)
    step_ns = max(1, round(1e9 / period)) * period
    gap = period if step_ns >= 10 * period else 0
    comm_min, opt = 30 * MS, 30 * MS
    base = step_ns - gap - comm_min - opt - 60 * MS  # leave room for the slowest rank
    hot = rng.random(ranks) < 0.01
    ratio = np.where(hot, 0.85, 1.0)
    noise = 1.0 + 0.01 * rng.random((ranks, steps))
    compute = np.floor(base * 0.85 / ratio[:, None] * noise / 1000).astype(np.int64) * 1000  # ns, per rank/step
    fwd = compute // 3
    bwd = compute - fwd
    comm = compute.max(axis=0)[None, :] - compute + comm_min
    opt_ns = step_ns - gap - compute - comm  # absorbs the rest: all ranks share step boundaries
    lead = 2 * period
    # Boundary times (ranks × steps × 6): begin, forward start, backward start, comm, opt, end.
    dur = np.stack([np.full_like(fwd, gap), fwd, bwd, comm, opt_ns], axis=2)
    begin = lead + np.arange(steps, dtype=np.int64)[None, :] * step_ns
    bnd = np.concatenate([np.broadcast_to(begin[:, :, None], (ranks, steps, 1)),
                          begin[:, :, None] + np.cumsum(dur, axis=2)], axis=2)
    end_rel = lead + steps * step_ns + 2 * period
    ts_rel = np.arange(period, end_rel + 1, period, dtype=np.int64)
    n_s = ts_rel.size
    prev = np.concatenate(([0], ts_rel[:-1]))
    dt = (ts_rel - prev) / 1e9

    thermal0 = rng.uniform(0.0, 5e3, ranks)
    energy0 = rng.uniform(1e6, 5e7, ranks)
    link0 = rng.uniform(1e12, 1e14, ranks)
    busy_per_seg = np.array([0.0, 1.0, 1.0, 1.0, 1.0])
    matrix_per_seg = np.array([0.0, 0.55, 0.6, 0.0, 0.1])
    bytes_per_step = 2.0 * 7e9
    cols: dict[str, list[FloatArray]] = {c: [] for c in
                                         ("busy", "matrix", "clock", "power", "energy", "link", "thermal")}
    for r in range(ranks):
        # Timeline of rank r: origin, every step's boundaries, then the idle tail.
        seg_b = bnd[r, :, :5].reshape(-1)
        xs = np.concatenate(([0], seg_b, [lead + steps * step_ns, end_rel])).astype(np.float64)
        busy = np.concatenate(([0.0], np.tile(busy_per_seg, steps), [0.0]))
        matrix = np.concatenate(([0.0], np.tile(matrix_per_seg, steps), [0.0]))
        # Constant clock (also in gaps): the sampled plain average then equals the busy-weighted one.
        clock = np.full_like(busy, ratio[r] * fmax)
        power = np.where(busy > 0, spec.idle_power_w + 500.0 * ratio[r] ** 2, spec.idle_power_w)
        link_rate = np.zeros_like(busy)
        link_rate[1:-1] = np.tile([0.0, 0.0, 0.0, 1.0, 0.0], steps)
        seg_dur = np.diff(xs) / 1e9
        link_rate[1:-1][3::5] = bytes_per_step / np.maximum(seg_dur[1:-1][3::5], 1e-9)
        thermal_rate = busy * (1.0 if hot[r] else 0.0)

        def cum(v: FloatArray, xs: FloatArray = xs, seg_dur: FloatArray = seg_dur) -> tuple[FloatArray, FloatArray]:
            """∫ v dt from the origin to each sample time and to its predecessor."""
            c = np.concatenate(([0.0], np.cumsum(v * seg_dur)))
            return np.interp(ts_rel.astype(np.float64), xs, c), np.interp(prev.astype(np.float64), xs, c)

        for key, v in (("busy", busy), ("matrix", matrix), ("clock", clock), ("power", power)):
            at, before = cum(v)
            cols[key].append((at - before) / dt)
            if key == "power":
                cols["energy"].append(energy0[r] + at)
        cols["link"].append(link0[r] + cum(link_rate)[0])
        cols["thermal"].append(thermal0[r] + cum(thermal_rate)[0])

    nodes = np.array([f"big-node{r // 8}" for r in range(ranks)], dtype=object)
    gpus = np.arange(ranks, dtype=np.int64) % 8
    link = np.concatenate(cols["link"])
    zeros = np.zeros(ranks * n_s)
    samples = pd.DataFrame({
        "ts_ns": np.tile(T0_NS + ts_rel, ranks),
        "node": np.repeat(nodes, n_s),
        "gpu": np.repeat(gpus, n_s),
        "gfx_clock_mhz": np.concatenate(cols["clock"]),
        "mem_clock_mhz": np.full(ranks * n_s, spec.mem_clock_mhz),
        "busy_ratio": np.concatenate(cols["busy"]),
        "matrix_ratio": np.concatenate(cols["matrix"]),
        "mem_busy_ratio": 0.45 * np.concatenate(cols["busy"]),
        "power_w": np.concatenate(cols["power"]),
        "energy_j": np.concatenate(cols["energy"]),
        "temp_c": np.repeat(np.where(hot, 96.0, 72.0), n_s),
        "mem_used_bytes": np.full(ranks * n_s, 0.8 * spec.memory_bytes),
        "link_tx_bytes": link,
        "link_rx_bytes": link,
        "pcie_tx_bytes": zeros,
        "pcie_rx_bytes": zeros,
        "throttle_power_s": zeros,
        "throttle_thermal_s": np.concatenate(cols["thermal"]),
        "throttle_current_s": zeros,
        "throttle_other_s": zeros,
    }, columns=list(SAMPLE_COLUMNS)).sort_values("ts_ns", kind="stable", ignore_index=True)

    n_m = len(_BIG_MARKERS)
    kinds = np.array([k for k, _, _ in _BIG_MARKERS], dtype=object)
    names = np.array([n for _, n, _ in _BIG_MARKERS], dtype=object)
    idx = np.array([i for _, _, i in _BIG_MARKERS])
    ts = (T0_NS + bnd[:, :, idx]).reshape(-1)  # ranks × steps × markers, in logical order
    total = ranks * steps * n_m
    step_of = np.repeat(np.tile(np.arange(1, steps + 1, dtype=np.int64), ranks), n_m)
    flops = _flops(spec, base * 0.85)
    flops_col = np.where(np.tile(kinds == "step_end", ranks * steps), flops, NAN)
    tokens_col = np.where(np.tile(kinds == "step_end", ranks * steps), 8 * 4096.0, NAN)
    bytes_col = np.where(np.tile(np.char.startswith(kinds.astype(str), "collective"), ranks * steps),
                         bytes_per_step, NAN)
    markers = pd.DataFrame({
        "ts_ns": ts, "job": np.full(total, "big", dtype=object), "node": np.repeat(nodes, steps * n_m),
        "rank": np.repeat(np.arange(ranks, dtype=np.int64), steps * n_m),
        "gpu": np.repeat(gpus, steps * n_m), "kind": np.tile(kinds, ranks * steps), "step": step_of,
        "name": np.tile(names, ranks * steps), "flops": flops_col, "tokens": tokens_col, "bytes": bytes_col,
    }, columns=list(MARKER_COLUMNS)).sort_values("ts_ns", kind="stable", ignore_index=True)

    devices = pd.DataFrame([_device_row(_Gpu(str(nodes[r]), int(gpus[r]), spec)) for r in range(ranks)],
                           columns=list(DEVICE_COLUMNS))

    # Truth by construction: idle = gap, X = comm, clock constant per rank.
    t = np.full((ranks, steps), step_ns / 1e9)
    idle = np.full((ranks, steps), gap / 1e9)
    x = comm / 1e9
    k = t - idle - x
    at_clock = k * ratio[:, None]
    dvfs = k - at_clock
    ideal = np.full((ranks, steps), flops / spec.peak_flops)
    xmin = x.min(axis=0)[None, :]
    z = np.zeros((ranks, steps))
    truth = pd.DataFrame({
        "job": "big", "rank": np.repeat(np.arange(ranks), steps), "step": np.tile(np.arange(1, steps + 1), ranks),
        "step_time_s": t.ravel(), "ideal_s": ideal.ravel(), "matrix_util_loss_s": (at_clock - ideal).ravel(),
        "compute_at_clock_s": at_clock.ravel(), "dvfs_loss_s": dvfs.ravel(), "dvfs_power_s": z.ravel(),
        "dvfs_thermal_s": np.where(hot[:, None], dvfs, 0.0).ravel(), "dvfs_current_s": z.ravel(),
        "dvfs_other_s": z.ravel(), "dvfs_unattributed_s": np.where(hot[:, None], 0.0, dvfs).ravel(),
        "exposed_comm_s": np.broadcast_to(xmin, (ranks, steps)).ravel(), "straggler_wait_s": (x - xmin).ravel(),
        "idle_s": idle.ravel(),
    }, columns=list(TRUTH_COLUMNS)).sort_values(["job", "step", "rank"], ignore_index=True)
    # Steps end on a sample tick, so nothing is held after the last one: busy time is the steps'.
    gpu_busy = pd.DataFrame({"node": nodes, "gpu": gpus, "busy_s": (t - idle).sum(axis=1)})
    return Scenario(f"big_run_{ranks}x{steps}@{sample_hz:g}Hz", devices, samples, markers, truth,
                    description="benchmark: synchronous data parallel, ~1 % thermally throttled ranks",
                    gpu_busy=gpu_busy)
