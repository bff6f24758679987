"""MIG devices of the nvidia backend against the autospecced pynvml.

GPU 0 of the 2x H100 SXM5 fixture node runs MIG with two 3g.40gb devices
(``tests/fixtures/nvml/h100_sxm_mig_2x3g.json``: profile figures as ``nvidia-smi mig -lgip`` prints
them for an H100 80GB HBM3, 60 of 132 SMs per 3g instance); GPU 1 stays whole. Devices are then
gpu 0 and 1 (the MIG devices, in MIG index order) and gpu 2 (GPU 1).
"""
from __future__ import annotations

import logging
import math
from typing import Any

import pynvml
import pytest

from agent.backends.base import BackendUnavailable, DeviceLost
from agent.backends.nvidia import HEALTH_INTERVAL_NS, NvidiaBackend
from agent.backends.specs import SPECS
from tests.support.nvml_fake import FakeNode, backend_for, load_fixture, load_mig

CHIP_UUID = "GPU-5c1e4b2a-9f3d-7e21-a4b8-0d6c2e91f7a3"
CHIP_ONLY = ("power_w", "energy_j", "temp_c", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes",
             "throttle_power_s", "throttle_thermal_s", "throttle_current_s", "throttle_other_s")


@pytest.fixture
def node() -> FakeNode:
    """A fresh fake NVML: GPU 0 in MIG mode with two 3g.40gb devices, GPU 1 whole."""
    return FakeNode(load_fixture(), mig=load_mig())


def opened(node: FakeNode) -> NvidiaBackend:
    backend = backend_for(node)
    backend.open()
    return backend


def test_each_mig_device_is_a_device_of_its_own(node: FakeNode) -> None:
    devices = backend_for(node).open()

    assert [d.gpu for d in devices] == [0, 1, 2]
    assert [d.uuid for d in devices] == [d["uuid"] for d in node.mig["mig_devices"]] + [
        node.fx["devices"][1]["uuid"]]
    for d in devices[:2]:
        assert (d.model, d.partition, d.chip_uuid) == ("NVIDIA H100 80GB HBM3", "MIG 3g.40gb", CHIP_UUID)
        assert d.pci_bus_id == "00000000:18:00.0"  # the parent's
        assert d.memory_bytes == 40448 * 2**20  # the MIG handle's own memory, not the chip's 80 GB
        assert (d.max_gfx_clock_mhz, d.power_cap_w) == (1980.0, 700.0)  # the chip's
    whole = devices[2]
    assert (whole.partition, whole.chip_uuid, whole.compute_share) == ("", whole.uuid, 1.0)
    assert whole.pci_bus_id == "00000000:2A:00.0"


def test_compute_share_counts_sms_not_slices(node: FakeNode) -> None:
    mig = backend_for(node).open()[0]
    assert mig.compute_share == 60 / 132  # nvmlDeviceGetAttributes over the 7g.80gb profile's SMs
    assert mig.compute_share != pytest.approx(3 / 7, abs=0.01)  # 3 of 7 slices would be 0.4286
    assert mig.peak_flops == SPECS["H100"].peak_flops * (60 / 132)
    asked = {c.args[1] for c in node.nv.nvmlDeviceGetGpuInstanceProfileInfo.call_args_list}
    assert asked == set(range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT))  # once per profile, at open


