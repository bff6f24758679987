"""A simulated node of GPUs whose activity follows the training markers the agent forwards.

For machines without GPUs (demos, CI, load tests). Everything it reports says
``vendor="simulated"``. Deterministic: the same ``seed``, settings and sequence of
``observe_marker`` / ``sample`` calls give the same samples; it never reads a clock (time is the
``now_ns`` given to ``sample``).

Chips and devices. ``gpus`` counts chips. Whole chips are one device each. A ``partition``
(``agent.backends.specs.partition_layout``: AMD DPX/QPX/CPX, an NVIDIA MIG profile) shows each chip
as ``per_chip`` devices, partition ``p`` of chip ``c`` being device ``c · per_chip + p``, with its
own UUID, the chip's as ``chip_uuid``, and ``peak_flops`` / ``memory_bytes`` scaled to its share:
an MI300X in CPX is 8 devices of 1/8 each, an H100 in MIG 3g.40gb 2 instances of 60/132 SMs and
40 GiB. ``hot_gpus``, ``power_cap_w`` and health events name chips.

Activity. Each device (whole chip or partition) is in one of four states, decided by the markers
of the rank driving it:

===========  =====================================================  =========  ======  =====
state        when                                                   busy       matrix  a
===========  =====================================================  =========  ======  =====
compute      inside a phase (forward/backward/optimizer/...)        0.90–0.97  0.70    1.00
collective   inside a collective, outside any phase                 0.99       0.00    0.30
step         inside a step, outside phases and collectives          0.45       0.08    0.35
idle         outside any step, or > 2 s since the last marker       0.02       0.00    0.00
===========  =====================================================  =========  ======  =====

A collective keeps the engines busy without matrix work: NVML and amd-smi count any running
kernel as activity, and NCCL/RCCL kernels run (spinning on their peers) for as long as the
collective lasts, also while a rank waits for a late one: NVML's utilisation (the share of the
sample period in which any kernel ran) reads ~100% then. So an exposed collective reads as busy,
not idle, as on real devices, and its time is not counted as idle and exposed at once (a lower
level would cap a long exposed collective by the idle it invents, most on the rank that waited).

A sample's ratios are the time-weighted means over its interval (markers split the interval at
their timestamps). A marker reaches the agent later than it happened (a client's batch that is
not full waits up to 0.25 s by default, and a loaded machine delays delivery further), while a
real GPU's counters see the work at once. So with ``lag_s`` the simulation runs that far behind
the clock: ``sample(now_ns)`` covers the interval up to ``now_ns − lag`` and is stamped so, and a
marker delivered within the lag takes effect at its own timestamp. A marker older than the
interval being simulated takes effect at its start: without a lag (or past it), the time from
the marker to its delivery reads as the state before it, e.g. a late collective's begin as the
idle between steps, which would cap the exposed communication of the rank that waited.

``a`` is the activity factor that drives dynamic power. A collective's bytes
(from its begin or end marker) are added to ``link_tx_bytes`` and ``link_rx_bytes`` at
``LINK_BYTES_PER_S`` while it runs, and whatever is left when it ends. ``Sample.links`` splits
them evenly over the GPU's simulated links (``links_for``): on an AMD model one XGMI link per
peer of the node (seven in an 8-GPU hive), on an NVIDIA model the 18 NVLink4 links that connect
an H100/H200 SXM5 to the NVSwitches; NCCL and RCCL stripe a collective over every link, so an
even split is what those topologies show.

Physics, per chip, integrated over the elapsed time between ``sample`` calls in sub-steps of at
most 1 s (the first call covers a nominal 0.1 s). Units: MHz, W, °C, s, J. A partitioned chip's
activity factor ``a`` is the sum of its partitions' ``a``, each weighted by its compute share, so
one busy CPX partition of eight draws little more than an idle chip.

1. Requested clock (DVFS governor): ``f_req = f_idle + (f_max − f_idle)·min(1, a/0.3)``,
   ``f_idle = 0.15·f_max``.
2. Power: ``P(f) = P_s(T) + a·P_dyn·(f/f_max)^2.5`` where ``P_s(T) = idle_w·leak·(1 + 0.004·(T − 40))``
   is static power (leakage grows with temperature) and ``P_dyn = (tdp_w − idle_w)·q`` the
   dynamic power at full activity and max clock; the exponent 2.5 is the V–f scaling
   (P ∝ f·V², V roughly linear in f above the knee).
3. Limits: the power cap (``power_cap_w``, the model's ``tdp_w`` unless set otherwise) and a
   thermal budget: the power that brings the temperature exactly to ``T_LIMIT_C`` at the end of
   the sub-step,
   ``P_th = ((T_LIMIT − T)/(1 − e^(−dt/τ)) + T − T_amb)/R_th``. The cooling (``R_th``) and the
   dynamic power stay those of the model: a cap below TDP is an administrator's limit (``nvidia-smi
   -pl``, ``amd-smi set --power-cap``), not a different chip. If ``P(f_req)`` exceeds
   ``min(cap, P_th)`` the clock is solved from step 2 to fit, bounded below by ``0.2·f_max``,
   and ``dt`` is added to ``throttle_power_s`` or ``throttle_thermal_s`` (whichever limit binds).
4. Temperature (first-order thermal RC, exact discretisation):
   ``T ← T_ss + (T − T_ss)·e^(−dt/τ)`` with ``T_ss = T_amb + P·R_th``, ``T_amb = 30 °C``,
   ``R_th = 50 °C / tdp_w`` nominal (≈ 80 °C at TDP), ``τ ≈ 6 s``.
5. Energy: ``E += P·dt`` (cumulative J); the reported power is the interval mean ``ΔE/Δt``.

Per-chip variation drawn from ``numpy.random.default_rng(seed)``: ``R_th × U(0.9, 1.1)``,
``τ × U(0.85, 1.15)``, leakage ``U(0.9, 1.15)``, silicon quality ``q ~ U(1.0, 1.2)``; per device:
compute busy ``U(0.90, 0.97)`` and memory in use while training ``U(0.70, 0.85)`` of its memory.
``hot_gpus`` get ``R_th × 3`` (a failed fan or blocked airflow): under sustained load they reach
the thermal limit within seconds (about 5 s at 600 W) and then run at roughly two thirds of the
clock of a healthy GPU, as a GPU that lost its cooling does.
Current and other throttle causes are never simulated (their counters stay 0).

Partitions report what is theirs: activity, memory in use, link and PCIe bytes. The clock and
throttle residency are the chip's, on every partition (each runs at it). Power, energy and
temperature are the chip's on its first partition and NaN on the others (the drivers measure them
for the chip, not per partition), so a sum over devices counts each chip once.

Health (``agent.backends.sim_health``): every chip reports its vendor's error counters, all 0 at
``open``, on the first sample and then at most once per ``HEALTH_INTERVAL_NS`` of ``now_ns``, in
``Sample.errors`` of those ticks only (other ticks: ``()``). ``health_events`` schedule bursts of
errors, XIDs and repair states relative to the first sample. On a partitioned chip the counters
come on its first partition only, each ``chip_wide=True``. Errors do not change the physics.

Cost: per ``sample`` a few list operations per device plus ~35 numpy operations on arrays of
``gpus`` (chip) or ``gpus · per_chip`` (device) elements, independent of the sampling rate; once
per second of ``now_ns`` a health reading of ≤ 30 counters per chip (a chip whose counters did not
change returns its previous tuple).
"""
from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agent.backends.base import BackendError
from agent.backends.sim_health import AGGREGATE_CORRECTED_MAX, HEALTH_INTERVAL_NS, ChipHealth, parse_events
from agent.backends.specs import SPECS, partition_layout
from agent.marker_wire import MarkerRow
from chopper.schema import NAN, DeviceInfo, ErrorCount, LinkBytes, MarkerKind, Sample

