"""The ``nvidia`` GPU backend: NVML through nvidia-ml-py (module ``pynvml``), imported lazily.

Per tick and physical GPU (a *chip*) the backend does:

1. One batched ``nvmlDeviceGetFieldValues`` call for every counter NVML exposes as a field
   (energy, power, HBM temperature, NVLink and PCIe bytes, clocks-event residency), each NVLink's own byte
   counters included, and on a health tick the NVLink error counters. Each field carries its own
   ``nvmlReturn``; a field that failed becomes NaN and the rest of the row is kept.
2. Current SM and memory clocks and GPU temperature (one call each; NVML has no fields for them).
3. Per device (the chip, or each of its MIG devices): memory in use and activity. On Hopper and
   newer (``nvmlGpmQueryDeviceSupport``) from GPU Performance Monitoring: the metrics between the
   previous GPM sample and this one give ``busy_ratio`` (GRAPHICS_UTIL, the fraction of *time* the
   engine had work, which is what the attribution's idle term needs; SM_UTIL is the fraction of
   SMs busy, a spatial measure), ``matrix_ratio`` (ANY_TENSOR_UTIL) and ``mem_busy_ratio``
   (DRAM_BW_UTIL). NVML refreshes GPM counters about every 100 ms, so the baseline only advances
   once 100 ms have passed; a faster tick repeats the last ratios. Elsewhere
   ``nvmlDeviceGetUtilizationRates`` gives busy and memory-controller busy over NVML's own window.
4. At most once per ``HEALTH_INTERVAL_NS``: the health and error counters (below).

``power_w`` is NVML's instantaneous power (its 1 s average where that fails); the exact mean over
an interval is the difference of ``energy_j`` divided by its length, which is what consumers
should prefer. Clocks are NVML's current values, the nearest it has to an interval mean.

``mem_temp_c`` is ``NVML_FI_DEV_MEMORY_TEMP`` ("Memory temperature for the device", °C); NVML
reads no voltage-regulator sensor, so ``vr_temp_c`` stays NaN.

Units are converted here and nowhere else: mJ → J, mW → W, KiB → bytes, ns → s, % → 0–1.

Matrix activity. ``matrix_ratio`` comes from a hardware counter only where GPM answers: NVIDIA
Hopper (H100, H200) and newer, whole chips and MIG devices alike. Before Hopper (A100, V100, ...)
NVML has no tensor-activity counter and ``matrix_ratio`` is NaN, so the agent's
``chopper_gpu_counter_flops_ratio`` (matrix_ratio × SM clock ÷ max SM clock) is absent there; DCGM's
profiling field ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` would provide it on those GPUs. A Hopper GPU whose
driver refuses GPM (an old driver, no permission) is NaN too, and says so in the log once.

NVLink bytes. ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX``/``_RX`` count the payload bytes (KiB,
cumulative; the ``_RAW_`` pair would add protocol overhead) a link carried; nvml.h: "Link ID
needs to be specified in the scopeId field ... A scopeId of UINT_MAX returns aggregate value
summed up across all links". ``link_tx_bytes``/``link_rx_bytes`` are the UINT_MAX aggregates, as
before; ``Sample.links`` holds one entry per NVLink that was active when the backend opened,
found once per chip by ``NVML_FI_DEV_NVLINK_LINK_COUNT`` ("Number of NVLinks present on the
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

Health. The first tick and then every tick at least ``HEALTH_INTERVAL_NS`` after the last reading
carries ``Sample.errors``; the other ticks carry ``()``. All of it is read from the chip's handle
(NVML counts errors per physical GPU), one query after another:

=====================================================  ===============  =====================================
NVML call (nvml.h names)                               NVML unit        ``ErrorCount`` (kind, window, detail)
=====================================================  ===============  =====================================
nvmlEventSetWait_v2, nvmlEventTypeXidCriticalError     one event        xid, "", the XID code (eventData):
                                                                        events counted since open()
nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_    errors           ecc_corrected / ecc_uncorrected,
CORRECTED|UNCORRECTED, NVML_VOLATILE_ECC|                               volatile (since the driver loaded) /
NVML_AGGREGATE_ECC), only while nvmlDeviceGetEccMode                    aggregate (lifetime), "total"
says the current mode is NVML_FEATURE_ENABLED
nvmlDeviceGetRetiredPages(NVML_PAGE_RETIREMENT_CAUSE_  page addresses   retired_pages, "", single_bit /
MULTIPLE_SINGLE_BIT_ECC_ERRORS|DOUBLE_BIT_ECC_ERROR)   (counted)        double_bit
nvmlDeviceGetRetiredPagesPendingStatus                 nvmlEnableState  retirement_pending, 0/1
nvmlDeviceGetRemappedRows: corrRows, uncRows           rows             remapped_rows, "", correctable /
                                                                        uncorrectable
nvmlDeviceGetRemappedRows: isPending, failureOccurred  0/1              remap_pending, remap_failed
nvmlDeviceGetPcieReplayCounter                         replays          pcie_replay
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL          errors           link_crc, "", flit
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL          errors           link_crc, "", data
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL            replays          link_replay
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL          recoveries       link_recovery
=====================================================  ===============  =====================================

- XID events: ``open()`` creates one event set per chip and registers it for
  ``nvmlEventTypeXidCriticalError``; each health reading drains it with ``nvmlEventSetWait_v2`` and
  a 0 ms timeout (NVML_ERROR_TIMEOUT: nothing pending), so the sampler never blocks on it. A chip
  that cannot register (NVML_ERROR_NOT_SUPPORTED, as on GPUs and drivers without event support, or
  no permission) reads no XIDs and reports no ``xid`` counter; the log says so once.
- Page retirement is what GPUs before Ampere do; Ampere and newer remap rows instead. NVML
  answers NOT_SUPPORTED for the one a GPU does not do, so after its first reading each chip asks
  only the one it has.
- NVLink errors: nvml.h documents each ``_TOTAL`` field as the counter "total for all Lanes" (the
  per-link fields are named after lanes in nvml.h's older naming and stop at 12 links), which is
  the sum of ``nvmlDeviceGetNvLinkErrorCounter`` with NVML_NVLINK_ERROR_DL_CRC_FLIT, DL_CRC_DATA,
  DL_REPLAY and DL_RECOVERY over the chip's links, read as four entries of the tick's one batched
  field call instead of 4 calls per link. It includes a link that went down before the backend
  opened, whose errors are the ones that matter. Asked only on chips with an active NVLink.
- Errors: any NVML error of one health query (NOT_SUPPORTED, NO_PERMISSION, GPU_IS_LOST, ...)
  leaves that counter out of that reading and never fails the sample (a lost GPU is found by the
  regular readings). A query answering NOT_SUPPORTED (or FUNCTION_NOT_FOUND, an older driver) is
  remembered per chip and not asked again (logged once, at info); any other failure is asked again
  at the next reading and logged once per chip and query (``event=health_query_failed``).

MIG. A chip whose current mode (``nvmlDeviceGetMigMode``) is NVML_DEVICE_MIG_ENABLE is described by
its MIG devices instead of itself: indices 0 to ``nvmlDeviceGetMaxMigDeviceCount`` − 1 through
``nvmlDeviceGetMigDeviceHandleByIndex`` (NVML_ERROR_NOT_FOUND: no device at that index). A
MIG-enabled chip with no MIG device created contributes no device. Each MIG device has

- its own ``uuid`` (``MIG-...``) and ``memory_bytes`` (``nvmlDeviceGetMemoryInfo`` of its handle);
- ``partition`` "MIG <profile>", the tail of ``nvmlDeviceGetName`` of its handle ("NVIDIA H100
  80GB HBM3 MIG 3g.40gb"); ``model`` is the chip's name, so the spec table still finds it;
- ``compute_share`` = its SMs (``nvmlDeviceGetAttributes``: multiprocessorCount) ÷ the chip's SMs,
  the most SMs of any GPU-instance profile the chip offers (``nvmlDeviceGetGpuInstanceProfileInfo``
  over every profile: the full 7g profile). SMs, not slices: an H100 SXM5 3g.40gb holds 60 of 132
  SMs (0.455), not 3/7. On A100 the 7g profile holds 98 of the die's 108 SMs, so shares there are of
  the compute MIG can use. ``peak_flops`` is the chip's × that share. Where NVML will not give the
  SM counts, the share is the memory share and ``peak_flops`` is NaN (MFU n/a), as the log says;
- the chip's ``pci_bus_id``, ``max_gfx_clock_mhz`` and ``power_cap_w``, and ``chip_uuid`` = the
  chip's uuid (a whole chip's ``chip_uuid`` is its own uuid).

GPU indices are consecutive over all devices, chips in NVML index order and a chip's MIG devices in
MIG index order: a node of a MIG GPU with two instances then a whole GPU has gpu 0, 1 (the MIG
devices) and 2. Per MIG device the backend reads memory in use (its handle) and activity from GPM
on MIG (``nvmlGpmMigSampleGet`` with its GPU instance id, ``nvmlDeviceGetGpuInstanceId``) on
Hopper and newer; NVML gives no utilisation of a MIG device otherwise (UtilizationRates answers
NOT_SUPPORTED under MIG), so before Hopper a MIG device's activity ratios are NaN. What NVML reads
per physical GPU comes from the chip's handle: SM and memory clocks are repeated on every MIG device
(one clock domain drives them all, and each device's counter-derived FLOP ratio and DVFS loss need
it; repeating a gauge double-counts nothing). Power, energy, temperature, NVLink and PCIe bytes,
per-link bytes, throttle residency and the health counters are reported once, on the chip's first
MIG device (the others have NaN and no links or errors), so a sum over devices counts the chip
once; its health counters carry ``chip_wide=True``. That includes XIDs: NVML's event data names the
GPU instance of an XID, but the backend counts a MIG chip's XIDs on the chip.

Identity: every device's ``pci_bus_id`` is ``nvmlDeviceGetPciInfo(...).busId`` of its chip
("00000000:1B:00.0"); "" where NVML does not give it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.backends.base import BackendError, BackendUnavailable, DeviceLost
from agent.backends.specs import find_spec
from chopper.schema import NAN, DeviceInfo, ErrorCount, LinkBytes, Sample

log = logging.getLogger(__name__)

# Health and error counters are read at most this often (ns): they move rarely, and some of their
# queries (retired pages, the ECC totals) walk driver tables.
HEALTH_INTERVAL_NS = 10**9
# Most XID events taken from one chip's event set per health reading; the rest wait for the next.
_MAX_EVENTS_PER_READ = 1024

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
    ("mem_temp_c", "NVML_FI_DEV_MEMORY_TEMP", 0, 1, 1, False),  # degrees C, the HBM sensor
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

# NVLink error counters summed over the chip's links, read on health ticks: (pynvml field, kind, detail).
_LINK_ERROR_FIELDS = (
    ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "link_crc", "flit"),
    ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "link_crc", "data"),
    ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "link_replay", ""),
    ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "link_recovery", ""),
)
_ECC_TYPES = (("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
              ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"))
_ECC_WINDOWS = (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC"))
_RETIREMENT_CAUSES = (("single_bit", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                      ("double_bit", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"))

# Errors meaning the device is gone, errors meaning only this value cannot be read, and errors
# meaning a query can never be answered here (so it is not asked again).
_LOST = ("GPU_IS_LOST", "UNKNOWN", "NOT_FOUND", "GPU_NOT_FOUND", "RESET_REQUIRED")
_UNREADABLE = ("NOT_SUPPORTED", "NO_DATA", "NOT_READY", "FUNCTION_NOT_FOUND")
_UNSUPPORTED = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND")


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
class _Chip:
    """One physical GPU: what NVML reads per chip, and its state from tick to tick."""

    handle: Any
    mig: bool
    devices: list[_Device] = field(default_factory=list)  # the chip itself, or its MIG devices
    links: tuple[int, ...] = ()  # NVLinks active at open(), whose TX/RX follow the common fields
    field_ids: list[tuple[int, int]] = field(default_factory=list)  # (field id, scopeId) of the one read
    link_errors: list[tuple[int, str, str]] = field(default_factory=list)  # (field id, kind, detail) asked
    wraps: dict[str, tuple[int, int]] = field(default_factory=dict)  # key → (last raw, offset)
    events: Any = None  # the XID event set; None where the chip cannot register one
    xids: dict[int, int] = field(default_factory=dict)  # XID code → events since open()
    unsupported: set[str] = field(default_factory=set)  # health queries never asked again
    failed: set[str] = field(default_factory=set)  # health queries that failed otherwise, logged once


@dataclass
class _Device:
    """One device of the data model (a whole chip or a MIG device) and its activity state."""

    index: int
    handle: Any  # its own handle: the chip's, or the MIG device's
    chip: _Chip = field(repr=False)
    gpm_get: tuple[Any, ...] = ()  # the GPM sample call and its arguments before the buffer; () none
    gpm: bool = False
    gpm_base: Any = None  # GPM sample of the start of the current interval
    gpm_next: Any = None  # buffer the next GPM sample is read into
    gpm_base_ns: int = 0
    gpm_ratios: tuple[float, float, float] = (NAN, NAN, NAN)


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
        self._chips: list[_Chip] = []
        self._field_ids: list[tuple[int, int]] = []
        self._field_keys: list[tuple[str, int, int, bool]] = []
        self._lost: set[int] = set()
        self._unreadable: set[int] = set()
        self._unsupported: set[int] = set()
        self._health_ns: int | None = None  # ts of the last health reading
        self._initialized = False

    # ---------------------------------------------------------------- lifecycle

    def open(self) -> list[DeviceInfo]:
        """Initialise NVML and describe every device (whole GPUs and MIG devices).

        Returns:
            One row per device: max SM clock (MHz), memory (bytes), enforced power limit (W),
            ``peak_flops`` from ``agent.backends.specs`` (NaN for a model it does not know), PCI bus
            id and, for a MIG device, its partition, chip and compute share.

        Raises:
            BackendUnavailable: pynvml or the driver is missing, or there is no GPU or MIG device.
            BackendError: NVML failed otherwise.
        """
        self.close()
        if self._nv is None:
            self._nv = import_nvml()
        nv = self._nv
        self._lost, self._unreadable = _codes(nv, _LOST), _codes(nv, _UNREADABLE)
        self._unsupported = _codes(nv, _UNSUPPORTED)
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
            infos: list[DeviceInfo] = []
            for i in range(count):
                infos.extend(self._open_chip(i, nv.nvmlDeviceGetHandleByIndex(i), first_gpu=len(infos)))
        except nv.NVMLError as e:
            raise BackendError(f"NVML failed while listing GPUs: {e}") from e
        if not infos:
            raise BackendUnavailable(
                f"all {count} NVIDIA GPUs of this node are in MIG mode with no MIG device created: create "
                "GPU and compute instances (nvidia-smi mig -cgi <profiles> -C) or disable MIG (nvidia-smi -mig 0)")
        return infos

    def _open_chip(self, nvml_index: int, handle: Any, first_gpu: int) -> list[DeviceInfo]:
        """Describe one physical GPU as its devices (itself, or its MIG devices) and set it up for sampling."""
        nv = self._nv
        model = _text(nv.nvmlDeviceGetName(handle))
        spec = find_spec(model)
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        pci = self._optional(nv.nvmlDeviceGetPciInfo, handle)
        whole = DeviceInfo(
            node=self.node,
            gpu=first_gpu,
            vendor="nvidia",
            model=model,
            uuid=uuid,
            max_gfx_clock_mhz=float(nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
            peak_flops=spec.peak_flops if spec else NAN,
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(handle).total),
            power_cap_w=nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
            pci_bus_id="" if pci is None else _text(pci.busId),
            chip_uuid=uuid,
        )
        mode = self._optional(nv.nvmlDeviceGetMigMode, handle)  # NOT_SUPPORTED: a GPU without MIG
        chip = _Chip(handle, mig=mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE)
        if chip.mig:
            infos = self._mig_devices(chip, whole)
            if not infos:
                log.warning("event=mig_without_devices nvml_index=%d uuid=%s note=%s", nvml_index, uuid,
                            "MIG is enabled but no MIG device is created: the GPU is not sampled")
                return []
        else:
            infos = [whole]
            chip.devices.append(_Device(first_gpu, handle, chip, gpm_get=(nv.nvmlGpmSampleGet, handle)))
        chip.links = self._active_links(chip)
        link_ids = [getattr(nv, c) for c in _LINK_FIELDS] if chip.links else []
        chip.field_ids = [*self._field_ids, *((fid, link) for link in chip.links for fid in link_ids)]
        if chip.links:
            chip.link_errors = [(getattr(nv, c), kind, detail) for c, kind, detail in _LINK_ERROR_FIELDS
                                if hasattr(nv, c)]
        chip.events = self._xid_events(chip)
        self._chips.append(chip)
        for dev in chip.devices:
            self._start_gpm(dev)
        return infos

    def _mig_devices(self, chip: _Chip, whole: DeviceInfo) -> list[DeviceInfo]:
        """The MIG devices of a MIG-enabled chip, scaled from ``whole`` (the chip's own row)."""
        nv = self._nv
        chip_sms = self._chip_sms(chip.handle)
        infos: list[DeviceInfo] = []
        for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(chip.handle)):
            try:
                handle = nv.nvmlDeviceGetMigDeviceHandleByIndex(chip.handle, j)
            except nv.NVMLError as e:
                if e.value == nv.NVML_ERROR_NOT_FOUND:
                    continue  # no MIG device at this index
                raise
            name = _text(nv.nvmlDeviceGetName(handle))
            memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
            attributes = self._optional(nv.nvmlDeviceGetAttributes, handle)
            gpu = whole.gpu + len(infos)
            if attributes is not None and chip_sms:
                share, peak = min(attributes.multiprocessorCount / chip_sms, 1.0), whole.peak_flops
            else:
                share, peak = min(memory / max(whole.memory_bytes, 1), 1.0), NAN
                log.warning("event=mig_sms_unread gpu=%d note=%s", gpu, "NVML gives no SM counts: compute_share "
                            "is the memory share and peak_flops is NaN, so MFU is n/a on this MIG device")
            at = name.find("MIG ")
            infos.append(dataclasses.replace(
                whole, gpu=gpu, uuid=_text(nv.nvmlDeviceGetUUID(handle)), peak_flops=peak * share,
                memory_bytes=memory, partition=name[at:] if at >= 0 else "MIG", compute_share=share))
            dev = _Device(gpu, handle, chip)
            instance = self._optional(nv.nvmlDeviceGetGpuInstanceId, handle)
            if instance is not None:
                dev.gpm_get = (nv.nvmlGpmMigSampleGet, chip.handle, instance)
            chip.devices.append(dev)
        return infos

    def _chip_sms(self, handle: Any) -> int:
        """The chip's SMs under MIG: the most of any GPU-instance profile it offers; 0 when none answers."""
        nv = self._nv
        counts = [0]
        for profile in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            info = self._optional(nv.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
            if info is not None:
                counts.append(int(info.multiprocessorCount))
        return max(counts)

    def _optional(self, fn: Callable[..., Any], *args: Any) -> Any:
        """An NVML call at open() that a GPU may not answer: None then; a lost GPU still raises."""
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if e.value in self._lost:
                raise
            return None

    def _active_links(self, chip: _Chip) -> tuple[int, ...]:
        """The NVLinks of ``chip`` that are up now, by NVML link index; () without NVLink.

        ``NVML_FI_DEV_NVLINK_LINK_COUNT`` bounds the indices probed (all ``NVML_NVLINK_MAX_LINKS``
        where it cannot be read); a link whose state NVML will not give is left out.
        """
        nv = self._nv
        first = chip.devices[0]
        if not all(hasattr(nv, c) for c in _LINK_FIELDS):
            return ()
        count = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 0))
        if hasattr(nv, "NVML_FI_DEV_NVLINK_LINK_COUNT"):
            got = self._call(first, nv.nvmlDeviceGetFieldValues, chip.handle,
                             [(nv.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)])
            if got is not None and got[0].nvmlReturn == nv.NVML_SUCCESS:
                count = min(count, int(getattr(got[0].value, _VALUE_MEMBER.get(got[0].valueType, "uiVal"))))
        active = []
        for link in range(count):
            try:
                up = nv.nvmlDeviceGetNvLinkState(chip.handle, link) == nv.NVML_FEATURE_ENABLED
            except nv.NVMLError as e:
                if e.value in self._lost:
                    raise
                up = False  # NOT_SUPPORTED or INVALID_ARGUMENT: no such link here
            if up:
                active.append(link)
        log.info("event=nvlinks gpu=%d active=%d present=%d", first.index, len(active), count)
        return tuple(active)

    def _xid_events(self, chip: _Chip) -> Any:
        """An event set registered for the chip's XID events, or None (logged) where NVML refuses one."""
        nv = self._nv
        gpu = chip.devices[0].index
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("event=xid_unavailable gpu=%d error=%r note=no XID counts", gpu, str(e))
            return None
        try:
            nv.nvmlDeviceRegisterEvents(chip.handle, nv.nvmlEventTypeXidCriticalError, events)
        except nv.NVMLError as e:
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlEventSetFree(events)
            if e.value in self._lost:
                raise
            log.warning("event=xid_unavailable gpu=%d error=%r note=no XID counts", gpu, str(e))
            return None
        return events

    def _start_gpm(self, dev: _Device) -> None:
        """Take the first GPM baseline where the device supports GPM."""
        nv = self._nv
        fallback = ("a MIG device has no utilisation without GPM: its busy, matrix and memory activity are NaN"
                    if dev.chip.mig else
                    "busy_ratio comes from nvmlDeviceGetUtilizationRates (the share of time any kernel ran) "
                    "and matrix activity is not measured, so counter-derived MFU is n/a")
        if not dev.gpm_get:  # a MIG device whose GPU instance id NVML would not give
            log.warning("event=gpm_refused gpu=%d error='no GPU instance id' note=%s", dev.index, fallback)
            return
        read, *args = dev.gpm_get
        try:
            if not nv.nvmlGpmQueryDeviceSupport(dev.chip.handle).isSupportedDevice:
                log.info("event=gpm_unsupported gpu=%d note=%s", dev.index, fallback)
                return
            dev.gpm_base = nv.nvmlGpmSampleAlloc()
            dev.gpm_next = nv.nvmlGpmSampleAlloc()
            read(*args, dev.gpm_base)
        except nv.NVMLError as e:
            if e.value in self._lost:
                raise
            # Pre-Hopper GPU, a driver without GPM, or GPM refused to this user: the operator is
            # told once which figures it costs, then utilization rates (or NaN under MIG) are used.
            log.warning("event=gpm_refused gpu=%d error=%r note=%s", dev.index, str(e), fallback)
            return
        dev.gpm = True
        dev.gpm_base_ns = self._clock_ns()

    def close(self) -> None:
        """Free GPM buffers and event sets and shut NVML down; safe twice and after a failed ``open()``."""
        nv = self._nv
        for chip in self._chips:
            # The device may be gone; then there is nothing left to release.
            with contextlib.suppress(nv.NVMLError):
                if chip.events is not None:
                    nv.nvmlEventSetFree(chip.events)
            for dev in chip.devices:
                for buf in (dev.gpm_base, dev.gpm_next):
                    if buf is not None:
                        with contextlib.suppress(nv.NVMLError):
                            nv.nvmlGpmSampleFree(buf)
        self._chips = []
        self._field_ids = []
        self._health_ns = None
        if self._initialized:
            self._initialized = False
            # A lost driver cannot be shut down cleanly, and there is nothing to retry.
            with contextlib.suppress(nv.NVMLError):
                nv.nvmlShutdown()

    # ---------------------------------------------------------------- sampling

    def sample(self, now_ns: int) -> list[Sample]:
        """Read every device once, and the health counters when ``HEALTH_INTERVAL_NS`` has passed.

        Args:
            now_ns: CLOCK_REALTIME nanoseconds, the ``ts_ns`` of every row.

        Raises:
            DeviceLost: a GPU stopped answering (``gpu`` names it, a chip's first device under MIG).
            BackendError: NVML failed otherwise, or ``open()`` was not called.
        """
        if not self._initialized:
            raise BackendError("nvidia backend sampled before open()")
        # abs(): a wall clock stepped back by more than the interval reads at once and restarts the count.
        health = self._health_ns is None or abs(now_ns - self._health_ns) >= HEALTH_INTERVAL_NS
        if health:
            self._health_ns = now_ns
        return [s for chip in self._chips for s in self._sample_chip(chip, now_ns, health)]

    def _sample_chip(self, chip: _Chip, now_ns: int, health: bool) -> list[Sample]:
        """The chip's devices; what NVML reads per chip goes on its first device (clocks on all)."""
        nv = self._nv
        first, h = chip.devices[0], chip.handle
        f, links, link_errors = self._read_fields(chip, health)
        power = f["power_instant_w"]
        if math.isnan(power):
            power = f["power_average_w"]
        per_chip: dict[str, Any] = dict(
            power_w=power,
            energy_j=f["energy_j"],
            # NVML exposes no hotspot sensor on NVIDIA parts; the GPU die sensor is the closest.
            temp_c=_num(self._call(first, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
            mem_temp_c=f["mem_temp_c"],
            link_tx_bytes=f["link_tx_bytes"],
            link_rx_bytes=f["link_rx_bytes"],
            pcie_tx_bytes=f["pcie_tx_bytes"],
            pcie_rx_bytes=f["pcie_rx_bytes"],
            links=links,
            errors=self._health(chip, link_errors) if health else (),
            **{column: _nansum(f[k] for k in keys) for column, keys in _THROTTLE.items()},
        )
        gfx = _num(self._call(first, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM))
        mem = _num(self._call(first, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM))
        out = []
        for dev in chip.devices:
            used = self._call(dev, nv.nvmlDeviceGetMemoryInfo, dev.handle)
            busy, matrix, mem_busy = self._activity(dev, now_ns)
            out.append(Sample(
                ts_ns=now_ns, node=self.node, gpu=dev.index, gfx_clock_mhz=gfx, mem_clock_mhz=mem,
                busy_ratio=busy, matrix_ratio=matrix, mem_busy_ratio=mem_busy,
                mem_used_bytes=NAN if used is None else float(used.used),
                **(per_chip if dev is first else {}),
            ))
        return out

    def _activity(self, dev: _Device, now_ns: int) -> tuple[float, float, float]:
        """Busy, matrix and memory-controller ratios: GPM, else utilization rates (NaN for a MIG device)."""
        nv = self._nv
        if dev.gpm:
            return self._gpm_ratios(dev, now_ns)
        if dev.chip.mig:
            return (NAN, NAN, NAN)
        util = self._call(dev, nv.nvmlDeviceGetUtilizationRates, dev.handle)
        return (NAN, NAN, NAN) if util is None else (util.gpu / 100, NAN, util.memory / 100)

    def _read_fields(self, chip: _Chip, health: bool
                     ) -> tuple[dict[str, float], tuple[LinkBytes, ...], list[ErrorCount]]:
        """One batched field read: data-model values, each active link's bytes and, on a health tick,
        the NVLink error counters.

        Failed fields are NaN; the per-link counters are 64-bit (never wrap) and taken as read. A
        failed NVLink error field is left out, and one that is NOT_SUPPORTED is not asked again.
        """
        nv = self._nv
        first = chip.devices[0]
        out = {key: NAN for key, *_ in _FIELDS}
        asked = chip.link_errors if health else []
        values = self._call(first, nv.nvmlDeviceGetFieldValues, chip.handle,
                            [*chip.field_ids, *((fid, 0) for fid, _, _ in asked)])
        if values is None:
            return out, tuple(LinkBytes(link, NAN, NAN) for link in chip.links), []
        common = len(self._field_keys)
        for (key, mul, div, cumulative), fv in zip(self._field_keys, values[:common], strict=True):
            raw = self._raw(first, fv)
            if raw is None:
                continue
            modulus = _WRAP_MODULUS.get(fv.valueType)
            if cumulative and modulus is not None:
                raw = self._unwrap(chip, key, int(raw), modulus)
            out[key] = raw * mul / div
        links = []
        for i, link in enumerate(chip.links):
            tx_raw, rx_raw = self._raw(first, values[common + 2 * i]), self._raw(first, values[common + 2 * i + 1])
            links.append(LinkBytes(link, NAN if tx_raw is None else tx_raw * _KIB,
                                   NAN if rx_raw is None else rx_raw * _KIB))
        errors = []
        for (fid, kind, detail), fv in zip(asked, values[len(chip.field_ids):], strict=True):
            if fv.nvmlReturn == nv.NVML_SUCCESS:
                errors.append(ErrorCount(kind, "", detail, float(_member(fv))))
            elif fv.nvmlReturn in self._unsupported:
                chip.link_errors = [e for e in chip.link_errors if e[0] != fid]
        return out, tuple(links), errors

    def _raw(self, dev: _Device, fv: Any) -> Any:
        """One field's raw value; None when NVML could not read it, DeviceLost when the GPU is gone."""
        nv = self._nv
        if fv.nvmlReturn != nv.NVML_SUCCESS:
            if fv.nvmlReturn in self._lost:
                raise DeviceLost(f"GPU {dev.index} lost while reading NVML fields", gpu=dev.index)
            return None
        return _member(fv)

    @staticmethod
    def _unwrap(chip: _Chip, key: str, raw: int, modulus: int) -> int:
        """Extend a narrow wrapping counter into a monotonic one (assumes ≤ 1 wrap per tick)."""
        last, offset = chip.wraps.get(key, (raw, 0))
        if raw < last:
            offset += modulus
        chip.wraps[key] = (raw, offset)
        return raw + offset

    def _gpm_ratios(self, dev: _Device, now_ns: int) -> tuple[float, float, float]:
        """GPM busy, tensor and DRAM-bandwidth ratios between the baseline sample and now."""
        nv = self._nv
        if now_ns - dev.gpm_base_ns < _GPM_MIN_INTERVAL_NS:
            return dev.gpm_ratios
        if self._call(dev, *dev.gpm_get, dev.gpm_next) is None:
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

    # ---------------------------------------------------------------- health

    def _health(self, chip: _Chip, link_errors: list[ErrorCount]) -> tuple[ErrorCount, ...]:
        """The chip's health and error counters now (table in the module docstring); chip-wide under MIG."""
        nv = self._nv
        h = chip.handle
        self._drain_xids(chip)
        out = [ErrorCount("xid", "", str(code), float(n)) for code, n in sorted(chip.xids.items())]
        mode = self._ask(chip, "ecc_mode", nv.nvmlDeviceGetEccMode, h)
        if mode is not None and mode[0] == nv.NVML_FEATURE_ENABLED:
            for kind, error_type in _ECC_TYPES:
                for window, counter in _ECC_WINDOWS:
                    n = self._ask(chip, f"{kind}_{window}", nv.nvmlDeviceGetTotalEccErrors, h,
                                  getattr(nv, error_type), getattr(nv, counter))
                    if n is not None:
                        out.append(ErrorCount(kind, window, "total", float(n)))
        for detail, cause in _RETIREMENT_CAUSES:
            pages = self._ask(chip, f"retired_pages_{detail}", nv.nvmlDeviceGetRetiredPages, h, getattr(nv, cause))
            if pages is not None:
                out.append(ErrorCount("retired_pages", "", detail, float(len(pages))))
        pending = self._ask(chip, "retirement_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            out.append(ErrorCount("retirement_pending", "", "", float(pending == nv.NVML_FEATURE_ENABLED)))
        rows = self._ask(chip, "remapped_rows", nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            correctable, uncorrectable, remap_pending, failed = rows
            out += [ErrorCount("remapped_rows", "", "correctable", float(correctable)),
                    ErrorCount("remapped_rows", "", "uncorrectable", float(uncorrectable)),
                    ErrorCount("remap_pending", "", "", float(bool(remap_pending))),
                    ErrorCount("remap_failed", "", "", float(bool(failed)))]
        replays = self._ask(chip, "pcie_replay", nv.nvmlDeviceGetPcieReplayCounter, h)
        if replays is not None:
            out.append(ErrorCount("pcie_replay", "", "", float(replays)))
        out += link_errors
        return tuple(e._replace(chip_wide=True) for e in out) if chip.mig else tuple(out)

    def _drain_xids(self, chip: _Chip) -> None:
        """Count the XID events waiting in the chip's event set, without waiting for more (timeout 0)."""
        nv = self._nv
        if chip.events is None:
            return
        for _ in range(_MAX_EVENTS_PER_READ):
            try:
                event = nv.nvmlEventSetWait_v2(chip.events, 0)
            except nv.NVMLError as e:
                if e.value != nv.NVML_ERROR_TIMEOUT:  # TIMEOUT: none pending
                    log.debug("event=xid_wait_failed gpu=%d error=%r", chip.devices[0].index, str(e))
                return
            if event.eventType & nv.nvmlEventTypeXidCriticalError:
                code = int(event.eventData)
                chip.xids[code] = chip.xids.get(code, 0) + 1

    def _ask(self, chip: _Chip, query: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One health query: None when NVML fails it (left out of this reading); NOT_SUPPORTED is remembered."""
        nv = self._nv
        if query in chip.unsupported:
            return None
        try:
            return fn(*args)
        except nv.NVMLError as e:
            if e.value in self._unsupported:
                chip.unsupported.add(query)
                log.info("event=health_unsupported gpu=%d query=%s", chip.devices[0].index, query)
            elif query not in chip.failed:  # asked again next reading; said once
                chip.failed.add(query)
                log.warning("event=health_query_failed gpu=%d query=%s error=%r", chip.devices[0].index, query, str(e))
            return None

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


def _member(fv: Any) -> Any:
    """The value of one ``c_nvmlFieldValue_t``, by its ``valueType``."""
    return getattr(fv.value, _VALUE_MEMBER.get(fv.valueType, "ullVal"))


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
