"""AMD Instinct backend over amdsmi (ROCm SMI library), converting to the DESIGN data model.

One ``amdsmi_get_gpu_metrics_info`` call per device per tick carries almost everything (the
driver exports the power-management firmware's metrics table); ``amdsmi_get_gpu_vram_usage`` adds
memory in use. Units at this boundary, as amdsmi 7 documents them and the amdgpu driver fills them
for MI300 (``smu_v13_0_6``, gpu_metrics v1.7):

==========================  ================================  ==================================
amdsmi field                vendor unit                       ``Sample`` field
==========================  ================================  ==================================
current_gfxclks[XCC]        MHz per XCC                       gfx_clock_mhz (mean over XCCs)
current_uclk                MHz                               mem_clock_mhz
average_gfx_activity        %                                 busy_ratio (÷100)
average_umc_activity        %                                 mem_busy_ratio (÷100)
current_socket_power        W                                 power_w
energy_accumulator          counts of 2^-16 J (15.259 µJ)     energy_j
temperature_hotspot         °C                                temp_c
temperature_mem, _hbm[4]    °C                                mem_temp_c (hottest)
temperature_vr{gfx,soc,mem} °C                                vr_temp_c (hottest)
xgmi_{read,write}_data_acc  KB per link (KiB, ×1024)          link_{rx,tx}_bytes (sum of links)
xgmi_{read,write}_data_acc  KB per link (KiB, ×1024)          links[k].{rx,tx}_bytes (link k)
vram_used                   MiB                               mem_used_bytes
*_residency_acc             firmware iterations throttled     throttle_*_s (see ``_Throttle``)
==========================  ================================  ==================================

XGMI reads bring data into this GPU (rx) and writes send it out (tx). Entry k of the per-link
lists is XGMI link k; ``Sample.links`` holds the links whose counters read as numbers, leaving out
those ``xgmi_link_status`` (gpu_metrics v1.7, where present) reports down or disabled: an MI300X in an
8-GPU hive has seven active links, one to each peer. Fields MI300 does not expose stay NaN:
``pcie_tx_bytes``/``pcie_rx_bytes`` (``pcie_bandwidth_acc`` is an accumulated GB/s figure with no
direction, not a byte counter) and ``throttle_other_s`` (no residency counter for causes beyond
power, thermal and current). Any field amdsmi reports as ``"N/A"``, leaves out, or fills with an
all-ones sentinel (65535 for a 16-bit temperature, which older amdsmi passes through raw) reads as NaN.

Temperatures. MI300 firmware reports the hottest HBM stack only, as ``temperature_mem``
(``temperature_hbm`` reads "N/A"), and the hottest of all its voltage regulators as
``temperature_vrsoc`` (``temperature_vrgfx`` and ``temperature_vrmem`` read "N/A"); older tables
fill the per-stack and per-rail fields. ``mem_temp_c`` and ``vr_temp_c`` are the hottest of what
reads. ``amdsmi_get_temp_metric`` (VRAM, HBM_0..HBM_3) reads the same firmware value through
hwmon, so it is not called: no extra query per tick.

Matrix activity. amdsmi exposes no MFMA (matrix-core) activity counter: gpu_metrics has graphics
activity only, which is busy whether or not the matrix cores work. ``matrix_ratio`` therefore
stays NaN, and the agent exports no counter-derived FLOP utilisation for AMD GPUs. What would
provide it: rocprofiler-sdk's SQ counters (``SQ_VALU_MFMA_BUSY_CYCLES`` over ``GRBM_GUI_ACTIVE`` ×
CUs × 4, as rocprof-compute derives MFMA utilisation; ``SQ_INSTS_VALU_MFMA_MOPS_BF16``, BF16 MFMA
operations in units of 512), which need a profiling session on the device rather than a
monitoring read, or a future amdsmi field.

Health and errors (``Sample.errors``) are read at most once per ``HEALTH_INTERVAL_NS``, inside the
``sample()`` call that falls due, and attached to that tick's samples only (the others carry
``errors=()``); ``_Health`` lists the calls. Partitions: ``_chips`` tells which processor handles
are one chip, and ``AmdBackend`` says which values a partition reports.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any, TypeVar

from agent.backends.base import BackendError, BackendUnavailable, DeviceLost
from agent.backends.specs import find_spec
from chopper.schema import NAN, DeviceInfo, ErrorCount, LinkBytes, Sample

log = logging.getLogger(__name__)

_JOULES_PER_ENERGY_COUNT = 2.0**-16  # the driver: "Energy counter reported in 15.259uJ (2^-16) units"
_BYTES_PER_KB = 1024  # xgmi_*_data_acc are "KB"; the firmware keeps them as Q10 fixed point (binary)
_BYTES_PER_MB = 1024 * 1024  # amdsmi derives vram MB from bytes with 1024 * 1024
_WATTS_PER_MICROWATT = 1e-6  # amdsmi_get_power_cap_info reports microwatts

# amdsmi_status_t codes (amdsmi.h; stable C ABI) that mean the device stopped answering: it fell
# off the bus, the driver is resetting or unloaded, or its sysfs/DRM nodes went away.
_LOST_CODES = frozenset({
    6,   # AMDSMI_STATUS_DRM_ERROR
    8,   # AMDSMI_STATUS_TIMEOUT
    12,  # AMDSMI_STATUS_IO
    14,  # AMDSMI_STATUS_FILE_ERROR
    20,  # AMDSMI_STATUS_DIRECTORY_NOT_FOUND
    30,  # AMDSMI_STATUS_BUSY
    31,  # AMDSMI_STATUS_NOT_FOUND
    34,  # AMDSMI_STATUS_DRIVER_NOT_LOADED
    52,  # AMDSMI_STATUS_FILE_NOT_FOUND
    54,  # AMDSMI_STATUS_AMDGPU_RESTART_ERR
})
_NOT_SUPPORTED = 2  # AMDSMI_STATUS_NOT_SUPPORTED
# Health and error counters are read at most this often (agent.health compares readings).
HEALTH_INTERVAL_NS = 10**9
# xgmi_link_status values of a link that carries nothing (amdsmi_xgmi_link_status_type_t): DOWN 0, DISABLE 2.
_LINK_NOT_UP = (0, 2)

_INSTALL_HINT = (
    "install ROCm (the amd-smi-lib package, which provides libamd_smi.so; set ROCM_PATH if it is not "
    "under /opt/rocm) and the amd extra: pip install 'chopper-telemetry[amd]'"
)

T = TypeVar("T")


def import_amdsmi() -> ModuleType:
    """Import the vendor ``amdsmi`` module, which needs ROCm's ``libamd_smi.so`` at import time.

    Without ROCm, ``import amdsmi`` prints to stdout and then fails with ``KeyError`` (or
    ``OSError``/``ImportError``, depending on the version). Its stdout is captured so that it
    never interleaves with the agent's output; the text goes into the error message instead.

    Returns:
        The ``amdsmi`` module.

    Raises:
        BackendUnavailable: amdsmi or ROCm is missing; the message names the fix.
    """
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            return importlib.import_module("amdsmi")
    except Exception as exc:  # the vendor import fails with KeyError, OSError, ImportError, ...
        said = " ".join(printed.getvalue().split())
        detail = f"{type(exc).__name__}: {exc}" + (f"; it printed: {said}" if said else "")
        raise BackendUnavailable(
            f"amd backend: cannot import amdsmi ({detail}). To fix: {_INSTALL_HINT}."
        ) from exc


def _said(exc: BaseException) -> str:
    """An amdsmi exception's text on one line (``AmdSmiLibraryException`` spans lines)."""
    return " ".join(str(exc).split())