NOMINAL_FIRST_DT_S = 0.1
MAX_SUBSTEP_S = 1.0
STALE_AFTER_NS = 2_000_000_000
# The agent's lag (module docstring): the client's 0.25 s flush interval, the marker socket's
# 20 ms coalescing and a loaded machine's delivery, with room to spare; step summaries wait as long.
AGENT_LAG_S = 0.5
AMBIENT_C = 30.0
T_LIMIT_C = 100.0
TAU_S = 6.0
HOT_RTH_FACTOR = 3.0
LINK_BYTES_PER_S = 100e9
PCIE_BYTES_PER_S = 2e8  # host↔device traffic at full activity (data loading, checkpoints)
VF_EXPONENT = 2.5
LEAK_PER_C = 0.004
F_IDLE_FRACTION = 0.15
F_MIN_FRACTION = 0.2

# NVLink4 links of an H100 / H200 SXM5, all to the NVSwitches; XGMI links per AMD GPU at most
# (an MI300X platform wires seven, one to each peer of its 8-GPU hive).
NVLINKS_PER_GPU = 18
MAX_XGMI_PEERS = 7

IDLE, STEP, COLLECTIVE, COMPUTE = 0, 1, 2, 3
# Marker kind by wire value (observe_markers: a dict lookup per marker, not an enum call).
_KINDS = {k.value: k for k in MarkerKind}
# Per state: busy, matrix, memory-controller busy, power activity factor a. COMPUTE's busy is
# replaced per GPU by its drawn level.
_LEVELS = np.array(
    [
        [0.02, 0.00, 0.01, 0.00],
        [0.45, 0.08, 0.20, 0.35],
        [0.99, 0.00, 0.35, 0.30],
        [0.93, 0.70, 0.55, 1.00],
    ]
)


