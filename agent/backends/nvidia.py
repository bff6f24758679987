"""The ``nvidia`` GPU backend: NVML through nvidia-ml-py (module ``pynvml``), imported lazily.

Per tick and device the backend does:

1. One batched ``nvmlDeviceGetFieldValues`` call for every counter NVML exposes as a field
   (energy, power, NVLink and PCIe bytes, clocks-event residency), each NVLink's own byte
   counters included. Each field carries its own ``nvmlReturn``; a field that failed becomes NaN
   and the rest of the row is kept.
2. Current SM and memory clocks, GPU temperature and memory in use (one call each; NVML has no
   fields for them).
3. Activity. On Hopper and newer (``nvmlGpmQueryDeviceSupport``) from GPU Performance Monitoring:
   the metrics between the previous GPM sample and this one give ``busy_ratio`` (GRAPHICS_UTIL,
   the fraction of *time* the engine had work, which is what the attribution's idle term needs;
   SM_UTIL is the fraction of SMs busy, a spatial measure), ``matrix_ratio`` (ANY_TENSOR_UTIL) and
   ``mem_busy_ratio`` (DRAM_BW_UTIL). NVML refreshes GPM counters about every 100 ms, so the
   baseline only advances once 100 ms have passed; a faster tick repeats the last ratios.
   Elsewhere ``nvmlDeviceGetUtilizationRates`` gives busy and memory-controller busy over
   NVML's own window and ``matrix_ratio`` is NaN.

``power_w`` is NVML's instantaneous power (its 1 s average where that fails); the exact mean over
an interval is the difference of ``energy_j`` divided by its length, which is what consumers
should prefer. Clocks are NVML's current values, the nearest it has to an interval mean.

Units are converted here and nowhere else: mJ → J, mW → W, KiB → bytes, ns → s, % → 0–1.

NVLink bytes. ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX``/``_RX`` count the payload bytes (KiB,
cumulative; the ``_RAW_`` pair would add protocol overhead) a link carried; nvml.h: "Link ID
needs to be specified in the scopeId field ... A scopeId of UINT_MAX returns aggregate value
summed up across all links". ``link_tx_bytes``/``link_rx_bytes`` are the UINT_MAX aggregates, as
before; ``Sample.links`` holds one entry per NVLink that was active when the backend opened,
found once per device by ``NVML_FI_DEV_NVLINK_LINK_COUNT`` ("Number of NVLinks present on the
device"; all ``NVML_NVLINK_MAX_LINKS`` indices are probed where that field is unreadable) and
``nvmlDeviceGetNvLinkState``. Their (field, link) pairs join the one batched field read, so N
links add 2·N entries to that call, never a call of their own. A GPU without NVLink (a PCIe
card) has no active link and an empty ``links``.

==========================================  =========  ==========================================
NVML                                        unit       ``Sample``
==========================================  =========  ==========================================
NVLINK_THROUGHPUT_DATA_TX, scopeId UINT_MAX  KiB        link_tx_bytes (×1024)
NVLINK_THROUGHPUT_DATA_RX, scopeId UINT_MAX  KiB        link_rx_bytes (×1024)
NVLINK_THROUGHPUT_DATA_TX/RX, scopeId link   KiB        links[i].tx_bytes / rx_bytes (×1024)
==========================================  =========  ==========================================

Throttle causes. NVML accrues nanoseconds per clocks-event reason; they map to the data model as

- ``power``: SW_POWER_CAP, the power-capping algorithm holding clocks under the power limit;
- ``thermal``: SW_THERM_SLOWDOWN (GPU or memory above max operating temperature) plus
  HW_THERM_SLOWDOWN (hardware halving the clocks because the die is too hot);
- ``current``: HW_POWER_BRAKE_SLOWDOWN, an external power-brake signal from the board or PSU that
  halves the clocks. It is an electrical-supply protection, the NVIDIA counterpart of AMD's
  PROCHOT/EDC limits, and not the software power cap, so it does not belong under ``power``;
- ``other``: SYNC_BOOST, clocks held to the slowest GPU of a sync-boost group.

The generic HW_SLOWDOWN reason has no accumulated counter in NVML, so it cannot be attributed.
Where a cause has several counters they are summed, skipping those that failed; the cause is NaN
only when all of them failed.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.backends.base import BackendError, BackendUnavailable, DeviceLost
from agent.backends.specs import find_spec
from chopper.schema import NAN, DeviceInfo, LinkBytes, Sample

log = logging.getLogger(__name__)

# Asks NVML for a link counter summed over all NVLinks (nvml.h: scopeId UINT_MAX).
_ALL_LINKS = 0xFFFFFFFF
# Per-link byte counters: the same fields as the summed ones, with the link index as scopeId.
_LINK_FIELDS = ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX")
_KIB = 1024
# nvmlGpmMetricsGet needs samples at least this far apart (NVML's GPM refresh period).
_GPM_MIN_INTERVAL_NS = 100_000_000

# (key, pynvml constant, scopeId, multiplier, divisor, cumulative): raw NVML value × mul / div is
# the data-model unit. Ids come from the installed pynvml because NVML renumbered some of them
# (the clocks-event counters) between releases.
_FIELDS: tuple[tuple[str, str, int, int, int, bool], ...] = (
    ("energy_j", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0, 1, 1000, True),  # mJ since driver load
    ("power_instant_w", "NVML_FI_DEV_POWER_INSTANT", 0, 1, 1000, False),  # mW, scope GPU
    ("power_average_w", "NVML_FI_DEV_POWER_AVERAGE", 0, 1, 1000, False),  # mW over 1 s, fallback
    ("link_tx_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", _ALL_LINKS, _KIB, 1, True),  # KiB
    ("link_rx_bytes", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", _ALL_LINKS, _KIB, 1, True),  # KiB
    ("pcie_tx_bytes", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 0, 1, 1, True),  # bytes, may wrap
    ("pcie_rx_bytes", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 0, 1, 1, True),  # bytes, may wrap
    ("sw_power_cap_s", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", 0, 1, 10**9, True),  # ns
    ("sync_boost_s", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", 0, 1, 10**9, True),
    ("sw_thermal_s", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN", 0, 1, 10**9, True),
    ("hw_thermal_s", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", 0, 1, 10**9, True),
    ("hw_power_brake_s", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN", 0, 1, 10**9, True),
)
_THROTTLE: dict[str, tuple[str, ...]] = {
    "throttle_power_s": ("sw_power_cap_s",),
    "throttle_thermal_s": ("sw_thermal_s", "hw_thermal_s"),
    "throttle_current_s": ("hw_power_brake_s",),
    "throttle_other_s": ("sync_boost_s",),
}
_GPM_METRICS = ("NVML_GPM_METRIC_GRAPHICS_UTIL", "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
                "NVML_GPM_METRIC_DRAM_BW_UTIL")
# nvmlValueType_t → member of the c_nvmlValue_t union (the enum is part of the NVML ABI).
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# Narrow unsigned types wrap ("Value can be wrapped", nvml.h on the PCIe counters): unwrap them.
_WRAP_MODULUS = {1: 2**32, 6: 2**16}

# Errors meaning the device is gone, and errors meaning only this value cannot be read.
_LOST = ("GPU_IS_LOST", "UNKNOWN", "NOT_FOUND", "GPU_NOT_FOUND", "RESET_REQUIRED")
_UNREADABLE = ("NOT_SUPPORTED", "NO_DATA", "NOT_READY", "FUNCTION_NOT_FOUND")


def import_nvml() -> Any:
    """Import pynvml, or raise BackendUnavailable naming the package to install."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:
        raise BackendUnavailable(
            "the nvidia backend needs nvidia-ml-py (module pynvml), which is not installed: "
            "pip install 'chopper-telemetry[nvidia]'"
        ) from e