def _text(value: Any) -> str:
    """A vendor string stripped; "" for "N/A", None and non-strings."""
    text = value.strip() if isinstance(value, str) else ""
    return "" if text == "N/A" else text


def _num(value: Any, bits: int = 16) -> float:
    """A vendor scalar as float; NaN for ``"N/A"``, None, non-numbers and the all-ones sentinel.

    ``bits`` is the field's C width: amdsmi maps the sentinel of the width it knows to "N/A", but
    older versions and some paths hand the raw all-ones value through.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NAN
    if value == (1 << bits) - 1 or value < 0:
        return NAN
    return float(value)


def _nums(values: Any, bits: int = 16) -> list[float]:
    """The valid entries of a vendor list (per XCC, per link), NaN and "N/A" dropped."""
    if not isinstance(values, list | tuple):
        return []
    return [v for v in (_num(x, bits) for x in values) if not math.isnan(v)]


def _first(metrics: Mapping[str, Any], keys: Iterable[str], bits: int = 16) -> float:
    """The first of ``keys`` that holds a valid value (a field and its fallback), else NaN."""
    for key in keys:
        value = _num(metrics.get(key), bits)
        if not math.isnan(value):
            return value
    return NAN


def _percent(metrics: Mapping[str, Any], key: str) -> float:
    """A 0–100 % activity as a 0–1 ratio; above 100 is a bad read, so NaN."""
    value = _num(metrics.get(key))
    return value / 100.0 if value <= 100.0 else NAN


def _xcp_busy(metrics: Mapping[str, Any], xcp: int) -> float:
    """Partition ``xcp``'s graphics activity, 0–1: the mean of its XCCs' ``xcp_stats.gfx_busy_inst`` (%).

    gpu_metrics v1.6+ gives one row per compute partition (XCP) with one entry per XCC it
    holds; amdsmi marks absent XCCs "N/A". NaN when the table has no row for it (older drivers).
    """
    rows = metrics.get("xcp_stats.gfx_busy_inst")
    row = rows[xcp] if isinstance(rows, list | tuple) and xcp < len(rows) else None
    busy = [v for v in _nums(row) if v <= 100.0]
    return sum(busy) / len(busy) / 100.0 if busy else NAN


def _sum_links(metrics: Mapping[str, Any], key: str) -> float:
    """Cumulative bytes over all XGMI links; NaN when no link reports."""
    links = _nums(metrics.get(key), bits=64)
    return sum(links) * _BYTES_PER_KB if links else NAN


def _per_link(values: Any) -> list[float]:
    """A per-link list as bytes by link index, NaN where an entry is "N/A" or a sentinel."""
    if not isinstance(values, list | tuple):
        return []
    return [_num(v, bits=64) * _BYTES_PER_KB for v in values]


def _links(metrics: Mapping[str, Any]) -> tuple[LinkBytes, ...]:
    """Each XGMI link's cumulative bytes: write → tx, read → rx; links reported down are left out."""
    tx, rx = _per_link(metrics.get("xgmi_write_data_acc")), _per_link(metrics.get("xgmi_read_data_acc"))
    status = metrics.get("xgmi_link_status")
    down = {k for k, v in enumerate(status) if v in _LINK_NOT_UP} if isinstance(status, list | tuple) else set()
    out = []
    for k in range(max(len(tx), len(rx))):
        sent = tx[k] if k < len(tx) else NAN
        received = rx[k] if k < len(rx) else NAN
        if k not in down and not (math.isnan(sent) and math.isnan(received)):
            out.append(LinkBytes(k, sent, received))
    return tuple(out)