@dataclass(slots=True)
class _Collective:
    name: str
    nbytes: float
    sent: float = 0.0


@dataclass(slots=True)
class _Gpu:
    """Marker-driven state of one GPU; times in ns."""

    pending: list[tuple[int, MarkerKind, str, int]] = field(default_factory=list)
    in_step: bool = False
    phases: list[str] = field(default_factory=list)
    collectives: list[_Collective] = field(default_factory=list)
    last_marker_ns: int | None = None

    def state(self) -> int:
        if self.phases:
            return COMPUTE
        if self.collectives:
            return COLLECTIVE
        return STEP if self.in_step else IDLE

    def apply(self, kind: MarkerKind, name: str, ts_ns: int, nbytes: int) -> float:
        """Apply one marker; return link bytes to add now (the unsent rest of an ending collective)."""
        self.last_marker_ns = ts_ns if self.last_marker_ns is None else max(self.last_marker_ns, ts_ns)
        if kind == MarkerKind.STEP_BEGIN:
            self.in_step = True
        elif kind == MarkerKind.STEP_END:
            # A step closes whatever the job left open, so a missed end marker cannot pin a state.
            rest = sum(max(c.nbytes - c.sent, 0.0) for c in self.collectives)
            self.in_step, self.phases, self.collectives = False, [], []
            return rest
        elif kind == MarkerKind.PHASE_BEGIN:
            self.phases.append(name)
        elif kind == MarkerKind.PHASE_END:
            if name in self.phases:
                self.phases.reverse()
                self.phases.remove(name)
                self.phases.reverse()
            elif self.phases:
                self.phases.pop()
        elif kind == MarkerKind.COLLECTIVE_BEGIN:
            self.collectives.append(_Collective(name, float(max(nbytes, 0))))
        elif kind == MarkerKind.COLLECTIVE_END and self.collectives:
            idx = next((i for i in range(len(self.collectives) - 1, -1, -1)
                        if self.collectives[i].name == name), len(self.collectives) - 1)
            c = self.collectives.pop(idx)
            return max(max(c.nbytes, float(nbytes)) - c.sent, 0.0)
        return 0.0

    def run(self, a_ns: int, b_ns: int, durs: list[float]) -> float:
        """Credit ``[a_ns, b_ns]`` to the current state (idle once stale); return link bytes moved."""
        if b_ns <= a_ns:
            return 0.0
        live_end = a_ns if self.last_marker_ns is None else min(b_ns, self.last_marker_ns + STALE_AFTER_NS)
        moved = 0.0
        if live_end > a_ns:
            live_s = (live_end - a_ns) * 1e-9
            durs[self.state()] += live_s
            budget = LINK_BYTES_PER_S * live_s
            for c in self.collectives:
                step = min(budget, max(c.nbytes - c.sent, 0.0))
                c.sent += step
                moved += step
        durs[IDLE] += (b_ns - max(a_ns, live_end)) * 1e-9
        return moved


