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
xgmi_{read,write}_data_acc  KB per link (KiB, ×1024)          link_{rx,tx}_bytes (sum of links)
xgmi_{read,write}_data_acc  KB per link (KiB, ×1024)          links[k].{rx,tx}_bytes (link k)
vram_used                   MiB                               mem_used_bytes
*_residency_acc             firmware iterations throttled     throttle_*_s (see ``_Throttle``)
==========================  ================================  ==================================

XGMI reads bring data into this GPU (rx) and writes send it out (tx). Entry k of the per-link
lists is XGMI link k; ``Sample.links`` holds the links whose counters read as numbers, leaving out
those ``xgmi_link_status`` (gpu_metrics v1.7, where present) reports down or disabled: an MI300X in an
8-GPU hive has seven active links, one to each peer. Fields MI300 does not
expose stay NaN: ``matrix_ratio`` (no MFMA activity counter), ``pcie_tx_bytes``/``pcie_rx_bytes``
(``pcie_bandwidth_acc`` is an accumulated GB/s figure with no direction, not a byte counter) and
``throttle_other_s`` (no residency counter for causes beyond power, thermal and current). Any
field amdsmi reports as ``"N/A"``, leaves out, or fills with an all-ones sentinel reads as NaN.
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
from chopper.schema import NAN, DeviceInfo, LinkBytes, Sample

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


class AmdBackend:
    """AMD GPUs through amdsmi: MI300X/MI325X (and MI200 with fewer fields), units per DESIGN.

    Args:
        node: Node name written into every row.
        smi: The amdsmi module to use; None imports it on ``open()`` (tests pass a fake).
    """

    name = "amd"

    def __init__(self, node: str, *, smi: ModuleType | None = None) -> None:
        self.node = node
        self._smi = smi
        self._handles: list[Any] = []
        self._throttle: list[_Throttle] = []
        self._initialized = False

    def open(self) -> list[DeviceInfo]:
        """Initialise amdsmi for AMD GPUs and describe each one.

        Returns:
            One row per GPU, ordered by amdsmi's processor order.

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
            self._handles = list(self._call(lambda: smi.amdsmi_get_processor_handles(), None, "list GPUs"))
            if not self._handles:
                raise BackendUnavailable("amd backend: amdsmi found no AMD GPU on this node")
            devices = [self._describe(i, h) for i, h in enumerate(self._handles)]
        except BackendError:
            self.close()
            raise
        self._throttle = [_Throttle() for _ in self._handles]
        return devices

    def pci_bus_ids(self) -> dict[int, str]:
        """GPU index → PCI bus id (``0000:c1:00.0``), the device id AMD's Kubernetes device plugin reports.

        A GPU whose address cannot be read is left out: it only loses its pod label (agent.workload).
        """
        smi = self._smi
        ids: dict[int, str] = {}
        if smi is None:
            return ids
        for gpu, handle in enumerate(self._handles):
            try:
                ids[gpu] = str(smi.amdsmi_get_gpu_device_bdf(handle))
            except smi.AmdSmiException as exc:
                log.warning("event=pci_bus_id_unreadable gpu=%d error=%r", gpu, _said(exc))
        return ids

    def sample(self, now_ns: int) -> list[Sample]:
        """Read every GPU once: one gpu_metrics call plus one vram-usage call each.

        Args:
            now_ns: CLOCK_REALTIME nanoseconds; becomes ``ts_ns`` and times throttle residency.

        Raises:
            DeviceLost: a GPU stopped answering; ``gpu`` names it.
            BackendError: not opened, or another amdsmi failure.
        """
        smi = self._smi
        if smi is None or not self._initialized:
            raise BackendError("amd backend: sample() called before open()")
        samples = []
        for gpu, handle in enumerate(self._handles):
            metrics = self._call(partial(smi.amdsmi_get_gpu_metrics_info, handle), gpu, "gpu metrics")
            vram = self._optional(partial(smi.amdsmi_get_gpu_vram_usage, handle), gpu, "vram usage")
            throttle = self._throttle[gpu].update(metrics, now_ns)
            samples.append(Sample(
                ts_ns=now_ns,
                node=self.node,
                gpu=gpu,
                gfx_clock_mhz=self._gfx_clock(metrics),
                mem_clock_mhz=_first(metrics, ("current_uclk", "average_uclk_frequency")),
                busy_ratio=_percent(metrics, "average_gfx_activity"),
                mem_busy_ratio=_percent(metrics, "average_umc_activity"),
                power_w=_first(metrics, ("current_socket_power", "average_socket_power")),
                energy_j=_num(metrics.get("energy_accumulator"), bits=64) * _JOULES_PER_ENERGY_COUNT,
                temp_c=_num(metrics.get("temperature_hotspot")),
                mem_used_bytes=_num(vram.get("vram_used"), bits=64) * _BYTES_PER_MB,
                link_tx_bytes=_sum_links(metrics, "xgmi_write_data_acc"),
                link_rx_bytes=_sum_links(metrics, "xgmi_read_data_acc"),
                links=_links(metrics),
                throttle_power_s=throttle["power"],
                throttle_thermal_s=throttle["thermal"],
                throttle_current_s=throttle["current"],
            ))
        return samples

    def close(self) -> None:
        """Shut amdsmi down; safe to call twice or after a failed ``open()``."""
        if not self._initialized or self._smi is None:
            return
        self._initialized = False
        self._handles = []
        with contextlib.suppress(Exception):  # nothing useful to do if shutdown itself fails
            self._smi.amdsmi_shut_down()

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

    def _describe(self, gpu: int, handle: Any) -> DeviceInfo:
        smi = self._smi
        assert smi is not None
        asic = self._call(lambda: smi.amdsmi_get_gpu_asic_info(handle), gpu, "asic info")
        model = str(asic.get("market_name") or "N/A")
        model = "AMD GPU" if model == "N/A" else model
        uuid = str(self._call(lambda: smi.amdsmi_get_gpu_device_uuid(handle), gpu, "uuid"))
        spec = find_spec(model)
        try:
            self._call(lambda: smi.amdsmi_get_gpu_metrics_info(handle), gpu, "gpu metrics")
        except BackendError as exc:
            if getattr(exc.__cause__, "err_code", None) == _NOT_SUPPORTED:
                raise BackendUnavailable(
                    f"amd backend: GPU {gpu} ({model}) exposes no gpu_metrics table; this backend "
                    "needs an amdgpu driver with gpu_metrics (MI200 or newer)"
                ) from exc
            raise
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
        spec_memory = spec.memory_bytes if spec is not None else 0
        return DeviceInfo(
            node=self.node,
            gpu=gpu,
            vendor="amd",
            model=model,
            uuid=uuid,
            max_gfx_clock_mhz=max_clock,
            peak_flops=spec.peak_flops if spec is not None else NAN,
            memory_bytes=int(memory_mb) * _BYTES_PER_MB if not math.isnan(memory_mb) else spec_memory,
            power_cap_w=cap_w if cap_w > 0 else NAN,
        )

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
