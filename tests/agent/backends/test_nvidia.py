"""The nvidia backend against an autospec'd pynvml fed from tests/fixtures/nvml (``tests.support.nvml_fake``).

Only the vendor library is faked: field values come back as real ``c_nvmlFieldValue_t`` arrays
and GPM metrics through the real ``c_nvmlGpmMetricsGet_t``, so the backend's ctypes decoding and
unit conversions are what is tested. Expected values are computed from the fixture's raw numbers.
"""
from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.backends.base import Backend, BackendError, BackendUnavailable, DeviceLost
from agent.backends.nvidia import NvidiaBackend
from agent.backends.specs import SPECS
from tests.support.nvml_fake import FakeNode, backend_for, load_fixture

REPO = Path(__file__).parents[3]


def raw(fx: dict[str, Any], tick: int, gpu: int, name: str) -> int:
    return fx["ticks"][tick]["devices"][gpu]["fields"]["NVML_FI_DEV_" + name]["value"]


@pytest.fixture
def node() -> FakeNode:
    """A fresh fake NVML on the fixture's 2x H100 node (data-sheet magnitudes, not a capture), for a test to edit."""
    return FakeNode(load_fixture())


def test_is_a_backend() -> None:
    assert isinstance(NvidiaBackend("n"), Backend)
    assert NvidiaBackend("n").name == "nvidia"


def test_open_describes_devices_in_data_model_units(node: FakeNode) -> None:
    devices = backend_for(node).open()
    assert [d.gpu for d in devices] == [0, 1]
    d = devices[0]
    assert (d.node, d.vendor, d.model) == ("node-a", "nvidia", "NVIDIA H100 80GB HBM3")
    assert d.uuid == "GPU-5c1e4b2a-9f3d-7e21-a4b8-0d6c2e91f7a3"
    assert d.max_gfx_clock_mhz == 1980.0
    assert d.memory_bytes == 85520809984
    assert d.power_cap_w == 700.0  # 700000 mW
    assert d.peak_flops == SPECS["H100"].peak_flops
    node.nv.nvmlInit.assert_called_once_with()


def test_every_gpu_has_its_pci_bus_id_and_is_its_own_chip(node: FakeNode) -> None:
    devices = backend_for(node).open()
    assert [d.pci_bus_id for d in devices] == ["00000000:18:00.0", "00000000:2A:00.0"]  # nvmlDeviceGetPciInfo
    assert [(d.chip_uuid, d.partition, d.compute_share) for d in devices] == [(d.uuid, "", 1.0) for d in devices]


def test_unreadable_pci_info_leaves_the_bus_id_empty(node: FakeNode) -> None:
    node.nv.nvmlDeviceGetPciInfo.side_effect = pynvml.NVMLError_NotSupported()
    assert [d.pci_bus_id for d in backend_for(node).open()] == ["", ""]


def test_unknown_model_has_nan_peak(node: FakeNode) -> None:
    node.fx["devices"][1]["name"] = "NVIDIA RTX 6000 Ada Generation"
    devices = backend_for(node).open()
    assert math.isnan(devices[1].peak_flops)


def test_sample_converts_units_exactly(node: FakeNode) -> None:
    fx = node.fx
    backend = backend_for(node)
    backend.open()
    ts = node.at(0)
    s = backend.sample(ts)[0]
    assert (s.ts_ns, s.node, s.gpu) == (ts, "node-a", 0)
    assert s.energy_j == raw(fx, 0, 0, "TOTAL_ENERGY_CONSUMPTION") / 1000 == 48213554.112
    assert s.power_w == 699.42  # POWER_INSTANT 699420 mW
    assert s.link_tx_bytes == raw(fx, 0, 0, "NVLINK_THROUGHPUT_DATA_TX") * 1024
    assert s.link_rx_bytes == raw(fx, 0, 0, "NVLINK_THROUGHPUT_DATA_RX") * 1024
    assert s.pcie_tx_bytes == 7340032117760
    assert s.pcie_rx_bytes == 29418114744320
    assert (s.gfx_clock_mhz, s.mem_clock_mhz) == (1755.0, 2619.0)
    assert s.temp_c == 67.0
    assert s.mem_temp_c == raw(fx, 0, 0, "MEMORY_TEMP") == 64 and math.isnan(s.vr_temp_c)  # NVML has no VR sensor
    assert s.mem_used_bytes == 79876341760
    # GPM percentages → ratios.
    assert (s.busy_ratio, s.matrix_ratio, s.mem_busy_ratio) == (98.7 / 100, 63.4 / 100, 41.2 / 100)