def _hottest(metrics: Mapping[str, Any], keys: Iterable[str]) -> float:
    """The highest valid temperature over ``keys`` (scalars or per-stack lists), °C; NaN if none reads."""
    values: list[float] = []
    for key in keys:
        value = metrics.get(key)
        values.extend(_nums(value) if isinstance(value, list | tuple) else _nums([value]))
    return max(values, default=NAN)


# Residency accumulators by DESIGN cause. PPT (package power tracking) is the power limit.
# Socket and HBM thermal are temperature limits. VR thermal protects the voltage regulators from
# the heat of the current they deliver, and PROCHOT is the platform's hot/over-current signal
# (typically asserted by the VRs); both limit current, as the schema's "EDC/PROCHOT-style" says.
# MI300 has no counter for any other cause, so throttle_other_s stays NaN.
_CAUSES: dict[str, tuple[str, ...]] = {
    "power": ("ppt_residency_acc",),
    "thermal": ("socket_thm_residency_acc", "hbm_thm_residency_acc"),
    "current": ("vr_thm_residency_acc", "prochot_residency_acc"),
}
_RESIDENCY_KEYS = tuple(key for keys in _CAUSES.values() for key in keys)


@dataclass(slots=True)
class _Throttle:
    """Turns firmware residency counters into cumulative throttle seconds for one device.

    Algorithm (per cause, per tick):

    1. The firmware increments ``accumulation_counter`` once per control-loop iteration and each
       ``*_residency_acc`` once per iteration its limiter was active (amdsmi documents PVIOL % as
       ``Δppt_residency_acc × 100 / Δaccumulation_counter``). The iteration period is not
       documented, so counts are not seconds by themselves.
    2. The fraction of the interval throttled is ``Δresidency / Δaccumulation_counter`` (capped
       at 1: two accumulators summed into one cause may overlap).
    3. Seconds are that fraction times the wall-clock interval since the last accepted read,
       from the sampler's ``now_ns``, so throttle seconds share the samples' timeline and can
       never exceed elapsed time.
    4. When the counter has not advanced (the table was not refreshed since the last read) the
       baseline is kept, so the next interval covers both ticks. When it went backwards (driver
       reload, GPU reset) the baseline restarts and nothing is added.

    Seconds are cumulative since ``open()``, starting at 0.0; consumers difference them.
    ``amdsmi_get_violation_status`` is not used: it reads the same accumulators but sleeps
    100 ms between two reads, which would stall a 10–100 Hz sampler.
    """

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_CAUSES, 0.0))
    prev_counter: float = NAN
    prev_residency: dict[str, float] = field(default_factory=dict)
    prev_ns: int = 0

    def update(self, metrics: Mapping[str, Any], now_ns: int) -> dict[str, float]:
        """Fold one gpu_metrics read in; return cumulative seconds per cause (NaN if unreadable)."""
        counter = _num(metrics.get("accumulation_counter"), bits=64)
        residency = {key: _num(metrics.get(key), bits=64) for key in _RESIDENCY_KEYS}
        readable = {
            cause: not math.isnan(counter) and all(not math.isnan(residency[k]) for k in keys)
            for cause, keys in _CAUSES.items()
        }
        if math.isnan(self.prev_counter) or counter < self.prev_counter:
            self._rebase(counter, residency, now_ns)
        elif counter > self.prev_counter:
            ticks = counter - self.prev_counter
            elapsed_s = (now_ns - self.prev_ns) / 1e9
            for cause, keys in _CAUSES.items():
                deltas = [residency[k] - self.prev_residency[k] for k in keys]
                if readable[cause] and all(d >= 0 for d in deltas):
                    self.seconds[cause] += min(1.0, sum(deltas) / ticks) * elapsed_s
            self._rebase(counter, residency, now_ns)
        return {cause: self.seconds[cause] if readable[cause] else NAN for cause in _CAUSES}

    def _rebase(self, counter: float, residency: dict[str, float], now_ns: int) -> None:
        self.prev_counter, self.prev_residency, self.prev_ns = counter, residency, now_ns



