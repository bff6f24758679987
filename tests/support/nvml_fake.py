"""A fake NVML (an autospec'd ``pynvml``) answering from tests/fixtures/nvml, and the nvidia backend over it.

Only the vendor library is faked: field values come back as real ``c_nvmlFieldValue_t`` arrays,
GPM metrics through the real ``c_nvmlGpmMetricsGet_t``, events as ``c_nvmlEventData_t`` and MIG
attributes and profiles as NVML's own structures, so the backend's ctypes decoding and unit
conversions are what the tests exercise. Handles are ``("handle", i)`` for GPU ``i`` in NVML order
and ``("mig", i, j)`` for MIG index ``j`` of GPU ``i``. What NVML does not answer for a MIG handle
(fields, clocks, temperature, utilisation, power limit) answers NVML_ERROR_NOT_SUPPORTED here.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pynvml

from agent.backends.nvidia import NvidiaBackend

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvml"
FIXTURE = FIXTURES / "h100_sxm_2gpu_load.json"
HEALTH_FIXTURE = FIXTURES / "h100_sxm_2gpu_health.json"
MIG_FIXTURE = FIXTURES / "h100_sxm_mig_2x3g.json"
ALL_LINKS = 0xFFFFFFFF  # the scopeId that asks an NVLink counter for every link at once

Handle = tuple[Any, ...]


def load_fixture() -> dict[str, Any]:
    """What NVML answers on a 2x H100 SXM5 node in bf16 LLM training, two ticks 200 ms apart.

    Values are in NVML's own units, keyed by pynvml constant names. They are not a hardware
    capture: their magnitudes follow H100 SXM5 data sheets and typical ``nvidia-smi -q`` output
    under load (the file's ``description`` says so and what each unit is). Each NVLink's counters
    (``nvlink``) add up to the all-links field of the same tick, as nvml.h defines scopeId UINT_MAX.
    """
    return json.loads(FIXTURE.read_text())


def load_health() -> dict[str, Any]:
    """The same node's health, error and identity answers (ECC, remapped rows, PCIe and NVLink
    errors, PCI bus ids, MIG mode off, XID events supported); the file's ``description`` says
    where each shape and unit comes from."""
    return json.loads(HEALTH_FIXTURE.read_text())


def load_mig() -> dict[str, Any]:
    """GPU 0 of that node in MIG mode with two 3g.40gb devices (60 of 132 SMs each, from
    ``nvidia-smi mig -lgip`` of an H100 80GB HBM3), and their memory and GPM per tick."""
    return json.loads(MIG_FIXTURE.read_text())


def _answer(value: Any) -> Any:
    """A fixture value, or the NVMLError it names (``"NVML_ERROR_NOT_SUPPORTED"``) raised."""
    if isinstance(value, str) and value.startswith("NVML_ERROR_"):
        raise pynvml.NVMLError(getattr(pynvml, value))
    return value


def _not_on_mig(answer: Any) -> Any:
    """``answer`` for a GPU handle; NOT_SUPPORTED for a MIG handle, as NVML answers per-chip readings there."""
    def call(handle: Handle, *args: Any) -> Any:
        if handle[0] == "mig":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return answer(handle, *args)
    return call


class FakeNode:
    """Answers like NVML on the fixture's node; ``tick`` selects the recorded tick.

    Args:
        fx: The load fixture (``load_fixture()``), for a test to edit.
        health: Health answers per GPU (``load_health()`` when None).
        mig: MIG answers (``load_mig()``) to put the GPU they name in MIG mode; None: no MIG.
    """

    def __init__(self, fx: dict[str, Any], health: dict[str, Any] | None = None,
                 mig: dict[str, Any] | None = None) -> None:
        self.fx = fx
        self.health = load_health() if health is None else health
        self.mig = mig
        if mig is not None:
            self.health["devices"][mig["gpu"]]["mig_mode"] = mig["mig_mode"]
        self.tick = 0
        self.tick_of_read = -1  # GPM reads before the first tick belong to open()
        self.open_ns = fx["ticks"][0]["ts_ns"] - 200_000_000
        self.metric_names = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_GPM_METRIC_")}
        # sample address → (source, tick): source is the GPU index, or ("mig", gpu, MIG index); tick -1 = open
        self.gpm_reads: dict[int, tuple[Any, int]] = {}
        self.metrics_calls: list[tuple[tuple[Any, int], tuple[Any, int]]] = []
        self.event_sets: dict[int, int] = {}  # id of an event set → the GPU registered on it
        self.pending_events: dict[int, list[Any]] = {i: [] for i in range(len(fx["devices"]))}
        self.nv = self._build()

    def _build(self) -> Any:
        nv = mock.create_autospec(pynvml)
        # Constants, NVMLError classes and ctypes structures stay real: the backend needs them
        # to catch errors and to build the GPM request.
        for name in dir(pynvml):
            obj = getattr(pynvml, name)
            if name.startswith(("NVML", "nvmlEventType")) or isinstance(obj, type):
                setattr(nv, name, obj)
        devices = self.fx["devices"]
        nv.nvmlDeviceGetCount.return_value = len(devices)
        nv.nvmlDeviceGetHandleByIndex.side_effect = lambda i: ("handle", i)
        nv.nvmlDeviceGetName.side_effect = lambda h: self._identity(h)["name"]
        nv.nvmlDeviceGetUUID.side_effect = lambda h: self._identity(h)["uuid"]
        nv.nvmlDeviceGetMaxClockInfo.side_effect = _not_on_mig(self._max_clock)
        nv.nvmlDeviceGetEnforcedPowerLimit.side_effect = _not_on_mig(
            lambda h: devices[h[1]]["enforced_power_limit_mw"])
        nv.nvmlDeviceGetMemoryInfo.side_effect = self._memory
        nv.nvmlDeviceGetFieldValues.side_effect = _not_on_mig(self._fields)
        nv.nvmlDeviceGetNvLinkState.side_effect = _not_on_mig(self._link_state)
        nv.nvmlDeviceGetClockInfo.side_effect = _not_on_mig(self._clock)
        nv.nvmlDeviceGetTemperature.side_effect = _not_on_mig(lambda h, s: self._dev(h)["temperature_c"])
        nv.nvmlDeviceGetUtilizationRates.side_effect = _not_on_mig(self._utilization)
        nv.nvmlDeviceGetPciInfo.side_effect = _not_on_mig(self._pci_info)
        nv.nvmlGpmQueryDeviceSupport.side_effect = _not_on_mig(self._gpm_support)
        nv.nvmlGpmSampleAlloc.side_effect = lambda: ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        nv.nvmlGpmSampleGet.side_effect = _not_on_mig(self._gpm_sample)
        nv.nvmlGpmMigSampleGet.side_effect = self._gpm_mig_sample
        nv.nvmlGpmMetricsGet.side_effect = self._gpm_metrics
        self._build_health(nv)
        self._build_mig(nv)
        return nv

    def _build_health(self, nv: Any) -> None:
        """Health queries answer from the health fixture of the handle's GPU."""
        def per_gpu(key: str) -> Any:
            def call(handle: Handle, *args: Any) -> Any:
                value = self.health["devices"][handle[1]][key]
                for arg in args:  # pynvml constants select within the entry, by name
                    value = value[self._constant_name(value, arg)] if isinstance(value, dict) else value
                return _answer(value)
            return _not_on_mig(call)

        nv.nvmlDeviceGetEccMode.side_effect = per_gpu("ecc_mode")
        nv.nvmlDeviceGetTotalEccErrors.side_effect = per_gpu("total_ecc_errors")
        nv.nvmlDeviceGetRetiredPages.side_effect = per_gpu("retired_pages")
        nv.nvmlDeviceGetRetiredPagesPendingStatus.side_effect = per_gpu("retired_pages_pending")
        nv.nvmlDeviceGetRemappedRows.side_effect = lambda h: tuple(per_gpu("remapped_rows")(h))
        nv.nvmlDeviceGetPcieReplayCounter.side_effect = per_gpu("pcie_replay_counter")
        nv.nvmlDeviceGetMigMode.side_effect = per_gpu("mig_mode")
        nv.nvmlEventSetCreate.side_effect = lambda: pynvml.c_nvmlEventSet_t()
        nv.nvmlDeviceRegisterEvents.side_effect = self._register_events
        nv.nvmlEventSetWait_v2.side_effect = self._event_wait

    @staticmethod
    def _constant_name(entry: dict[str, Any], value: int) -> str:
        """The key of ``entry`` (pynvml constant names) whose constant is ``value``."""
        return next(name for name in entry if getattr(pynvml, name) == value)

    def _build_mig(self, nv: Any) -> None:
        mig = self.mig
        nv.nvmlDeviceGetMaxMigDeviceCount.side_effect = lambda h: mig["max_mig_device_count"] if mig else 0
        nv.nvmlDeviceGetMigDeviceHandleByIndex.side_effect = self._mig_handle
        nv.nvmlDeviceGetAttributes.side_effect = self._attributes
        nv.nvmlDeviceGetGpuInstanceId.side_effect = lambda h: self._mig_device(h)["gpu_instance_id"]
        nv.nvmlDeviceGetGpuInstanceProfileInfo.side_effect = self._profile_info

    # ---------------------------------------------------------------- identity and MIG

    def _identity(self, handle: Handle) -> dict[str, Any]:
        return self._mig_device(handle) if handle[0] == "mig" else self.fx["devices"][handle[1]]

    def _mig_device(self, handle: Handle) -> dict[str, Any]:
        if handle[0] != "mig":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # not a MIG device handle
        assert self.mig is not None
        return self.mig["mig_devices"][handle[2]]

    def _mig_handle(self, handle: Handle, index: int) -> Handle:
        """nvmlDeviceGetMigDeviceHandleByIndex: NOT_FOUND where no MIG device holds the index."""
        mig = self.mig
        if mig is None or handle[1] != mig["gpu"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)  # MIG is off on this GPU
        assert 0 <= index < mig["max_mig_device_count"], index
        if index >= len(mig["mig_devices"]):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", handle[1], index)

    def _attributes(self, handle: Handle) -> Any:
        """nvmlDeviceGetAttributes answers for MIG handles only (nvml.h)."""
        attrs = pynvml.c_nvmlDeviceAttributes()
        for name, value in self._mig_device(handle)["attributes"].items():
            setattr(attrs, name, value)
        return attrs

    def _profile_info(self, handle: Handle, profile: int) -> Any:
        assert self.mig is not None and handle == ("handle", self.mig["gpu"]), handle
        profiles = self.mig["gpu_instance_profiles"]
        name = next((n for n in profiles if getattr(pynvml, n) == profile), None)
        if name is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # a profile this GPU does not offer
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        for key, value in profiles[name].items():
            setattr(info, key, value.encode() if isinstance(value, str) else value)
        return info

    def _pci_info(self, handle: Handle) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self.health["devices"][handle[1]]["pci_bus_id"].encode()
        return info

    # ---------------------------------------------------------------- XID events

    def xid(self, gpu: int, code: int) -> None:
        """An XID (critical error) event with code ``code`` arrives for GPU ``gpu``."""
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = code
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF  # not attributed to a MIG instance
        self.pending_events[gpu].append(data)

    def _register_events(self, handle: Handle, types: int, event_set: Any) -> None:
        assert handle[0] == "handle", handle
        assert types == pynvml.nvmlEventTypeXidCriticalError, types
        _answer(self.health["devices"][handle[1]]["xid_events"])
        self.event_sets[ctypes.addressof(event_set)] = handle[1]

    def _event_wait(self, event_set: Any, timeout_ms: int) -> Any:
        """nvmlEventSetWait_v2: the oldest pending event, else NVML_ERROR_TIMEOUT (pynvml raises it)."""
        assert timeout_ms == 0, f"the sampler must never block on events (timeout {timeout_ms} ms)"
        pending = self.pending_events[self.event_sets[ctypes.addressof(event_set)]]
        if not pending:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return pending.pop(0)

    # ---------------------------------------------------------------- readings

    def _dev(self, handle: Handle) -> dict[str, Any]:
        return self.fx["ticks"][self.tick]["devices"][handle[1]]

    def _max_clock(self, handle: Handle, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self.fx["devices"][handle[1]]["max_sm_clock_mhz"]

    def _memory(self, handle: Handle) -> Any:
        mem = pynvml.c_nvmlMemory_t()
        if handle[0] == "mig":
            assert self.mig is not None
            mem.total = self._mig_device(handle)["memory_total_bytes"]
            mem.used = self.mig["ticks"][self.tick]["mig_devices"][handle[2]]["memory_used_bytes"]
        else:
            mem.total = self.fx["devices"][handle[1]]["memory_total_bytes"]
            mem.used = self._dev(handle)["memory_used_bytes"]
        mem.free = mem.total - mem.used
        return mem

    def _fields(self, handle: Handle, ids: list[tuple[int, int]]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        # Fixture keys are pynvml constant names, resolved here: independent of NVML's numbering.
        recorded = {getattr(pynvml, n): (n, rec) for n, rec in self._dev(handle)["fields"].items()}
        recorded.update({getattr(pynvml, n): (n, rec)
                         for n, rec in self.health["devices"][handle[1]]["fields"].items()})
        for fv, (field_id, scope) in zip(values, ids, strict=True):
            fv.fieldId, fv.scopeId = field_id, scope
            if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                rec = {"valueType": pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, "nvmlReturn": pynvml.NVML_SUCCESS,
                       "value": self.fx["devices"][handle[1]]["nvlink_link_count"]}
            else:
                name, rec = recorded[field_id]
                if "NVLINK_THROUGHPUT" in name and scope != ALL_LINKS:
                    rec = self._link_field(handle, name, scope, rec)
                else:
                    assert scope == (ALL_LINKS if "NVLINK_THROUGHPUT" in name else 0), name
            fv.valueType, fv.nvmlReturn = rec["valueType"], rec["nvmlReturn"]
            member = {0: "dVal", 1: "uiVal", 3: "ullVal"}[rec["valueType"]]
            setattr(fv.value, member, rec["value"])
        return values

    def _link_field(self, handle: Handle, name: str, link: int, summed: dict[str, Any]) -> dict[str, Any]:
        """One link's counter (scopeId = link index); a link that is down is never asked for."""
        assert self.fx["devices"][handle[1]]["nvlink_active"][link], f"{name} asked for link {link}, which is down"
        direction = "tx" if name.endswith("_TX") else "rx"
        return {**summed, "value": self._dev(handle)["nvlink"][direction][link]}

    def _link_state(self, handle: Handle, link: int) -> int:
        """nvmlDeviceGetNvLinkState: NVML answers INVALID_ARGUMENT for an index past the device's links."""
        active = self.fx["devices"][handle[1]]["nvlink_active"]
        if link >= len(active):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if active[link] else pynvml.NVML_FEATURE_DISABLED

    def _clock(self, handle: Handle, clock: int) -> int:
        key = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}[clock]
        return self._dev(handle)[key]

    def _utilization(self, handle: Handle) -> Any:
        if self.mig is not None and handle[1] == self.mig["gpu"]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no utilisation under MIG
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = self._dev(handle)["utilization"]["gpu"]
        util.memory = self._dev(handle)["utilization"]["memory"]
        return util

    def _gpm_support(self, handle: Handle) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(self.fx["devices"][handle[1]]["gpm_supported"])
        return support

    def _gpm_sample(self, handle: Handle, sample: Any) -> Any:
        self.gpm_reads[ctypes.addressof(sample.contents)] = (handle[1], self.tick_of_read)
        return sample

    def _gpm_mig_sample(self, handle: Handle, gpu_instance: int, sample: Any) -> Any:
        """nvmlGpmMigSampleGet: the GPU's handle and the GPU instance id of the MIG device."""
        assert self.mig is not None and handle == ("handle", self.mig["gpu"]), handle
        index = next(j for j, d in enumerate(self.mig["mig_devices"]) if d["gpu_instance_id"] == gpu_instance)
        self.gpm_reads[ctypes.addressof(sample.contents)] = (("mig", handle[1], index), self.tick_of_read)
        return sample

    def _gpm_metrics(self, get: Any) -> Any:
        first = self.gpm_reads[ctypes.addressof(get.sample1.contents)]
        second = self.gpm_reads[ctypes.addressof(get.sample2.contents)]
        assert first[0] == second[0], f"GPM metrics between samples of two devices: {first} {second}"
        self.metrics_calls.append((first, second))
        source, tick = second
        if isinstance(source, tuple):
            assert self.mig is not None
            recorded = self.mig["ticks"][tick]["mig_devices"][source[2]]["gpm"]
        else:
            recorded = self.fx["ticks"][tick]["devices"][source]["gpm"]
        for i in range(get.numMetrics):
            metric = get.metrics[i]
            metric.value = recorded[self.metric_names[metric.metricId]]
            metric.nvmlReturn = pynvml.NVML_SUCCESS
        return get

    def at(self, tick: int) -> int:
        """Select a recorded tick and return its timestamp."""
        self.tick = self.tick_of_read = tick
        return self.fx["ticks"][tick]["ts_ns"]


def backend_for(node: FakeNode) -> NvidiaBackend:
    """The nvidia backend of node "node-a" over ``node``'s NVML, opened at the fixture's ``open_ns``."""
    return NvidiaBackend("node-a", nvml=node.nv, clock_ns=lambda: node.open_ns)