def test_throttle_residency_by_cause(node: FakeNode) -> None:
    fx = node.fx
    backend = backend_for(node)
    backend.open()
    s = backend.sample(node.at(0))[0]
    assert s.throttle_power_s == raw(fx, 0, 0, "CLOCKS_EVENT_REASON_SW_POWER_CAP") / 1e9 == 3418.270551
    # SW thermal (12.004 s) plus HW thermal (0).
    assert s.throttle_thermal_s == 12.004
    assert s.throttle_current_s == 0.25  # HW power brake
    assert s.throttle_other_s == 0.0  # sync boost


def test_thermal_sums_both_counters_and_skips_a_failed_one(node: FakeNode) -> None:
    fields = node.fx["ticks"][0]["devices"][0]["fields"]
    fields["NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"]["value"] = 1_500_000_000
    for name in ("SYNC_BOOST", "SW_THERM_SLOWDOWN"):
        fields["NVML_FI_DEV_CLOCKS_EVENT_REASON_" + name]["nvmlReturn"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = backend_for(node)
    backend.open()
    s = backend.sample(node.at(0))[0]
    assert s.throttle_thermal_s == 1.5
    assert math.isnan(s.throttle_other_s)


def test_failed_field_is_nan_and_the_rest_is_kept(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    s = backend.sample(node.at(0))[1]  # GPU 1 answers NOT_SUPPORTED for the PCIe counters
    assert math.isnan(s.pcie_tx_bytes)
    assert math.isnan(s.pcie_rx_bytes)
    assert s.energy_j == 47990113.25
    assert s.link_rx_bytes == raw(node.fx, 0, 1, "NVLINK_THROUGHPUT_DATA_RX") * 1024


def test_power_falls_back_to_average_when_instant_fails(node: FakeNode) -> None:
    field = node.fx["ticks"][0]["devices"][0]["fields"]["NVML_FI_DEV_POWER_INSTANT"]
    field["nvmlReturn"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = backend_for(node)
    backend.open()
    assert backend.sample(node.at(0))[0].power_w == 688.113


def test_cumulative_counters_across_two_ticks(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    first = backend.sample(node.at(0))[0]
    second = backend.sample(node.at(1))[0]
    assert second.ts_ns - first.ts_ns == 200_000_000
    assert second.energy_j - first.energy_j == pytest.approx(131.25, abs=1e-6)  # ≈ 656 W × 0.2 s
    assert second.link_tx_bytes - first.link_tx_bytes == 23_437_500 * 1024
    assert second.pcie_rx_bytes - first.pcie_rx_bytes == 293_601_280
    assert second.throttle_power_s - first.throttle_power_s == pytest.approx(0.12, abs=1e-9)
    assert second.throttle_thermal_s - first.throttle_thermal_s == pytest.approx(0.015, abs=1e-9)
    assert second.throttle_current_s - first.throttle_current_s == 0.0
    assert second.power_w == 656.25  # POWER_INSTANT fell from 699420 mW: a gauge, never unwrapped


def test_one_batched_field_call_per_device_and_tick(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()  # one NVML_FI_DEV_NVLINK_LINK_COUNT read per device, only here
    node.nv.nvmlDeviceGetFieldValues.reset_mock()
    backend.sample(node.at(0))
    backend.sample(node.at(1))
    assert node.nv.nvmlDeviceGetFieldValues.call_count == 4  # 2 GPUs x 2 ticks, however many links
    asked = node.nv.nvmlDeviceGetFieldValues.call_args.args[1]
    ids = [fid for fid, _ in asked]
    assert pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION in ids
    assert pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN in ids
    # GPU 1's 17 active links, TX and RX each, ride in the same call.
    per_link = [(fid, scope) for fid, scope in asked if scope != 0xFFFFFFFF and fid in (
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)]
    assert len(per_link) == 2 * 17


def _link_raw(fx: dict[str, Any], tick: int, gpu: int, direction: str) -> list[int]:
    return fx["ticks"][tick]["devices"][gpu]["nvlink"][direction]


def test_each_active_nvlink_has_its_own_counters_in_bytes(node: FakeNode) -> None:
    fx = node.fx
    backend = backend_for(node)
    backend.open()
    gpu0, gpu1 = backend.sample(node.at(0))
    assert [k.link for k in gpu0.links] == list(range(18))
    assert [k.link for k in gpu1.links] == list(range(17))  # link 17 is down: nvmlDeviceGetNvLinkState
    for s in (gpu0, gpu1):
        tx, rx = _link_raw(fx, 0, s.gpu, "tx"), _link_raw(fx, 0, s.gpu, "rx")
        assert [k.tx_bytes for k in s.links] == [tx[k.link] * 1024 for k in s.links]
        assert [k.rx_bytes for k in s.links] == [rx[k.link] * 1024 for k in s.links]
        # The summed fields stay NVML's all-links aggregate, which the links add up to.
        assert sum(k.tx_bytes for k in s.links) == s.link_tx_bytes
        assert sum(k.rx_bytes for k in s.links) == s.link_rx_bytes


def test_per_link_counters_grow_between_ticks(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    first = backend.sample(node.at(0))[0]
    second = backend.sample(node.at(1))[0]
    grown = [b.tx_bytes - a.tx_bytes for a, b in zip(first.links, second.links, strict=True)]
    assert all(g > 0 for g in grown)
    assert sum(grown) == second.link_tx_bytes - first.link_tx_bytes == 23_437_500 * 1024


def test_a_link_nvml_cannot_read_is_nan_and_the_others_are_kept(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    answer = node.nv.nvmlDeviceGetFieldValues.side_effect

    def link_3_unsupported(handle: Any, ids: list[tuple[int, int]]) -> Any:
        values = answer(handle, ids)
        for fv in values:
            if fv.scopeId == 3:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    node.nv.nvmlDeviceGetFieldValues.side_effect = link_3_unsupported
    s = backend.sample(node.at(0))[0]
    assert math.isnan(s.links[3].tx_bytes) and math.isnan(s.links[3].rx_bytes)
    assert s.links[4].tx_bytes == _link_raw(node.fx, 0, 0, "tx")[4] * 1024


def test_gpu_without_nvlink_has_no_links(node: FakeNode) -> None:
    for dev in node.fx["devices"]:
        dev["nvlink_link_count"] = 0  # a PCIe card: NVML reports no NVLink
    backend = backend_for(node)
    backend.open()
    node.nv.nvmlDeviceGetNvLinkState.assert_not_called()
    s = backend.sample(node.at(0))[0]
    assert s.links == ()
    assert s.link_tx_bytes == raw(node.fx, 0, 0, "NVLINK_THROUGHPUT_DATA_TX") * 1024


def test_unreadable_link_count_probes_every_link_index(node: FakeNode) -> None:
    answer = node.nv.nvmlDeviceGetFieldValues.side_effect

    def no_link_count(handle: Any, ids: list[tuple[int, int]]) -> Any:
        values = answer(handle, ids)
        for fv in values:
            if fv.fieldId == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    node.nv.nvmlDeviceGetFieldValues.side_effect = no_link_count
    backend = backend_for(node)
    backend.open()
    # Indices past the 18 links answer INVALID_ARGUMENT and are left out.
    assert node.nv.nvmlDeviceGetNvLinkState.call_count == 2 * pynvml.NVML_NVLINK_MAX_LINKS
    assert [k.link for k in backend.sample(node.at(0))[1].links] == list(range(17))


def test_narrow_pcie_counter_that_wraps_stays_cumulative(node: FakeNode) -> None:
    for tick, value in ((0, 2**32 - 296), (1, 704)):
        field = node.fx["ticks"][tick]["devices"][0]["fields"]["NVML_FI_DEV_PCIE_COUNT_TX_BYTES"]
        field.update(valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value=value)
    backend = backend_for(node)
    backend.open()
    first = backend.sample(node.at(0))[0]
    second = backend.sample(node.at(1))[0]
    assert first.pcie_tx_bytes == 2**32 - 296
    assert second.pcie_tx_bytes == 2**32 + 704
    assert second.pcie_tx_bytes - first.pcie_tx_bytes == 1000


def test_gpm_ratios_come_from_the_previous_and_current_sample(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    backend.sample(node.at(0))
    s = backend.sample(node.at(1))[0]
    assert (s.busy_ratio, s.matrix_ratio, s.mem_busy_ratio) == (97.9 / 100, 61.9 / 100, 43.7 / 100)
    # GPU 0: open → tick 0, then tick 0 → tick 1 (GPU 1 interleaves the same way).
    assert node.metrics_calls[0] == ((0, -1), (0, 0))
    assert node.metrics_calls[2] == ((0, 0), (0, 1))
    node.nv.nvmlDeviceGetUtilizationRates.assert_not_called()


def test_gpm_repeats_ratios_inside_its_100ms_refresh(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    ts = node.at(0)
    first = backend.sample(ts)[0]
    reads = node.nv.nvmlGpmSampleGet.call_count
    again = backend.sample(ts + 50_000_000)[0]
    assert node.nv.nvmlGpmSampleGet.call_count == reads
    assert (again.busy_ratio, again.matrix_ratio) == (first.busy_ratio, first.matrix_ratio)


def test_without_gpm_busy_comes_from_utilization_and_matrix_is_nan(node: FakeNode,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    for dev in node.fx["devices"]:
        dev["gpm_supported"] = False
    backend = backend_for(node)
    with caplog.at_level(logging.INFO, logger="agent.backends.nvidia"):
        backend.open()
    said = [r.getMessage() for r in caplog.records if "event=gpm_unsupported" in r.getMessage()]
    assert len(said) == len(node.fx["devices"]) and "counter-derived MFU is n/a" in said[0], said
    s = backend.sample(node.at(0))[0]
    assert s.busy_ratio == 1.0
    assert s.mem_busy_ratio == 0.43
    assert math.isnan(s.matrix_ratio)
    node.nv.nvmlGpmSampleAlloc.assert_not_called()


def test_driver_without_gpm_falls_back(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.nv.nvmlGpmQueryDeviceSupport.side_effect = pynvml.NVMLError_FunctionNotFound()
    backend = backend_for(node)
    with caplog.at_level(logging.WARNING, logger="agent.backends.nvidia"):
        backend.open()
    refused = [r for r in caplog.records if "event=gpm_refused" in r.getMessage()]
    assert len(refused) == len(node.fx["devices"]) and "Function Not Found" in refused[0].getMessage(), refused
    s = backend.sample(node.at(0))[1]
    assert (s.busy_ratio, s.mem_busy_ratio) == (1.0, 0.46)
    assert math.isnan(s.matrix_ratio)


@pytest.mark.parametrize("error", [pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_Unknown,
                                   pynvml.NVMLError_NotFound])
def test_gpu_lost_mid_run_raises_device_lost(node: FakeNode, error: type[Exception]) -> None:
    backend = backend_for(node)
    backend.open()
    backend.sample(node.at(0))
    answer = node.nv.nvmlDeviceGetFieldValues.side_effect

    def lose_gpu1(handle: tuple[str, int], ids: list[tuple[int, int]]) -> Any:
        if handle[1] == 1:
            raise error()
        return answer(handle, ids)

    node.nv.nvmlDeviceGetFieldValues.side_effect = lose_gpu1
    with pytest.raises(DeviceLost) as info:
        backend.sample(node.at(1))
    assert info.value.gpu == 1


def test_gpu_lost_reported_in_a_field_raises_device_lost(node: FakeNode) -> None:
    field = node.fx["ticks"][0]["devices"][0]["fields"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
    field["nvmlReturn"] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = backend_for(node)
    backend.open()
    with pytest.raises(DeviceLost) as info:
        backend.sample(node.at(0))
    assert info.value.gpu == 0


def test_other_nvml_error_is_a_backend_error_naming_the_call(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    node.nv.nvmlDeviceGetClockInfo.side_effect = pynvml.NVMLError_Timeout()
    with pytest.raises(BackendError) as info:
        backend.sample(node.at(0))
    assert not isinstance(info.value, DeviceLost)
    assert "nvmlDeviceGetClockInfo" in str(info.value) and "GPU 0" in str(info.value)


def test_unsupported_single_reading_is_nan(node: FakeNode) -> None:
    node.nv.nvmlDeviceGetTemperature.side_effect = pynvml.NVMLError_NotSupported()
    backend = backend_for(node)
    backend.open()
    s = backend.sample(node.at(0))[0]
    assert math.isnan(s.temp_c)
    assert s.gfx_clock_mhz == 1755.0


@pytest.mark.parametrize(("error", "fix"), [
    (pynvml.NVMLError_LibraryNotFound, "install the NVIDIA driver"),
    (pynvml.NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
])
def test_missing_library_or_driver_is_unavailable(node: FakeNode, error: type[Exception], fix: str) -> None:
    node.nv.nvmlInit.side_effect = error()
    backend = backend_for(node)
    with pytest.raises(BackendUnavailable, match=fix):
        backend.open()
    backend.close()
    node.nv.nvmlShutdown.assert_not_called()


def test_missing_pynvml_is_unavailable_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(BackendUnavailable, match=r"chopper-telemetry\[nvidia\]"):
        NvidiaBackend("n").open()


def test_module_imports_without_pynvml() -> None:
    code = "import sys; sys.modules['pynvml'] = None; import agent.backends.nvidia"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_no_devices_is_unavailable_and_shuts_down(node: FakeNode) -> None:
    node.nv.nvmlDeviceGetCount.return_value = 0
    with pytest.raises(BackendUnavailable, match="no NVIDIA GPU"):
        backend_for(node).open()
    node.nv.nvmlShutdown.assert_called_once_with()


def test_close_frees_gpm_and_is_safe_twice(node: FakeNode) -> None:
    backend = backend_for(node)
    backend.open()
    backend.close()
    backend.close()
    assert node.nv.nvmlGpmSampleFree.call_count == 4  # 2 buffers × 2 GPUs
    node.nv.nvmlShutdown.assert_called_once_with()


def test_sample_before_open_is_an_error() -> None:
    with pytest.raises(BackendError, match="before open"):
        NvidiaBackend("n").sample(0)