# RAS blocks amd-smi leaves out of its per-block ECC table because they keep no error count.
_UNCOUNTABLE_BLOCKS = frozenset({"ATHUB", "DF", "SMN", "SEM", "MP0", "MP1", "FUSE"})
_ECC_KINDS = (("correctable_count", "ecc_corrected"), ("uncorrectable_count", "ecc_uncorrected"),
              ("deferred_count", "ecc_deferred"))
_PCIE_KINDS = (("pcie_replay_count", "pcie_replay"), ("pcie_nak_sent_count", "pcie_nak_sent"),
               ("pcie_nak_received_count", "pcie_nak_received"))
# amdsmi_memory_page_status_t (the driver's R, P and F flags of ras/gpu_vram_bad_pages) → detail.
_PAGE_STATUS = {"RESERVED": "retired", "PENDING": "pending", "UNRESERVABLE": "unreservable"}


@dataclass(slots=True)
class _Health:
    """Reads one chip's health and error counters through its first partition's handle.

    ==========================================  ==========================================  ============================
    amdsmi call                                 what it answers                             ``ErrorCount``
    ==========================================  ==========================================  ============================
    amdsmi_get_gpu_ras_block_features_enabled   each RAS block's state (read once)          the blocks asked below
    amdsmi_get_gpu_ecc_count(handle, block)     correctable/uncorrectable/deferred_count    ecc_*, detail = block (umc…)
    amdsmi_get_gpu_total_ecc_count              the same over all blocks                    ecc_*, detail ``total``
    amdsmi_get_pcie_info                        pcie_metric.pcie_replay_count,              pcie_replay, pcie_nak_sent,
                                                pcie_nak_sent_count, _received_count        pcie_nak_received
    amdsmi_gpu_xgmi_error_status                0 no error, 1 error, 2 multiple errors      xgmi_error
    amdsmi_get_gpu_bad_page_info                retired-page records by status              bad_pages retired|pending|
                                                (RESERVED, PENDING, UNRESERVABLE)           unreservable (counts)
    ==========================================  ==========================================  ============================

    ECC counts are the amdgpu driver's RAS counters (sysfs ``ras/<block>_err_count``), kept in
    driver memory since it loaded: window ``volatile``. What persists across reboots is the
    retired-page table in the board's EEPROM, reported as ``bad_pages``. ECC is asked for the
    blocks whose state is ENABLED, as amd-smi does, except those it calls uncountable
    (``_UNCOUNTABLE_BLOCKS``); the block list is read once, since RAS features are fixed when
    the driver loads. ``pcie_replay_roll_over_count`` is left out: it counts rollovers of the
    replay number (a link retrain each), not replays, and the schema has no kind for it.

    Errors: a query answering NOT_SUPPORTED is never asked again for this chip; any other
    amdsmi error, or a value that is "N/A" or a sentinel, leaves that counter out of this
    reading only. Each is logged once per query and error code; none fails the sample.
    """

    smi: ModuleType
    handle: Any
    gpu: int
    chip_wide: bool
    unsupported: set[str] = field(default_factory=set)
    blocks: list[str] | None = None
    logged: set[tuple[str, Any]] = field(default_factory=set)

    def read(self) -> tuple[ErrorCount, ...]:
        """One reading of every supported counter, cumulative as amdsmi counts them."""
        out: list[ErrorCount] = []
        for block in self._blocks():
            counts = self._ask(f"ecc {block}", partial(self.smi.amdsmi_get_gpu_ecc_count, self.handle,
                                                       self.smi.AmdSmiGpuBlock[block]))
            self._add(out, counts, _ECC_KINDS, "volatile", block.lower())
        total = self._ask("ecc total", partial(self.smi.amdsmi_get_gpu_total_ecc_count, self.handle))
        self._add(out, total, _ECC_KINDS, "volatile", "total")
        pcie = self._ask("pcie", partial(self.smi.amdsmi_get_pcie_info, self.handle))
        self._add(out, pcie.get("pcie_metric") if isinstance(pcie, Mapping) else None, _PCIE_KINDS, "", "")
        xgmi = _num(self._ask("xgmi", partial(self.smi.amdsmi_gpu_xgmi_error_status, self.handle)))
        if xgmi in (0.0, 1.0, 2.0):
            out.append(ErrorCount("xgmi_error", "", "", xgmi, self.chip_wide))
        out.extend(self._bad_pages())
        return tuple(out)

    def _blocks(self) -> list[str]:
        """Names (``AmdSmiGpuBlock``) of the enabled RAS blocks with an ECC count; read once."""
        if self.blocks is None:
            states = self._ask("ras blocks", partial(self.smi.amdsmi_get_gpu_ras_block_features_enabled,
                                                     self.handle))
            if not isinstance(states, list):
                return []  # asked again next reading unless it was NOT_SUPPORTED
            known = self.smi.AmdSmiGpuBlock.__members__
            self.blocks = [str(s.get("block")) for s in states if isinstance(s, Mapping)
                           and s.get("status") == "ENABLED" and s.get("block") in known
                           and s.get("block") not in _UNCOUNTABLE_BLOCKS]
        return self.blocks

    def _bad_pages(self) -> list[ErrorCount]:
        records = self._ask("bad pages", partial(self.smi.amdsmi_get_gpu_bad_page_info, self.handle))
        if not isinstance(records, list):
            return []
        by_status = {int(self.smi.AmdSmiMemoryPageStatus[name]): detail for name, detail in _PAGE_STATUS.items()}
        counts = dict.fromkeys(_PAGE_STATUS.values(), 0)
        for record in records:
            status = record.get("status") if isinstance(record, Mapping) else None
            detail = by_status.get(status) if isinstance(status, int) else None
            if detail is not None:  # a status amdsmi does not document is no page state we know
                counts[detail] += 1
        return [ErrorCount("bad_pages", "", d, float(n), self.chip_wide) for d, n in counts.items()]

    def _add(self, out: list[ErrorCount], values: Any, kinds: Iterable[tuple[str, str]], window: str,
             detail: str) -> None:
        if not isinstance(values, Mapping):
            return
        for key, kind in kinds:
            value = _num(values.get(key), bits=64)
            if not math.isnan(value):
                out.append(ErrorCount(kind, window, detail, value, self.chip_wide))

    def _ask(self, query: str, fn: Callable[[], Any]) -> Any:
        """One health query; None when it failed (NOT_SUPPORTED: never asked again)."""
        if query in self.unsupported:
            return None
        try:
            return fn()
        except self.smi.AmdSmiException as exc:
            code = getattr(exc, "err_code", None)
            if code == _NOT_SUPPORTED:
                self.unsupported.add(query)
            if (query, code) not in self.logged:
                self.logged.add((query, code))
                level = logging.INFO if code == _NOT_SUPPORTED else logging.WARNING
                log.log(level, "event=health_query_failed gpu=%d query=%r error=%r%s", self.gpu, query,
                        _said(exc), " (not asked again)" if code == _NOT_SUPPORTED else "")
            return None


