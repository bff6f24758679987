"""The amd backend against an autospec of the installed amdsmi package, fed MI300X values.

The fake (``tests.support.amdsmi_fake``) answers from ``tests/fixtures/amdsmi/mi300x_under_load.json``
for the metrics and ``mi300x_health.json`` for health; health, temperatures and partitions have
tests of their own (test_amd_health.py, test_amd_partitions.py).
"""
from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any
from unittest import mock

import pytest

from agent.backends.amd import AmdBackend, import_amdsmi
from agent.backends.base import Backend, BackendError, BackendUnavailable, DeviceLost
from chopper.schema import ERROR_KINDS, LinkBytes
from tests.support.amdsmi_fake import MIB, FakeNode, backend_for, import_real_amdsmi, load


def _vendor_modules() -> list[str]:
    return [name for name in sys.modules if name == "amdsmi" or name.startswith("amdsmi.")]


@pytest.fixture(scope="module")
def real_amdsmi() -> ModuleType:
    return import_real_amdsmi()


@pytest.fixture
def recorded() -> dict[str, Any]:
    return load("mi300x_under_load.json")


@pytest.fixture
def node(real_amdsmi: ModuleType, recorded: dict[str, Any]) -> FakeNode:
    return FakeNode(real_amdsmi, recorded)


@pytest.fixture
def backend(node: FakeNode) -> Iterator[AmdBackend]:
    with backend_for(node) as b:
        yield b


def _opened(backend: AmdBackend, node: FakeNode) -> AmdBackend:
    backend.open()
    node.opened = True
    return backend


def test_implements_the_backend_protocol() -> None:
    assert isinstance(AmdBackend("n"), Backend)
    assert AmdBackend.name == "amd"