@dataclass
class _Device:
    """Per-GPU state carried from tick to tick."""

    index: int
    handle: Any
    gpm: bool
    gpm_base: Any = None  # GPM sample of the start of the current interval
    gpm_next: Any = None  # buffer the next GPM sample is read into
    gpm_base_ns: int = 0
    gpm_ratios: tuple[float, float, float] = (NAN, NAN, NAN)
    wraps: dict[str, tuple[int, int]] = field(default_factory=dict)  # key → (last raw, offset)
    links: tuple[int, ...] = ()  # NVLinks active at open(), whose TX/RX follow the common fields
    field_ids: list[tuple[int, int]] = field(default_factory=list)  # (field id, scopeId) of the one read


class NvidiaBackend:
    """NVIDIA GPUs through NVML.

    Args:
        node: Node name written into every row.
        nvml: The pynvml module, or a stand-in for tests; imported on ``open()`` when None.
        clock_ns: CLOCK_REALTIME nanoseconds; times the GPM baseline taken by ``open()``.
    """

    name = "nvidia"

    def __init__(self, node: str, nvml: Any | None = None,
                 clock_ns: Callable[[], int] = time.time_ns) -> None:
        self.node = node
        self._nv: Any = nvml  # the pynvml module once opened
        self._clock_ns = clock_ns
        self._devices: list[_Device] = []
        self._field_ids: list[tuple[int, int]] = []
        self._field_keys: list[tuple[str, int, int, bool]] = []
        self._lost: set[int] = set()
        self._unreadable: set[int] = set()
        self._initialized = False

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> list[DeviceInfo]:
        """Initialise NVML and describe every GPU.

        Returns:
            One row per GPU: max SM clock (MHz), memory (bytes), enforced power limit (W) and
            ``peak_flops`` from ``agent.backends.specs`` (NaN for a model it does not know).

        Raises:
            BackendUnavailable: pynvml or the driver is missing, or there is no GPU.
            BackendError: NVML failed otherwise.
        """
        self.close()
        if self._nv is None:
            self._nv = import_nvml()
        nv = self._nv
        self._lost, self._unreadable = _codes(nv, _LOST), _codes(nv, _UNREADABLE)
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            raise self._init_error(e) from e
        self._initialized = True
        try:
            return self._describe()
        except BaseException:
            self.close()
            raise

    def _describe(self) -> list[DeviceInfo]:
        nv = self._nv
        self._field_keys = []
        for key, const, scope, mul, div, cumulative in _FIELDS:
            if hasattr(nv, const):  # an older pynvml lacks newer fields: they stay NaN
                self._field_keys.append((key, mul, div, cumulative))
                self._field_ids.append((getattr(nv, const), scope))
        try:
            count = nv.nvmlDeviceGetCount()
            if count == 0:
                raise BackendUnavailable("NVML answers but reports no NVIDIA GPU on this node")
            infos = []
            for i in range(count):
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                model = _text(nv.nvmlDeviceGetName(handle))
                spec = find_spec(model)
                infos.append(DeviceInfo(
                    node=self.node,
                    gpu=i,
                    vendor="nvidia",
                    model=model,
                    uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                    max_gfx_clock_mhz=float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
                    peak_flops=spec.peak_flops if spec else NAN,
                    memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
                    power_cap_w=nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
                ))
                dev = _Device(i, handle, gpm=False)
                dev.links = self._active_links(dev)
                link_ids = [getattr(nv, c) for c in _LINK_FIELDS] if dev.links else []
                dev.field_ids = [*self._field_ids, *((fid, link) for link in dev.links for fid in link_ids)]
                self._devices.append(dev)
                self._start_gpm(dev)
        except nv.NVMLError as e:
            raise BackendError(f"NVML failed while listing GPUs: {e}") from e
        return infos

    def _active_links(self, dev: _Device) -> tuple[int, ...]:
        """The NVLinks of ``dev`` that are up now, by NVML link index; () without NVLink.

        ``NVML_FI_DEV_NVLINK_LINK_COUNT`` bounds the indices probed (all ``NVML_NVLINK_MAX_LINKS``
        where it cannot be read); a link whose state NVML will not give is left out.
        """
        nv = self._nv
        if not all(hasattr(nv, c) for c in _LINK_FIELDS):
            return ()
        count = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0))
        if hasattr(nv, "NVML_FI_DEV_NVLINK_LINK_COUNT"):
            got = self._call(dev, nv.nvmlDeviceGetFieldValues, dev.handle, [(nv.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
            if got is not None and got[0].nvmlReturn == nv.NVML_SUCCESS:
                count = min(count, int(getattr(got[0].value, _VALUE_MEMBER.get(got[0].valueType, "uiVal"))))
        active = []
        for link in range(count):
            try:
                up = nv.nvmlDeviceGetNvLinkState(dev.handle, link) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError as e:
                if e.value in self._lost:
                    raise
                up = False  # NOT_SUPPORTED or INVALID_ARGUMENT: no such link here
            if up:
                active.append(link)
        log.info("event=nvlinks gpu=%d active=%d present=%d", dev.index, len(active), count)
        return tuple(active)

    def _start_gpm(self, dev: _Device) -> None:
        """Take the first GPM baseline where the device supports GPM."""
        nv = self._nv
        fallback = ("busy_ratio comes from nvmlDeviceGetUtilizationRates (the share of time any kernel ran) "
                    "and matrix activity is not measured, so counter-derived MFU is n/a")
        try:
            if not nv.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice:
                log.info("event=gpm_unsupported gpu=%d note=%s", dev.index, fallback)
                return
            dev.gpm_base = nv.nvmlGpmSampleAlloc()
            dev.gpm_next = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(dev.handle, dev.gpm_base)
        except nv.NVMLError as e:
            if e.value in self._lost:
                raise
            # Pre-Hopper GPU, a driver without GPM, MIG mode, or GPM refused to this user: the
            # operator is told once which figures it costs, then utilization rates are used.
            log.warning("event=gpm_refused gpu=%d error=%r note=%s", dev.index, str(e), fallback)
            return
        dev.gpm = True
        dev.gpm_base_ns = self._clock_ns()

    def close(self) -> None:
        """Free GPM buffers and shut NVML down; safe twice and after a failed ``open()``."""
        nv = self._nv
        for dev in self._devices:
            for buf in (dev.gpm_base, dev.gpm_next):
                if buf is not None:
                    # The device may be gone; then there is nothing left to release.
                    with contextlib.suppress(nv.NVMLError):
                        nv.nvmlGpmSampleFree(buf)
        self._devices = []
        self._field_ids = []
        if self._initialized:
            self._initialized = False
            # A lost driver cannot be shut down cleanly, and there is nothing to retry.
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()

    # ---------------------------------------------------------------- sampling

    def sample(self, now_ns: int) -> list[Sample]:
        """Read every GPU once.

        Args:
            now_ns: CLOCK_REALTIME nanoseconds, the ``ts_ns`` of every row.

        Raises:
            DeviceLost: a GPU stopped answering (``gpu`` names it).
            BackendError: NVML failed otherwise, or ``open()`` was not called.
        """
        if not self._initialized:
            raise BackendError("nvidia backend sampled before open()")
        return [self._sample_device(dev, now_ns) for dev in self._devices]

    def _sample_device(self, dev: _Device, now_ns: int) -> Sample:
        nv = self._nv
        h = dev.handle
        f, links = self._read_fields(dev)
        power = f["power_instant_w"]
        if math.isnan(power):
            power = f["power_average_w"]
        mem = self._call(dev, nv.nvmlDeviceGetMemoryInfo, h)
        if dev.gpm:
            busy, matrix, mem_busy = self._gpm_ratios(dev, now_ns)
        else:
            util = self._call(dev, nv.nvmlDeviceGetUtilizationRates, h)
            busy, matrix, mem_busy = ((NAN, NAN, NAN) if util is None
                                      else (util.gpu / 100, NAN, util.memory / 100))
        s = Sample(
            ts_ns=now_ns,
            node=self.node,
            gpu=dev.index,
            gfx_clock_mhz=_num(self._call(dev, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)),
            mem_clock_mhz=_num(self._call(dev, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)),
            busy_ratio=busy,
            matrix_ratio=matrix,
            mem_busy_ratio=mem_busy,
            power_w=power,
            energy_j=f["energy_j"],
            # NVML exposes no hotspot sensor on NVIDIA parts; the GPU die sensor is the closest.
            temp_c=_num(self._call(dev, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
            mem_used_bytes=NAN if mem is None else float(mem.used),
            link_tx_bytes=f["link_tx_bytes"],
            link_rx_bytes=f["link_rx_bytes"],
            pcie_tx_bytes=f["pcie_tx_bytes"],
            pcie_rx_bytes=f["pcie_rx_bytes"],
            links=links,
        )
        for column, keys in _THROTTLE.items():
            setattr(s, column, _nansum(f[k] for k in keys))
        return s

    def _read_fields(self, dev: _Device) -> tuple[dict[str, float], tuple[LinkBytes, ...]]:
        """One batched field read, converted to data-model units, and each active link's bytes.

        Failed fields are NaN; the per-link counters are 64-bit (never wrap) and taken as read.
        """
        nv = self._nv
        out = {key: NAN for key, *_ in _FIELDS}
        values = self._call(dev, nv.nvmlDeviceGetFieldValues, dev.handle, dev.field_ids)
        if values is None:
            return out, tuple(LinkBytes(link, NAN, NAN) for link in dev.links)
        common = len(self._field_keys)
        for (key, mul, div, cumulative), fv in zip(self._field_keys, values[:common], strict=True):
            raw = self._raw(dev, fv)
            if raw is None:
                continue
            modulus = _WRAP_MODULUS.get(fv.valueType)
            if cumulative and modulus is not None:
                raw = self._unwrap(dev, key, int(raw), modulus)
            out[key] = raw * mul / div
        links = []
        for i, link in enumerate(dev.links):
            tx_raw, rx_raw = self._raw(dev, values[common + 2 * i]), self._raw(dev, values[common + 2 * i + 1])
            links.append(LinkBytes(link, NAN if tx_raw is None else tx_raw * _KIB,
                                   NAN if rx_raw is None else rx_raw * _KIB))
        return out, tuple(links)

    def _raw(self, dev: _Device, fv: Any) -> Any:
        """One field's raw value; None when NVML could not read it, DeviceLost when the GPU is gone."""
        nv = self._nv
        if fv.nvmlReturn != nv.NVML_SUCCESS:
            if fv.nvmlReturn in self._lost:
                raise DeviceLost(f"GPU {dev.index} lost while reading NVML fields", gpu=dev.index)
            return None
        return getattr(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal"))

    @staticmethod
    def _unwrap(dev: _Device, key: str, raw: int, modulus: int) -> int:
        """Extend a narrow wrapping counter into a monotonic one (assumes ≤ 1 wrap per tick)."""
        last, offset = dev.wraps.get(key, (raw, 0))
        if raw < last:
            offset += modulus
        dev.wraps[key] = (raw, offset)
        return raw + offset

    def _gpm_ratios(self, dev: _Device, now_ns: int) -> tuple[float, float, float]:
        """GPM busy, tensor and DRAM-bandwidth ratios between the baseline sample and now."""
        nv = self._nv
        if now_ns - dev.gpm_base_ns < _GPM_MIN_INTERVAL_NS:
            return dev.gpm_ratios
        if self._call(dev, nv.nvmlGpmSampleGet, dev.handle, dev.gpm_next) is None:
            return (NAN, NAN, NAN)
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(_GPM_METRICS)
        get.sample1 = dev.gpm_base
        get.sample2 = dev.gpm_next
        for i, const in enumerate(_GPM_METRICS):
            get.metrics[i].metricId = getattr(nv, const)
        got = self._call(dev, nv.nvmlGpmMetricsGet, get)
        ratios = tuple(
            NAN if got is None or got.metrics[i].nvmlReturn != nv.NVML_SUCCESS
            else min(max(got.metrics[i].value / 100, 0.0), 1.0)  # NVML rounding can pass 100 %
            for i in range(len(_GPM_METRICS))
        )
        # The sample just read is the start of the next interval; the old baseline is reused.
        dev.gpm_base, dev.gpm_next = dev.gpm_next, dev.gpm_base
        dev.gpm_base_ns = now_ns
        dev.gpm_ratios = (ratios[0], ratios[1], ratios[2])
        return dev.gpm_ratios

    # ---------------------------------------------------------------- errors

    def _call(self, dev: _Device, fn: Callable[..., Any], *args: Any) -> Any:
        """Call NVML for one device: None when the value is unreadable here, else raise ours."""
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if e.value in self._lost:
                raise DeviceLost(f"GPU {dev.index} stopped answering NVML: {e}", gpu=dev.index) from e
            if e.value in self._unreadable:
                return None
            name = getattr(fn, "__name__", "call")
            raise BackendError(f"NVML {name} failed on GPU {dev.index}: {e}") from e

    def _init_error(self, e: Any) -> BackendError:
        nv = self._nv
        fixes = {
            nv.NVML_ERROR_LIBRARY_NOT_FOUND:
                "libnvidia-ml.so.1 was not found: install the NVIDIA driver on this node",
            nv.NVML_ERROR_DRIVER_NOT_LOADED:
                "the NVIDIA kernel driver is not loaded: install or load it (modprobe nvidia)",
            nv.NVML_ERROR_NO_PERMISSION:
                "no permission to open the NVIDIA devices: run the agent with access to /dev/nvidia*",
            nv.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
                "NVML and the loaded kernel driver differ in version: reboot or reload the driver",
        }
        fix = fixes.get(e.value)
        if fix is not None:
            return BackendUnavailable(f"nvidia backend unavailable ({e}): {fix}")
        return BackendError(f"nvmlInit failed: {e}")


def _text(value: str | bytes) -> str:
    """NVML strings: pynvml ≥ 11 decodes them, older releases return bytes."""
    return value.decode() if isinstance(value, bytes) else value


def _num(value: Any) -> float:
    return NAN if value is None else float(value)


def _nansum(values: Any) -> float:
    """Sum, skipping NaN; NaN only when every value is NaN."""
    present = [v for v in values if not math.isnan(v)]
    return math.fsum(present) if present else NAN


def _codes(nv: Any, names: tuple[str, ...]) -> set[int]:
    """NVML_ERROR_* values by suffix; a code this pynvml does not define is left out."""
    return {getattr(nv, "NVML_ERROR_" + n) for n in names if hasattr(nv, "NVML_ERROR_" + n)}