@dataclass(frozen=True, slots=True)
class _Place:
    """Where one processor handle sits: its PCI address, UUID and partition, as read at ``open()``."""

    bdf: str
    uuid: str
    partition_id: int | None
    compute_partition: str
    memory_partition: str


def _chip_key(gpu: int, bdf: str) -> str:
    """``domain:bus:device`` of a BDF ("0000:05:00.3" → "0000:05:00"); the handle alone if unreadable."""
    head, dot, function = bdf.rpartition(".")
    return head if dot and head.count(":") == 2 and function.isdigit() else f"unaddressed {gpu}"


def _chips(places: list[_Place]) -> list[list[int]]:
    """The GPU indices of each physical chip, its first partition first.

    Algorithm:

    1. amdsmi lists every compute partition as a processor handle of its own (a CPX MI300X: 8,
       one per XCD). The partitions of one chip are one PCI device: their
       ``amdsmi_get_gpu_device_bdf`` agree on domain, bus and device. Only the function may
       differ (rocm_smi put the partition id there before ROCm 6.1), so handles are grouped
       by ``domain:bus:device``; a handle without a readable BDF is a chip of its own.
    2. Within a chip, partitions are ordered by ``amdsmi_get_gpu_kfd_info``'s
       ``current_partition_id`` (0 for SPX and for the first partition), then by amdsmi's
       order; the first is the one that reports the chip's counters.
    """
    groups: dict[str, list[int]] = {}
    for gpu, place in enumerate(places):
        groups.setdefault(_chip_key(gpu, place.bdf), []).append(gpu)
    order = {gpu: (p.partition_id is None, p.partition_id or 0, gpu) for gpu, p in enumerate(places)}
    return [sorted(members, key=order.__getitem__) for members in groups.values()]