def test_open_describes_each_mi300x(backend: AmdBackend, node: FakeNode, real_amdsmi: ModuleType) -> None:
    devices = backend.open()

    node.smi.amdsmi_init.assert_called_once_with(real_amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    node.smi.amdsmi_get_clock_info.assert_any_call("handle0", real_amdsmi.AmdSmiClkType.GFX)
    assert [d.gpu for d in devices] == [0, 1]
    d = devices[0]
    assert (d.node, d.vendor, d.model) == ("node-a", "amd", "AMD Instinct MI300X")
    assert d.uuid == "3eff74a1-0000-1000-80d2-5a2c7e91d040"
    assert devices[1].uuid.endswith("1")
    assert d.max_gfx_clock_mhz == 2100.0
    assert d.peak_flops == 1307.4e12
    assert d.memory_bytes == 196592 * MIB == 206_141_652_992  # vram_total MB → bytes
    assert d.power_cap_w == 750.0  # 750_000_000 µW
    # Whole chips (SPX, NPS1): the chip is the device itself.
    assert (d.partition, d.memory_partition, d.compute_share) == ("", "NPS1", 1.0)
    assert (d.chip_uuid, d.pci_bus_id) == (d.uuid, "0000:05:00.0")
    assert devices[1].pci_bus_id == "0000:25:00.0"


def test_first_sample_converts_units_exactly(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    node.smi.amdsmi_get_gpu_metrics_info.reset_mock()

    samples = backend.sample(node.now_ns(0))

    assert len(samples) == 2
    s = samples[0]
    assert (s.ts_ns, s.node, s.gpu) == (1_735_689_600_000_000_000, "node-a", 0)
    assert s.gfx_clock_mhz == 1831.5  # mean of the eight XCC clocks, sum 14652 MHz
    assert s.mem_clock_mhz == 1300.0
    assert s.busy_ratio == 0.97
    assert s.mem_busy_ratio == 0.38
    assert s.power_w == 742.0  # current_socket_power; average_socket_power is N/A on MI300X
    assert s.energy_j == 2_265_028_475_781 / 65536 == 34_561_591.73249817
    assert s.temp_c == 78.0
    assert s.mem_used_bytes == 181_234 * MIB
    assert s.link_rx_bytes == 68_276_271_605 * 1024  # seven active links, KB → bytes
    assert s.link_tx_bytes == 67_956_315_535 * 1024
    # Cumulative since open(): the first read sets the baseline.
    assert (s.throttle_power_s, s.throttle_thermal_s, s.throttle_current_s) == (0.0, 0.0, 0.0)
    for unreadable in ("matrix_ratio", "pcie_tx_bytes", "pcie_rx_bytes", "throttle_other_s"):
        assert math.isnan(getattr(s, unreadable)), unreadable
    # One metrics poll per device per tick, and never the 100 ms-sleeping violation call.
    assert node.smi.amdsmi_get_gpu_metrics_info.call_count == 2
    node.smi.amdsmi_get_violation_status.assert_not_called()


def test_cumulative_counters_increase_across_two_ticks(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    first = backend.sample(node.now_ns(0))[0]
    node.tick = 1
    second = backend.sample(node.now_ns(1))[0]

    assert second.ts_ns - first.ts_ns == 100_000_000
    assert second.energy_j - first.energy_j == pytest.approx(4_862_771 / 65536, abs=1e-6)
    assert (second.energy_j - first.energy_j) / 0.1 == pytest.approx(742.0, rel=1e-6)  # ≈ power_w
    assert second.link_rx_bytes - first.link_rx_bytes == 34_156_248 * 1024
    assert second.link_tx_bytes - first.link_tx_bytes == 34_130_859 * 1024
    # 100 firmware iterations in 100 ms: PPT active 62, socket thermal 3, VR thermal 1.
    assert second.throttle_power_s == pytest.approx(0.062, abs=1e-12)
    assert second.throttle_thermal_s == pytest.approx(0.003, abs=1e-12)
    assert second.throttle_current_s == pytest.approx(0.001, abs=1e-12)
    assert second.gfx_clock_mhz == 1802.0
    assert (second.busy_ratio, second.mem_busy_ratio, second.power_w) == (0.96, 0.41, 739.0)


def test_na_missing_and_sentinel_values_read_as_nan(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    na = node.metrics(0, 0)
    for key, value in na.items():
        na[key] = ["N/A"] * len(value) if isinstance(value, list) else "N/A"
    na["temperature_hotspot"] = 0xFFFF  # raw sentinels, as older amdsmi passes them through
    na["energy_accumulator"] = 0xFFFFFFFFFFFFFFFF
    node.ticks[0][0]["gpu_vram_usage"] = {"vram_total": "N/A", "vram_used": 0xFFFFFFFFFFFFFFFF}
    node.ticks[1][0] = {"gpu_metrics_info": {}, "gpu_vram_usage": {}}  # every field missing

    samples = backend.sample(node.now_ns(0))

    for s in samples:
        for field in ("gfx_clock_mhz", "mem_clock_mhz", "busy_ratio", "matrix_ratio", "mem_busy_ratio",
                      "power_w", "energy_j", "temp_c", "mem_used_bytes", "link_tx_bytes", "link_rx_bytes",
                      "pcie_tx_bytes", "pcie_rx_bytes", "throttle_power_s", "throttle_thermal_s",
                      "throttle_current_s", "throttle_other_s", "mem_temp_c", "vr_temp_c"):
            assert math.isnan(getattr(s, field)), (s.gpu, field)


def test_memory_and_regulator_temperatures_are_the_hottest_sensor(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    # MI300X: the firmware's hottest HBM stack in temperature_mem, hottest regulator in temperature_vrsoc.
    s = backend.sample(node.now_ns(0))[0]
    assert (s.mem_temp_c, s.vr_temp_c) == (64.0, 52.0)
    # A table with per-stack and per-rail fields (MI200): absent sensors read N/A or the 16-bit sentinel.
    m = node.metrics(0, 0)
    m.update(temperature_mem="N/A", temperature_hbm=[70, 75, 0xFFFF, "N/A"],
             temperature_vrgfx=60, temperature_vrsoc=55, temperature_vrmem=0xFFFF)
    s = backend.sample(node.now_ns(0) + 1)[0]
    assert (s.mem_temp_c, s.vr_temp_c) == (75.0, 60.0)
    m.update(temperature_hbm="N/A", temperature_vrgfx="N/A", temperature_vrsoc=0xFFFF)
    s = backend.sample(node.now_ns(0) + 2)[0]
    assert math.isnan(s.mem_temp_c) and math.isnan(s.vr_temp_c)
    assert s.temp_c == 78.0  # the hotspot reads on


def test_partial_fields_fall_back(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    m = node.metrics(0, 0)
    m["current_gfxclks"] = [2100, "N/A", 1900, 0, "N/A", "N/A", "N/A", "N/A"]  # absent XCCs skipped
    m["current_socket_power"] = "N/A"
    m["average_socket_power"] = 700
    m["average_gfx_activity"] = 130  # above 100 % is a bad read
    m["xgmi_read_data_acc"] = [1000, "N/A", 24, "N/A", "N/A", "N/A", "N/A", "N/A"]

    s = backend.sample(node.now_ns(0))[0]

    assert s.gfx_clock_mhz == 2000.0
    assert s.power_w == 700.0
    assert math.isnan(s.busy_ratio)
    assert s.link_rx_bytes == 1024 * 1024


def test_throttle_survives_stalled_and_reset_counters(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    t0 = node.now_ns(0)
    base = node.metrics(0, 0)

    def read(ns: int, counter: int, ppt: int) -> float:
        node.ticks[0][0]["gpu_metrics_info"] = {**base, "accumulation_counter": counter,
                                                "ppt_residency_acc": ppt}
        return backend.sample(ns)[0].throttle_power_s

    assert read(t0, 1000, 500) == 0.0
    # The firmware table was not refreshed: nothing added, the baseline stays at t0.
    assert read(t0 + 50_000_000, 1000, 500) == 0.0
    # 200 iterations over 200 ms since the baseline, 100 of them power-limited: 0.1 s.
    assert read(t0 + 200_000_000, 1200, 600) == pytest.approx(0.1)
    # A GPU reset zeroes the counters: re-baseline, keep what was accumulated.
    assert read(t0 + 300_000_000, 10, 5) == pytest.approx(0.1)
    # Fully throttled for 100 ms after the reset.
    assert read(t0 + 400_000_000, 110, 105) == pytest.approx(0.2)


def test_device_lost_mid_run(backend: AmdBackend, node: FakeNode, real_amdsmi: ModuleType) -> None:
    _opened(backend, node)
    backend.sample(node.now_ns(0))
    lost = node.error(real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_FOUND)
    node.smi.amdsmi_get_gpu_metrics_info.side_effect = lambda h: (_ for _ in ()).throw(lost) \
        if h == "handle1" else node.metrics(0, 1)

    with pytest.raises(DeviceLost) as caught:
        backend.sample(node.now_ns(1))

    assert caught.value.gpu == 1
    assert "GPU 1 stopped answering" in str(caught.value)
    assert "AMDSMI_STATUS_NOT_FOUND" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_other_vendor_failure_is_a_backend_error(backend: AmdBackend, node: FakeNode,
                                                 real_amdsmi: ModuleType) -> None:
    _opened(backend, node)
    node.smi.amdsmi_get_gpu_metrics_info.side_effect = node.error(
        real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NO_PERM)

    with pytest.raises(BackendError) as caught:
        backend.sample(node.now_ns(0))

    assert not isinstance(caught.value, DeviceLost)
    assert "GPU 0 gpu metrics failed" in str(caught.value)
    assert "Permission Denied" in str(caught.value)


def test_no_gpu_is_unavailable_and_shuts_down(backend: AmdBackend, node: FakeNode) -> None:
    node.smi.amdsmi_get_processor_handles.return_value = []

    with pytest.raises(BackendUnavailable, match="no AMD GPU"):
        backend.open()

    node.smi.amdsmi_shut_down.assert_called_once_with()


def test_init_failure_is_unavailable(backend: AmdBackend, node: FakeNode, real_amdsmi: ModuleType) -> None:
    node.smi.amdsmi_init.side_effect = node.error(real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_DRIVER_NOT_LOADED)

    with pytest.raises(BackendUnavailable, match=r"amdsmi_init failed.*Driver not loaded"):
        backend.open()


def test_gpu_without_gpu_metrics_is_unavailable(backend: AmdBackend, node: FakeNode,
                                                real_amdsmi: ModuleType) -> None:
    node.smi.amdsmi_get_gpu_metrics_info.side_effect = node.error(
        real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED)

    with pytest.raises(BackendUnavailable, match="no gpu_metrics"):
        backend.open()


def test_unsupported_descriptive_queries_become_nan(backend: AmdBackend, node: FakeNode,
                                                    real_amdsmi: ModuleType) -> None:
    unsupported = node.error(real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED)
    node.smi.amdsmi_get_power_cap_info.side_effect = unsupported
    node.smi.amdsmi_get_clock_info.side_effect = unsupported

    d = backend.open()[0]

    assert math.isnan(d.power_cap_w)
    assert d.max_gfx_clock_mhz == 2100.0  # from the MI300X spec


def test_close_is_idempotent(backend: AmdBackend, node: FakeNode) -> None:
    backend.close()  # before open: nothing to shut down
    backend.open()
    backend.close()
    backend.close()

    node.smi.amdsmi_shut_down.assert_called_once_with()
    with pytest.raises(BackendError, match="before open"):
        backend.sample(0)


def test_sample_before_open_is_an_error() -> None:
    with pytest.raises(BackendError, match="before open"):
        AmdBackend("n", smi=mock.Mock()).sample(0)


@pytest.fixture
def fake_rocmless_amdsmi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``amdsmi`` package that fails to import the way 7.0 does without ROCm."""
    package = tmp_path / "amdsmi"
    package.mkdir()
    (package / "__init__.py").write_text(
        'print("/opt/rocm/lib/libamd_smi.so: cannot open shared object file")\n'
        'print("Unable to find libamd_smi.so library try installing amd-smi-lib")\n'
        'raise KeyError("libamd_smi.so")\n'
    )
    for name in _vendor_modules():
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.usefixtures("fake_rocmless_amdsmi")
def test_missing_rocm_is_unavailable_and_stdout_stays_clean(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BackendUnavailable) as caught:
        import_amdsmi()

    message = str(caught.value)
    assert "cannot import amdsmi (KeyError: 'libamd_smi.so'" in message
    assert "it printed: /opt/rocm/lib/libamd_smi.so: cannot open shared object file" in message
    assert "install ROCm" in message and "chopper-telemetry[amd]" in message
    assert capsys.readouterr().out == ""


@pytest.mark.usefixtures("fake_rocmless_amdsmi")
def test_open_without_rocm_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BackendUnavailable, match="install ROCm"):
        AmdBackend("n").open()
    assert capsys.readouterr().out == ""


def test_amdsmi_not_installed_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # what an absent package raises: ImportError

    with pytest.raises(BackendUnavailable, match=r"cannot import amdsmi.*chopper-telemetry\[amd\]"):
        import_amdsmi()


@pytest.mark.gpu
def test_real_amd_gpu() -> None:
    """On an AMD node: two real reads give sane values, counters that do not go backwards, health once."""
    backend = AmdBackend("real")
    try:
        devices = backend.open()
    except BackendUnavailable as exc:
        pytest.skip(f"no AMD GPU here: {exc}")
    try:
        first = backend.sample(1)
        second = backend.sample(1 + 200_000_000)
    finally:
        backend.close()
    assert len(first) == len(devices) > 0
    for a, b in zip(first, second, strict=True):
        d = devices[b.gpu]
        assert 0 < b.gfx_clock_mhz <= d.max_gfx_clock_mhz * 1.05
        assert math.isnan(b.busy_ratio) or 0 <= b.busy_ratio <= 1
        assert math.isnan(a.energy_j) or b.energy_j >= a.energy_j  # NaN: a chip's further partition
        assert b.mem_used_bytes <= d.memory_bytes
        assert 0 < d.compute_share <= 1 and d.chip_uuid
        # Health came with the first read only, whole-chip counters flagged on partitioned chips.
        assert all(e.kind in ERROR_KINDS and e.chip_wide == (d.compute_share < 1) for e in a.errors)
        assert b.errors == ()


def test_pci_bus_ids_are_what_amds_kubernetes_device_plugin_names_devices(node: FakeNode, backend: AmdBackend) -> None:
    # agent.podresources matches these to the kubelet's device ids; an unreadable one only loses its pod label.
    bus = {"handle0": "0000:05:00.0"}
    node.smi.amdsmi_get_gpu_device_bdf.side_effect = lambda h: bus[h] if h in bus else _raise(node.error(2))
    backend.open()
    assert backend.pci_bus_ids() == {0: "0000:05:00.0"}


def _raise(exc: Exception) -> str:
    raise exc


def test_each_xgmi_link_has_its_own_counters(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    m = node.metrics(0, 0)
    s = backend.sample(node.now_ns(0))[0]
    # Link 7 reads 0 with xgmi_link_status 0 (down): the seven peers of an 8-GPU hive remain.
    assert [k.link for k in s.links] == list(range(7))
    assert [k.tx_bytes for k in s.links] == [v * 1024 for v in m["xgmi_write_data_acc"][:7]]
    assert [k.rx_bytes for k in s.links] == [v * 1024 for v in m["xgmi_read_data_acc"][:7]]
    assert sum(k.rx_bytes for k in s.links) == s.link_rx_bytes
    assert sum(k.tx_bytes for k in s.links) == s.link_tx_bytes


def test_per_link_counters_grow_between_ticks(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    first = backend.sample(node.now_ns(0))[0]
    node.tick = 1
    second = backend.sample(node.now_ns(1))[0]
    grown = [b.rx_bytes - a.rx_bytes for a, b in zip(first.links, second.links, strict=True)]
    assert grown[0] == (9_770_507_812 - 9_765_625_000) * 1024
    assert sum(grown) == second.link_rx_bytes - first.link_rx_bytes


def test_unreadable_link_entries(backend: AmdBackend, node: FakeNode) -> None:
    _opened(backend, node)
    m = node.metrics(0, 0)
    m["xgmi_read_data_acc"] = [1000, "N/A", 24, "N/A", "N/A", "N/A", "N/A", "N/A"]
    m["xgmi_write_data_acc"] = [2000, "N/A", "N/A", "N/A", "N/A", "N/A", "N/A", "N/A"]
    m["xgmi_link_status"] = "N/A"  # not reported: the counters alone decide
    s = backend.sample(node.now_ns(0))[0]
    assert [k.link for k in s.links] == [0, 2]
    assert s.links[0] == LinkBytes(0, 2000 * 1024, 1000 * 1024)
    assert math.isnan(s.links[1].tx_bytes) and s.links[1].rx_bytes == 24 * 1024
    m["xgmi_read_data_acc"] = m["xgmi_write_data_acc"] = "N/A"
    assert backend.sample(node.now_ns(0) + 1)[0].links == ()
