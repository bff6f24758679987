"""A fake NVML (an autospec'd ``pynvml``) answering from tests/fixtures/nvml, and the nvidia backend over it.

Only the vendor library is faked: field values come back as real ``c_nvmlFieldValue_t`` arrays
and GPM metrics through the real ``c_nvmlGpmMetricsGet_t``, so the backend's ctypes decoding and
unit conversions are what the tests exercise.
"""
from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any
from unittest import mock

import pynvml

from agent.backends.nvidia import NvidiaBackend

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nvml" / "h100_sxm_2gpu_load.json"
ALL_LINKS = 0xFFFFFFFF  # the scopeId that asks an NVLink counter for every link at once


def load_fixture() -> dict[str, Any]:
    """What NVML answers on a 2x H100 SXM5 node in bf16 LLM training, two ticks 200 ms apart.

    Values are in NVML's own units, keyed by pynvml constant names. They are not a hardware
    capture: their magnitudes follow H100 SXM5 data sheets and typical ``nvidia-smi -q`` output
    under load (the file's ``description`` says so and what each unit is). Each NVLink's counters
    (``nvlink``) add up to the all-links field of the same tick, as nvml.h defines scopeId UINT_MAX.
    """
    return json.loads(FIXTURE.read_text())


class FakeNode:
    """Answers like NVML on the fixture's node; ``tick`` selects the recorded tick."""

    def __init__(self, fx: dict[str, Any]) -> None:
        self.fx = fx
        self.tick = 0
        self.tick_of_read = -1  # GPM reads before the first tick belong to open()
        self.open_ns = fx["ticks"][0]["ts_ns"] - 200_000_000
        self.metric_names = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_GPM_METRIC_")}
        self.gpm_reads: dict[int, tuple[int, int]] = {}  # sample address → (gpu, tick); -1 = open
        self.metrics_calls: list[tuple[tuple[int, int], tuple[int, int]]] = []
        self.nv = self._build()

    def _build(self) -> Any:
        nv = mock.create_autospec(pynvml)
        # Constants, NVMLError classes and ctypes structures stay real: the backend needs them
        # to catch errors and to build the GPM request.
        for name in dir(pynvml):
            obj = getattr(pynvml, name)
            if name.startswith("NVML") or isinstance(obj, type):
                setattr(nv, name, obj)
        devices = self.fx["devices"]
        nv.nvmlDeviceGetCount.return_value = len(devices)
        nv.nvmlDeviceGetHandleByIndex.side_effect = lambda i: ("handle", i)
        nv.nvmlDeviceGetName.side_effect = lambda h: devices[h[1]]["name"]
        nv.nvmlDeviceGetUUID.side_effect = lambda h: devices[h[1]]["uuid"]
        nv.nvmlDeviceGetMaxClockInfo.side_effect = self._max_clock
        nv.nvmlDeviceGetEnforcedPowerLimit.side_effect = lambda h: devices[h[1]]["enforced_power_limit_mw"]
        nv.nvmlDeviceGetMemoryInfo.side_effect = self._memory
        nv.nvmlDeviceGetFieldValues.side_effect = self._fields
        nv.nvmlDeviceGetNvLinkState.side_effect = self._link_state
        nv.nvmlDeviceGetClockInfo.side_effect = self._clock
        nv.nvmlDeviceGetTemperature.side_effect = lambda h, s: self._dev(h)["temperature_c"]
        nv.nvmlDeviceGetUtilizationRates.side_effect = self._utilization
        nv.nvmlGpmQueryDeviceSupport.side_effect = self._gpm_support
        nv.nvmlGpmSampleAlloc.side_effect = lambda: ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        nv.nvmlGpmSampleGet.side_effect = self._gpm_sample
        nv.nvmlGpmMetricsGet.side_effect = self._gpm_metrics
        return nv

    def _dev(self, handle: tuple[str, int]) -> dict[str, Any]:
        return self.fx["ticks"][self.tick]["devices"][handle[1]]

    def _max_clock(self, handle: tuple[str, int], clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self.fx["devices"][handle[1]]["max_sm_clock_mhz"]

    def _memory(self, handle: tuple[str, int]) -> Any:
        mem = pynvml.c_nvmlMemory_t()
        mem.total = self.fx["devices"][handle[1]]["memory_total_bytes"]
        mem.used = self._dev(handle)["memory_used_bytes"]
        mem.free = mem.total - mem.used
        return mem

    def _fields(self, handle: tuple[str, int], ids: list[tuple[int, int]]) -> Any:
        values = (pynvml.c_nvmlFieldValue_t * len(ids))()
        # Fixture keys are pynvml constant names, resolved here: independent of NVML's numbering.
        recorded = {getattr(pynvml, n): (n, rec) for n, rec in self._dev(handle)["fields"].items()}
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

    def _link_field(self, handle: tuple[str, int], name: str, link: int, summed: dict[str, Any]) -> dict[str, Any]:
        """One link's counter (scopeId = link index); a link that is down is never asked for."""
        assert self.fx["devices"][handle[1]]["nvlink_active"][link], f"{name} asked for link {link}, which is down"
        direction = "tx" if name.endswith("_TX") else "rx"
        return {**summed, "value": self._dev(handle)["nvlink"][direction][link]}

    def _link_state(self, handle: tuple[str, int], link: int) -> int:
        """nvmlDeviceGetNvLinkState: NVML answers INVALID_ARGUMENT for an index past the device's links."""
        active = self.fx["devices"][handle[1]]["nvlink_active"]
        if link >= len(active):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED if active[link] else pynvml.NVML_FEATURE_DISABLED

    def _clock(self, handle: tuple[str, int], clock: int) -> int:
        key = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}[clock]
        return self._dev(handle)[key]

    def _utilization(self, handle: tuple[str, int]) -> Any:
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = self._dev(handle)["utilization"]["gpu"]
        util.memory = self._dev(handle)["utilization"]["memory"]
        return util

    def _gpm_support(self, handle: tuple[str, int]) -> Any:
        support = pynvml.c_nvmlGpmSupport_t()
        support.isSupportedDevice = int(self.fx["devices"][handle[1]]["gpm_supported"])
        return support

    def _gpm_sample(self, handle: tuple[str, int], sample: Any) -> Any:
        self.gpm_reads[ctypes.addressof(sample.contents)] = (handle[1], self.tick_of_read)
        return sample

    def _gpm_metrics(self, get: Any) -> Any:
        first = self.gpm_reads[ctypes.addressof(get.sample1.contents)]
        second = self.gpm_reads[ctypes.addressof(get.sample2.contents)]
        self.metrics_calls.append((first, second))
        gpu, tick = second
        recorded = self.fx["ticks"][tick]["devices"][gpu]["gpm"]
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