def test_unreadable_sm_counts_fall_back_to_the_memory_share(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.nv.nvmlDeviceGetAttributes.side_effect = pynvml.NVMLError_NotSupported()
    with caplog.at_level(logging.WARNING, logger="agent.backends.nvidia"):
        mig = backend_for(node).open()[0]
    assert mig.compute_share == 40448 * 2**20 / node.fx["devices"][0]["memory_total_bytes"]
    assert math.isnan(mig.peak_flops)
    said = [r.getMessage() for r in caplog.records if "event=mig_sms_unread" in r.getMessage()]
    assert len(said) == 2 and "MFU is n/a" in said[0], said


def test_chip_readings_come_once_on_the_first_mig_device(node: FakeNode) -> None:
    first, second, whole = opened(node).sample(node.at(0))

    assert first.power_w == 699.42 and first.energy_j == 48213554.112  # GPU 0's fields
    assert len(first.links) == 18
    assert all(math.isnan(getattr(second, column)) for column in CHIP_ONLY)
    assert second.links == ()
    # One clock domain drives every MIG device: each carries the chip's clocks.
    assert (first.gfx_clock_mhz, first.mem_clock_mhz) == (second.gfx_clock_mhz, second.mem_clock_mhz) == (
        1755.0, 2619.0)
    # Memory in use is each MIG device's own.
    assert (first.mem_used_bytes, second.mem_used_bytes) == (39728447488, 9663676416)
    assert whole.power_w == 612.88 and len(whole.links) == 17
    for name in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature"):
        assert all(c.args[0][0] == "handle" for c in getattr(node.nv, name).call_args_list), name


def test_chip_wide_counters_come_on_the_first_mig_device_only(node: FakeNode) -> None:
    backend = opened(node)
    node.xid(0, 94)
    first, second, whole = backend.sample(node.at(0))

    assert first.errors and all(e.chip_wide for e in first.errors)
    assert second.errors == ()
    assert whole.errors and not any(e.chip_wide for e in whole.errors)
    got = {(e.kind, e.window, e.detail): e.value for e in first.errors}
    assert got[("xid", "", "94")] == 1.0  # an XID of a MIG chip is counted on the chip
    assert got[("ecc_corrected", "aggregate", "total")] == 12.0  # GPU 0's
    assert got[("link_replay", "", "")] == 3.0
    assert all(c.args[0] == ("handle", 0) for c in node.nv.nvmlDeviceGetTotalEccErrors.call_args_list[:4])
    later = backend.sample(node.at(0) + HEALTH_INTERVAL_NS)
    assert [bool(s.errors) for s in later] == [True, False, True]


def test_mig_activity_comes_from_gpm_per_gpu_instance(node: FakeNode) -> None:
    backend = opened(node)
    first, second, _ = backend.sample(node.at(0))
    # GPM percentages of each instance (the fixture's tick 0) → ratios.
    assert (first.busy_ratio, first.matrix_ratio, first.mem_busy_ratio) == (97.2 / 100, 58.6 / 100, 40.1 / 100)
    assert (second.busy_ratio, second.matrix_ratio, second.mem_busy_ratio) == (31.5 / 100, 8.4 / 100, 12.7 / 100)
    later = backend.sample(node.at(1))
    assert (later[1].busy_ratio, later[1].matrix_ratio) == (28.8 / 100, 7.1 / 100)

    instances = sorted({c.args[:2] for c in node.nv.nvmlGpmMigSampleGet.call_args_list})
    assert instances == [(("handle", 0), 1), (("handle", 0), 2)]  # the chip's handle and each GPU instance id
    assert node.metrics_calls[3] == ((("mig", 0, 0), 0), (("mig", 0, 0), 1))
    node.nv.nvmlDeviceGetUtilizationRates.assert_not_called()


def test_without_gpm_a_mig_device_has_no_activity(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.fx["devices"][0]["gpm_supported"] = False  # as an A100 in MIG mode
    with caplog.at_level(logging.INFO, logger="agent.backends.nvidia"):
        backend = opened(node)
    samples = backend.sample(node.at(0))

    for s in samples[:2]:
        assert math.isnan(s.busy_ratio) and math.isnan(s.matrix_ratio) and math.isnan(s.mem_busy_ratio)
        assert s.gfx_clock_mhz == 1755.0
    said = [r.getMessage() for r in caplog.records if "event=gpm_unsupported" in r.getMessage()]
    assert sum("a MIG device has no utilisation without GPM" in m for m in said) == 2, said
    # NVML has no utilisation under MIG: the backend never asks for it there.
    assert all(c.args[0] == ("handle", 1) for c in node.nv.nvmlDeviceGetUtilizationRates.call_args_list)


def test_a_mig_enabled_gpu_without_mig_devices_has_none(node: FakeNode, caplog: pytest.LogCaptureFixture) -> None:
    node.mig["mig_devices"] = []
    with caplog.at_level(logging.WARNING, logger="agent.backends.nvidia"):
        backend = backend_for(node)
        devices = backend.open()
    assert [(d.gpu, d.uuid) for d in devices] == [(0, node.fx["devices"][1]["uuid"])]
    assert any("event=mig_without_devices" in r.getMessage() for r in caplog.records)
    assert [s.gpu for s in backend.sample(node.at(0))] == [0]
    assert node.nv.nvmlDeviceGetMigDeviceHandleByIndex.call_count == 7  # every index answered NOT_FOUND


def test_only_mig_gpus_without_mig_devices_are_unavailable_naming_the_fix(node: FakeNode) -> None:
    node.mig["mig_devices"] = []
    node.nv.nvmlDeviceGetCount.return_value = 1
    with pytest.raises(BackendUnavailable, match=r"no MIG device created: create .*nvidia-smi mig -cgi"):
        backend_for(node).open()
    node.nv.nvmlShutdown.assert_called_once_with()


def test_a_gpu_without_mig_support_is_a_whole_chip(node: FakeNode) -> None:
    node.nv.nvmlDeviceGetMigMode.side_effect = pynvml.NVMLError_NotSupported()  # e.g. an L40S
    devices = backend_for(node).open()
    assert [(d.partition, d.compute_share) for d in devices] == [("", 1.0), ("", 1.0)]


@pytest.mark.parametrize(("lost_gpu", "reported"), [(0, 0), (1, 2)])
def test_a_lost_chip_names_its_first_device(node: FakeNode, lost_gpu: int, reported: int) -> None:
    backend = opened(node)
    answer = node.nv.nvmlDeviceGetFieldValues.side_effect

    def lose(handle: Any, ids: list[tuple[int, int]]) -> Any:
        if handle[1] == lost_gpu:
            raise pynvml.NVMLError_GpuIsLost()
        return answer(handle, ids)

    node.nv.nvmlDeviceGetFieldValues.side_effect = lose
    with pytest.raises(DeviceLost) as info:
        backend.sample(node.at(0))
    assert info.value.gpu == reported


def test_a_mig_device_without_a_gpu_instance_id_has_no_activity(node: FakeNode,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    node.nv.nvmlDeviceGetGpuInstanceId.side_effect = pynvml.NVMLError_NoPermission()
    with caplog.at_level(logging.WARNING, logger="agent.backends.nvidia"):
        backend = opened(node)
    first, second, whole = backend.sample(node.at(0))
    assert math.isnan(first.matrix_ratio) and math.isnan(second.busy_ratio)
    assert whole.matrix_ratio == 66.8 / 100  # GPU 1's own GPM
    node.nv.nvmlGpmMigSampleGet.assert_not_called()
    assert sum("no GPU instance id" in r.getMessage() for r in caplog.records) == 2