def links_for(vendor: str, gpus: int) -> int:
    """Links each simulated GPU has: 18 NVLinks on NVIDIA, one XGMI link per peer (1 to 7) on AMD."""
    return NVLINKS_PER_GPU if vendor == "nvidia" else max(1, min(gpus - 1, MAX_XGMI_PEERS))


class SimulatedBackend:
    """Simulated GPUs with a DVFS, power-cap and thermal model driven by training markers.

    Args:
        node: Node name written into every row.
        model: A model of ``agent.backends.specs.SPECS`` (``MI300X``, ``H100``, ``H200`` ...).
        gpus: Number of chips.
        seed: Seeds per-GPU variation, noise and UUIDs.
        hot_gpus: Indices of chips with poor cooling (thermal throttling under load).
        power_cap_w: Power cap of every chip, W; ``None`` for the model's TDP. A cap well below TDP
            makes busy GPUs throttle for power (``throttle_power_s``) at a visibly lower clock.
        health_events: ``GPU:KIND:AT_S[:COUNT[:DETAIL]]`` entries (``agent.backends.sim_health``).
        partition: Compute partition (AMD ``DPX``, ``QPX``, ``CPX``) or MIG profile (NVIDIA
            ``3g.40gb`` ...) of every chip; "" whole chips (``agent.backends.specs.partition_layout``).
        memory_partition: AMD memory partition (``NPS1``, ``NPS4``); "" none.
        lag_s: How far behind ``now_ns`` the simulation runs, s (module docstring); the agent
            uses ``AGENT_LAG_S``.

    Raises:
        ValueError: Unknown model, ``gpus < 1``, a hot GPU index out of range, a cap that is not
            positive, a negative lag, a bad health event or an invalid partition.
    """

    name = "simulated"

    def __init__(self, node: str, model: str = "MI300X", gpus: int = 8, seed: int = 0,
                 hot_gpus: Sequence[int] = (), power_cap_w: float | None = None,
                 health_events: Sequence[str] = (), partition: str = "", memory_partition: str = "",
                 lag_s: float = 0.0) -> None:
        spec = SPECS.get(model) or SPECS.get(model.upper())
        if spec is None:
            raise ValueError(f"unknown simulated GPU model {model!r}; known models: {', '.join(SPECS)}")
        if gpus < 1:
            raise ValueError(f"gpus must be at least 1, got {gpus}")
        bad = [g for g in hot_gpus if not 0 <= g < gpus]
        if bad:
            raise ValueError(f"hot_gpus {bad} out of range 0..{gpus - 1}")
        if power_cap_w is not None and not power_cap_w > 0:
            raise ValueError(f"power_cap_w must be a positive number of watts, got {power_cap_w}")
        if not lag_s >= 0:
            raise ValueError(f"lag_s must be 0 or more seconds, got {lag_s}")
        self._lag_ns = int(lag_s * 1e9)
        self.layout = partition_layout(spec, partition, memory_partition)
        self.events = parse_events(health_events, spec.vendor, gpus)
        self.power_cap_w = float(spec.tdp_w if power_cap_w is None else power_cap_w)
        self.node, self.spec, self.chips, self.seed = node, spec, gpus, seed
        per = self.layout.per_chip
        self.gpus = gpus * per  # devices: every partition of every chip
        self._chip_of = np.repeat(np.arange(gpus), per)
        self._first = np.arange(0, self.gpus, per)  # each chip's first partition
        self._share = self.layout.compute_share
        self.hot_gpus = tuple(sorted(set(hot_gpus)))
        self.links = links_for(spec.vendor, gpus)
        self.ignored_markers = 0
        rng = np.random.default_rng(seed)
        # Chip draws first, device draws after: a node of whole chips keeps the values it always had.
        r_th = 50.0 / spec.tdp_w * rng.uniform(0.9, 1.1, gpus)
        r_th[list(self.hot_gpus)] *= HOT_RTH_FACTOR
        self._r_th = r_th
        self._tau = TAU_S * rng.uniform(0.85, 1.15, gpus)
        self._leak = rng.uniform(0.9, 1.15, gpus)
        self._p_dyn = (spec.tdp_w - spec.idle_w) * rng.uniform(1.0, 1.2, gpus)
        self._busy_compute = rng.uniform(0.90, 0.97, self.gpus)
        self._mem_frac = rng.uniform(0.70, 0.85, self.gpus)
        self._aggregate_corrected = np.random.default_rng([seed, 2]).integers(0, AGGREGATE_CORRECTED_MAX, gpus)
        self._noise_rng = np.random.default_rng([seed, 1])
        self._lock = threading.Lock()
        self._opened = False
        self._reset()

    def _reset(self) -> None:
        n, chips = self.gpus, self.chips
        self._state = [_Gpu() for _ in range(n)]
        self._last_ns: int | None = None
        self._first_ns = 0
        self._health_ns: int | None = None
        wide = bool(self.layout.partition)
        self._health = [ChipHealth(self.spec.vendor, [e for e in self.events if e.gpu == c],
                                   int(self._aggregate_corrected[c]), chip_wide=wide) for c in range(chips)]
        self._temp = np.full(chips, AMBIENT_C) + self.spec.idle_w * self._leak * self._r_th
        self._energy = np.zeros(chips)
        self._thr_power = np.zeros(chips)
        self._thr_thermal = np.zeros(chips)
        self._link = np.zeros(n)
        self._link_rows: list[tuple[float, tuple[LinkBytes, ...]]] = [(-1.0, ())] * n  # (total, its links)
        self._pcie = np.zeros(n)
        self._seen_step = np.zeros(n, dtype=bool)

    def _uuid(self, key: str) -> str:
        # The node is part of the name so that a simulated cluster sharing one seed has unique UUIDs.
        name = f"chopper-simulated:{self.node}:{self.seed}:{key}"
        return "SIM-" + str(uuid.uuid5(uuid.NAMESPACE_URL, name))

    def open(self) -> list[DeviceInfo]:
        """Start a fresh simulation (cold GPUs, zero counters) and describe its devices.

        A whole chip is its own chip (``chip_uuid`` its ``uuid``); partition ``p`` of chip ``c`` is
        device ``c · per_chip + p`` with its own UUID, the chip's as ``chip_uuid``, and the chip's
        peak and memory scaled to its share.
        """
        self._reset()
        self._opened = True
        s, lay = self.spec, self.layout
        per = lay.per_chip
        peak, memory = s.peak_flops * lay.compute_share, int(s.memory_bytes * lay.memory_share)
        devices = []
        for g in range(self.gpus):
            chip = self._uuid(str(g // per))
            own = chip if not lay.partition else self._uuid(f"{g // per}/{g % per}")
            devices.append(DeviceInfo(
                node=self.node, gpu=g, vendor="simulated", model=f"{s.model} (simulated)", uuid=own,
                max_gfx_clock_mhz=s.max_gfx_clock_mhz, peak_flops=peak, memory_bytes=memory,
                power_cap_w=self.power_cap_w, partition=lay.partition, memory_partition=lay.memory_partition,
                chip_uuid=chip, compute_share=lay.compute_share))
        return devices

    def close(self) -> None:
        """Stop; ``sample`` fails until the next ``open``. Safe to call twice."""
        self._opened = False

    def observe_marker(self, gpu: int, kind: MarkerKind, name: str, ts_ns: int, nbytes: int) -> None:
        """Queue a marker for device ``gpu``; it takes effect at ``ts_ns`` within the next ``sample`` interval.

        Never raises: a marker for a GPU this node does not have is counted in ``ignored_markers``.
        """
        if not 0 <= gpu < self.gpus:
            self.ignored_markers += 1
            return
        with self._lock:
            self._state[gpu].pending.append((int(ts_ns), MarkerKind(kind), name, int(nbytes or 0)))

    def observe_markers(self, gpu: int, markers: Sequence[MarkerRow]) -> None:
        """``observe_marker`` for one batch's markers, in one take of the lock (the agent's per-batch call)."""
        if not 0 <= gpu < self.gpus:
            self.ignored_markers += len(markers)
            return
        kinds = _KINDS
        queued = [(ts, kinds[kind], name, nbytes) for ts, kind, _, name, _, _, nbytes, _ in markers]
        with self._lock:
            self._state[gpu].pending.extend(queued)

    def _activity(self, g: int, t0: int, t1: int) -> tuple[list[float], float]:
        """Seconds in each state over ``[t0, t1]`` and link bytes moved, applying due markers."""
        st = self._state[g]
        durs = [0.0, 0.0, 0.0, 0.0]
        if not st.pending:  # the common case between markers: skip the lock and the sort
            return durs, st.run(t0, t1, durs)
        with self._lock:
            due = [m for m in st.pending if m[0] <= t1]
            st.pending = [m for m in st.pending if m[0] > t1] if len(due) < len(st.pending) else []
        moved = 0.0
        t = t0
        for ts, kind, name, nbytes in sorted(due, key=lambda m: m[0]):
            te = max(ts, t)  # markers older than the interval take effect at its start
            moved += st.run(t, te, durs)
            t = te
            moved += st.apply(kind, name, ts, nbytes)
        moved += st.run(t, t1, durs)
        if st.in_step or st.phases:
            self._seen_step[g] = True
        return durs, moved

    def sample(self, now_ns: int) -> list[Sample]:
        """Advance the simulation to ``now_ns`` and return one sample per device for the interval."""
        if not self._opened:
            raise BackendError("simulated backend: sample() called before open() or after close()")
        now_ns = int(now_ns) - self._lag_ns
        t0 = now_ns - int(NOMINAL_FIRST_DT_S * 1e9) if self._last_ns is None else min(self._last_ns, now_ns)
        self._last_ns = now_ns
        dt = (now_ns - t0) * 1e-9
        spec, n, chip_of = self.spec, self.gpus, self._chip_of

        durs = np.empty((n, 4))
        link_add = np.empty(n)
        for g in range(n):
            d, link_add[g] = self._activity(g, t0, now_ns)
            durs[g] = d
        if dt > 0:
            w = durs / dt
        else:  # no time passed: report the current state
            w = np.zeros((n, 4))
            w[np.arange(n), [st.state() for st in self._state]] = 1.0
        levels = w @ _LEVELS
        busy = levels[:, 0] + w[:, COMPUTE] * (self._busy_compute - _LEVELS[COMPUTE, 0])
        busy = np.clip(busy + self._noise_rng.normal(0.0, 0.004, n), 0.0, 1.0)
        matrix, mem_busy, act = levels[:, 1], levels[:, 2], levels[:, 3]
        # A chip's power follows the work of all its partitions, each weighted by its share.
        chip_act = (act * self._share).reshape(self.chips, -1).sum(axis=1)

        clock_s, energy0 = np.zeros(self.chips), self._energy.copy()
        remaining = dt
        while True:  # sub-steps keep the thermal controller honest over long gaps
            h = min(remaining, MAX_SUBSTEP_S)
            f = self._step(chip_act, h)
            clock_s += f * h
            remaining -= h
            if remaining <= 1e-12:
                break
        self._link += link_add
        self._pcie += PCIE_BYTES_PER_S * act * dt
        if dt > 0:
            clock, power = clock_s / dt, (self._energy - energy0) / dt
        else:
            clock, power = f, self._power(chip_act, f)
        stale = np.array([st.last_marker_ns is None or now_ns - st.last_marker_ns > STALE_AFTER_NS
                          for st in self._state])
        memory = spec.memory_bytes * self.layout.memory_share
        mem_used = np.where(self._seen_step & ~stale, self._mem_frac * memory, 0.5 * 2**30)

        rows = zip(clock[chip_of].tolist(), busy.tolist(), matrix.tolist(), mem_busy.tolist(),
                   *(self._on_first(x) for x in (power, self._energy, self._temp)), mem_used.tolist(),
                   self._link.tolist(), self._pcie.tolist(), self._thr_power[chip_of].tolist(),
                   self._thr_thermal[chip_of].tolist(), self._health_of(now_ns), strict=True)
        node, mclk = self.node, spec.mem_clock_mhz
        return [
            Sample(now_ns, node, g, c, mclk, b, m, mb, p, e, t, mu, lk, lk, pc, 0.5 * pc, tp, tt, 0.0, 0.0, NAN, NAN,
                   self._links_of(g, lk), er)
            for g, (c, b, m, mb, p, e, t, mu, lk, pc, tp, tt, er) in enumerate(rows)
        ]

    def _on_first(self, chip_values: np.ndarray) -> list[float]:
        """A chip-wide quantity per device: the chip's value on its first partition, NaN on the others."""
        if self.layout.per_chip == 1:
            return chip_values.tolist()
        out = np.full(self.gpus, NAN)
        out[self._first] = chip_values
        return out.tolist()

    def _health_of(self, now_ns: int) -> list[tuple[ErrorCount, ...]]:
        """Each device's ``Sample.errors``: every chip's counters on its first partition, once per
        ``HEALTH_INTERVAL_NS`` (the first sample reads them; events count from it); else empty."""
        if self._health_ns is None:
            self._first_ns = now_ns
        elif now_ns - self._health_ns < HEALTH_INTERVAL_NS:
            return [()] * self.gpus
        self._health_ns = now_ns
        errors: list[tuple[ErrorCount, ...]] = [()] * self.gpus
        for g, health in zip(self._first.tolist(), self._health, strict=True):
            errors[g] = health.read(now_ns - self._first_ns)
        return errors

    def _links_of(self, g: int, total: float) -> tuple[LinkBytes, ...]:
        """GPU ``g``'s links carrying ``total`` bytes evenly; the last tuple again while no byte moved."""
        last, links = self._link_rows[g]
        if total != last:
            share = total / self.links
            new = tuple.__new__  # a named tuple's own constructor is a Python call per link
            links = tuple([new(LinkBytes, (k, share, share)) for k in range(self.links)])
            self._link_rows[g] = (total, links)
        return links

    def _static(self) -> np.ndarray:
        return self.spec.idle_w * self._leak * (1.0 + LEAK_PER_C * (self._temp - 40.0))

    def _power(self, act: np.ndarray, f: np.ndarray) -> np.ndarray:
        return self._static() + act * self._p_dyn * (f / self.spec.max_gfx_clock_mhz) ** VF_EXPONENT

    def _step(self, act: np.ndarray, h: float) -> np.ndarray:
        """Integrate ``h`` seconds at activity ``act``; return the clock (MHz) used."""
        spec = self.spec
        f_max = spec.max_gfx_clock_mhz
        f_req = f_max * (F_IDLE_FRACTION + (1.0 - F_IDLE_FRACTION) * np.minimum(1.0, act / 0.3))
        p_static = self._static()
        p_dyn_max = act * self._p_dyn
        demand = p_static + p_dyn_max * (f_req / f_max) ** VF_EXPONENT
        if h > 0:
            k = 1.0 - np.exp(-h / self._tau)
            p_thermal = ((T_LIMIT_C - self._temp) / k + self._temp - AMBIENT_C) / self._r_th
        else:
            p_thermal = np.full_like(demand, math.inf)
        budget = np.minimum(self.power_cap_w, p_thermal)
        over = demand > budget
        f = f_req
        if over.any():
            head = np.maximum(budget - p_static, 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                f_fit = f_max * np.where(p_dyn_max > 0, head / p_dyn_max, 1.0) ** (1.0 / VF_EXPONENT)
            f = np.where(over, np.minimum(f_req, np.maximum(F_MIN_FRACTION * f_max, f_fit)), f_req)
            thermal = over & (p_thermal < self.power_cap_w)
            self._thr_thermal += thermal * h
            self._thr_power += (over & ~thermal) * h
        p = p_static + p_dyn_max * (f / f_max) ** VF_EXPONENT
        if h > 0:
            t_ss = AMBIENT_C + p * self._r_th
            self._temp = t_ss + (self._temp - t_ss) * np.exp(-h / self._tau)
            self._energy += p * h
        return f