@dataclass(slots=True)
class _Device:
    """Per-GPU state of an open backend; ``first`` is the chip's first partition (or a whole chip)."""

    handle: Any
    first: bool
    health: _Health | None
    xcp: int | None  # its partition's index on the chip; None for a whole chip
    throttle: _Throttle = field(default_factory=_Throttle)


class AmdBackend:
    """AMD GPUs through amdsmi: MI300X/MI325X (and MI200 with fewer fields), units per DESIGN.

    A compute partition (CPX, DPX, TPX, QPX) is a device of its own: ``compute_share`` is one
    over the chip's partitions, ``peak_flops`` the model's peak times that share,
    ``memory_bytes`` the partition's own VRAM. The gpu_metrics table is the chip's, so power,
    energy, temperatures, throttle seconds and XGMI link bytes come with the chip's first
    partition only; its other partitions leave them NaN (and ``links`` empty), so that a sum of
    power or energy over partitions is the chip's, not N times it. Health and error counters
    likewise come with the first partition only, with ``chip_wide=True``. A partition's
    ``busy_ratio`` is its own XCCs' activity (``_xcp_busy``; the k-th partition of a chip, in
    ``_chips`` order, reads row k); clocks, memory activity and memory in use are reported on
    every partition as amdsmi answers for its handle (gauges, so repeating them counts nothing twice).

    Args:
        node: Node name written into every row.
        smi: The amdsmi module to use; None imports it on ``open()`` (tests pass a fake).
    """

    name = "amd"

    def __init__(self, node: str, *, smi: ModuleType | None = None) -> None:
        self.node = node
        self._smi = smi
        self._devices: list[_Device] = []
        self._bus_ids: dict[int, str] = {}
        self._health_ns: int | None = None
        self._initialized = False

    def open(self) -> list[DeviceInfo]:
        """Initialise amdsmi for AMD GPUs and describe each one (each partition of a partitioned chip).

        Returns:
            One row per GPU or partition, ordered by amdsmi's processor order.

        Raises:
            BackendUnavailable: amdsmi/ROCm missing, init refused, no GPU, or no gpu_metrics.
            BackendError: a device query failed.
        """
        self.close()  # the sampler re-opens after DeviceLost; start from a clean library state
        smi = self._smi if self._smi is not None else import_amdsmi()
        self._smi = smi
        try:
            smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        except smi.AmdSmiException as exc:
            raise BackendUnavailable(
                f"amd backend: amdsmi_init failed ({_said(exc)}); is the amdgpu driver loaded and "
                "/dev/kfd, /dev/dri readable by this user (groups video, render)?"
            ) from exc
        self._initialized = True
        try:
            handles = list(self._call(lambda: smi.amdsmi_get_processor_handles(), None, "list GPUs"))
            if not handles:
                raise BackendUnavailable("amd backend: amdsmi found no AMD GPU on this node")
            places = [self._place(gpu, h) for gpu, h in enumerate(handles)]
            infos: dict[int, DeviceInfo] = {}
            state: dict[int, _Device] = {}
            for members in _chips(places):
                first, partitioned = members[0], len(members) > 1
                for xcp, gpu in enumerate(members):
                    infos[gpu] = self._describe(gpu, handles[gpu], places[gpu], places[first], len(members))
                    health = _Health(smi, handles[gpu], gpu, partitioned) if gpu == first else None
                    state[gpu] = _Device(handles[gpu], gpu == first, health, xcp if partitioned else None)
        except BackendError:
            self.close()
            raise
        self._devices = [state[gpu] for gpu in range(len(handles))]
        self._bus_ids = {gpu: p.bdf for gpu, p in enumerate(places) if p.bdf}
        self._health_ns = None
        return [infos[gpu] for gpu in range(len(handles))]

    def pci_bus_ids(self) -> dict[int, str]:
        """GPU index → PCI bus id (``0000:c1:00.0``), the device id AMD's Kubernetes device plugin reports.

        Each handle's own address as ``amdsmi_get_gpu_device_bdf`` gave it at ``open()``. A GPU
        whose address could not be read is left out: it only loses its pod label (agent.workload).
        """
        return dict(self._bus_ids)

    def sample(self, now_ns: int) -> list[Sample]:
        """Read every GPU once: one gpu_metrics call plus one vram-usage call each, and health when due.

        Health is due on the first call after ``open()`` and then once ``HEALTH_INTERVAL_NS``
        has passed since the last reading (or the clock stepped back); it is read for every
        chip within this call and attached to this call's samples.

        Args:
            now_ns: CLOCK_REALTIME nanoseconds; becomes ``ts_ns`` and times throttle residency.

        Raises:
            DeviceLost: a GPU stopped answering; ``gpu`` names it.
            BackendError: not opened, or another amdsmi failure.
        """
        smi = self._smi
        if smi is None or not self._initialized:
            raise BackendError("amd backend: sample() called before open()")
        last = self._health_ns
        health_due = last is None or not 0 <= now_ns - last < HEALTH_INTERVAL_NS
        if health_due:
            self._health_ns = now_ns
        samples = []
        for gpu, dev in enumerate(self._devices):
            read = partial(smi.amdsmi_get_gpu_metrics_info, dev.handle)
            # A chip's metrics table must read; a further partition's may not be offered at all.
            metrics = self._call(read, gpu, "gpu metrics") if dev.first else self._optional(read, gpu, "gpu metrics")
            vram = self._optional(partial(smi.amdsmi_get_gpu_vram_usage, dev.handle), gpu, "vram usage")
            busy = _percent(metrics, "average_gfx_activity") if dev.xcp is None else _xcp_busy(metrics, dev.xcp)
            sample = Sample(
                ts_ns=now_ns,
                node=self.node,
                gpu=gpu,
                gfx_clock_mhz=self._gfx_clock(metrics),
                mem_clock_mhz=_first(metrics, ("current_uclk", "average_uclk_frequency")),
                busy_ratio=busy,
                mem_busy_ratio=_percent(metrics, "average_umc_activity"),
                mem_used_bytes=_num(vram.get("vram_used"), bits=64) * _BYTES_PER_MB,
                errors=dev.health.read() if health_due and dev.health is not None else (),
            )
            if dev.first:
                self._add_chip_values(sample, metrics, dev.throttle.update(metrics, now_ns))
            samples.append(sample)
        return samples

    def close(self) -> None:
        """Shut amdsmi down; safe to call twice or after a failed ``open()``."""
        if not self._initialized or self._smi is None:
            return
        self._initialized = False
        self._devices = []
        self._bus_ids = {}
        with contextlib.suppress(Exception):  # nothing useful to do if shutdown itself fails
            self._smi.amdsmi_shut_down()

    @staticmethod
    def _add_chip_values(sample: Sample, metrics: Mapping[str, Any], throttle: Mapping[str, float]) -> None:
        """The values of the whole chip (package power, energy, sensors, links, throttling)."""
        sample.power_w = _first(metrics, ("current_socket_power", "average_socket_power"))
        sample.energy_j = _num(metrics.get("energy_accumulator"), bits=64) * _JOULES_PER_ENERGY_COUNT
        sample.temp_c = _num(metrics.get("temperature_hotspot"))
        sample.mem_temp_c = _hottest(metrics, ("temperature_mem", "temperature_hbm"))
        sample.vr_temp_c = _hottest(metrics, ("temperature_vrgfx", "temperature_vrsoc", "temperature_vrmem"))
        sample.link_tx_bytes = _sum_links(metrics, "xgmi_write_data_acc")
        sample.link_rx_bytes = _sum_links(metrics, "xgmi_read_data_acc")
        sample.links = _links(metrics)
        sample.throttle_power_s = throttle["power"]
        sample.throttle_thermal_s = throttle["thermal"]
        sample.throttle_current_s = throttle["current"]

    @staticmethod
    def _gfx_clock(metrics: Mapping[str, Any]) -> float:
        """Mean clock over the XCCs that report one (8 on MI300X); older GPUs have one scalar.

        Zero is skipped with "N/A": the driver leaves absent XCCs unset, and a reporting XCC
        never reads 0 MHz.
        """
        xccs = [c for c in _nums(metrics.get("current_gfxclks")) if c > 0]
        if xccs:
            return sum(xccs) / len(xccs)
        return _first(metrics, ("current_gfxclk", "average_gfxclk_frequency"))

    def _place(self, gpu: int, handle: Any) -> _Place:
        """A handle's UUID, address and partition. Only the UUID must read; the rest is "" (None) if not."""
        smi = self._smi
        assert smi is not None
        uuid = str(self._call(lambda: smi.amdsmi_get_gpu_device_uuid(handle), gpu, "uuid"))
        bdf = self._placement(lambda: smi.amdsmi_get_gpu_device_bdf(handle), gpu, "pci bus id")
        kfd = self._placement(lambda: smi.amdsmi_get_gpu_kfd_info(handle), gpu, "kfd info")
        partition_id = _num(kfd.get("current_partition_id"), bits=32) if isinstance(kfd, Mapping) else NAN
        compute = self._placement(lambda: smi.amdsmi_get_gpu_compute_partition(handle), gpu, "compute partition")
        memory = self._placement(lambda: smi.amdsmi_get_gpu_memory_partition(handle), gpu, "memory partition")
        return _Place(
            bdf=_text(bdf),
            uuid=uuid,
            partition_id=None if math.isnan(partition_id) else int(partition_id),
            compute_partition=_text(compute).upper(),
            memory_partition=_text(memory).upper(),
        )

    def _placement(self, fn: Callable[[], Any], gpu: int, what: str) -> Any:
        """An identity query that may fail without failing ``open()``: None then.

        NOT_SUPPORTED is the documented answer of a GPU without partitioning (MI200, Navi) and
        passes silently; any other refusal is logged, since the GPU then loses its chip grouping.
        """
        try:
            return self._call(fn, gpu, what)
        except DeviceLost:
            raise
        except BackendError as exc:
            if getattr(exc.__cause__, "err_code", None) != _NOT_SUPPORTED:
                log.warning("event=identity_unreadable gpu=%d query=%r error=%r", gpu, what, str(exc))
            return None

    def _describe(self, gpu: int, handle: Any, place: _Place, chip: _Place, partitions: int) -> DeviceInfo:
        smi = self._smi
        assert smi is not None
        asic = self._call(lambda: smi.amdsmi_get_gpu_asic_info(handle), gpu, "asic info")
        model = str(asic.get("market_name") or "N/A")
        model = "AMD GPU" if model == "N/A" else model
        spec = find_spec(model)
        if place is chip:
            self._require_metrics(gpu, handle, model)
        clock = self._optional(
            lambda: smi.amdsmi_get_clock_info(handle, smi.AmdSmiClkType.GFX), gpu, "gfx clock info"
        )
        max_clock = _num(clock.get("max_clk"), bits=32)
        if math.isnan(max_clock) and spec is not None:
            max_clock = spec.max_gfx_clock_mhz
        vram = self._optional(lambda: smi.amdsmi_get_gpu_vram_usage(handle), gpu, "vram usage")
        memory_mb = _num(vram.get("vram_total"), bits=64)
        cap = self._optional(lambda: smi.amdsmi_get_power_cap_info(handle), gpu, "power cap")
        cap_w = _num(cap.get("power_cap"), bits=64) * _WATTS_PER_MICROWATT
        share = 1.0 / partitions
        spec_memory = int(spec.memory_bytes * share) if spec is not None else 0
        return DeviceInfo(
            node=self.node,
            gpu=gpu,
            vendor="amd",
            model=model,
            uuid=place.uuid,
            max_gfx_clock_mhz=max_clock,
            peak_flops=spec.peak_flops * share if spec is not None else NAN,
            memory_bytes=int(memory_mb) * _BYTES_PER_MB if not math.isnan(memory_mb) else spec_memory,
            power_cap_w=cap_w if cap_w > 0 else NAN,
            pci_bus_id=chip.bdf,
            partition="" if place.compute_partition == "SPX" else place.compute_partition,
            memory_partition=place.memory_partition,
            chip_uuid=chip.uuid,
            compute_share=share,
        )

    def _require_metrics(self, gpu: int, handle: Any, model: str) -> None:
        """The backend needs each chip's gpu_metrics table; without one it is unavailable."""
        smi = self._smi
        assert smi is not None
        try:
            self._call(lambda: smi.amdsmi_get_gpu_metrics_info(handle), gpu, "gpu metrics")
        except BackendError as exc:
            if getattr(exc.__cause__, "err_code", None) == _NOT_SUPPORTED:
                raise BackendUnavailable(
                    f"amd backend: GPU {gpu} ({model}) exposes no gpu_metrics table; this backend "
                    "needs an amdgpu driver with gpu_metrics (MI200 or newer)"
                ) from exc
            raise

    def _optional(self, fn: Callable[[], Mapping[str, Any]], gpu: int, what: str) -> Mapping[str, Any]:
        """A query whose absence is fine: NOT_SUPPORTED gives an empty mapping, so values are NaN."""
        try:
            return self._call(fn, gpu, what)
        except DeviceLost:
            raise
        except BackendError as exc:
            if getattr(exc.__cause__, "err_code", None) == _NOT_SUPPORTED:
                return {}
            raise

    def _call(self, fn: Callable[[], T], gpu: int | None, what: str) -> T:
        """Run one amdsmi call and map vendor exceptions to ours."""
        smi = self._smi
        assert smi is not None
        try:
            return fn()
        except smi.AmdSmiException as exc:
            code = getattr(exc, "err_code", None)
            said = _said(exc)
            where = "" if gpu is None else f" GPU {gpu}"
            if code in _LOST_CODES and gpu is not None:
                raise DeviceLost(
                    f"amd backend:{where} stopped answering ({what}: {said}); "
                    "check dmesg for an amdgpu reset or a device that fell off the bus",
                    gpu=gpu,
                ) from exc
            raise BackendError(f"amd backend:{where} {what} failed: {said}") from exc
