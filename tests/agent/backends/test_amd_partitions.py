"""Compute and memory partitions in the amd backend: each partition a device, the chip's values once.

The fake answers from ``tests/fixtures/amdsmi/mi300x_cpx_nps4.json``: two MI300X chips in CPX
mode with NPS4 memory, 8 processor handles each, every one reading its chip's gpu_metrics table
(``mi300x_under_load.json``) and health (``mi300x_health.json``).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from agent.backends.amd import AmdBackend
from tests.support.amdsmi_fake import MIB, FakeNode, backend_for, import_real_amdsmi, load

T0 = 1_735_689_600_000_000_000
MI300X_PEAK = 1307.4e12
CHIP_WIDE = ("power_w", "energy_j", "temp_c", "mem_temp_c", "vr_temp_c", "link_tx_bytes", "link_rx_bytes",
             "throttle_power_s", "throttle_thermal_s", "throttle_current_s")


@pytest.fixture(scope="module")
def real_amdsmi() -> ModuleType:
    return import_real_amdsmi()


@pytest.fixture
def cpx() -> list[dict[str, Any]]:
    return load("mi300x_cpx_nps4.json")["partitions"]


def _node(real: ModuleType, partitions: list[dict[str, Any]]) -> FakeNode:
    return FakeNode(real, load("mi300x_under_load.json"), partitions=partitions,
                    metrics_update=load("mi300x_cpx_nps4.json")["gpu_metrics_update"])


@pytest.fixture
def node(real_amdsmi: ModuleType, cpx: list[dict[str, Any]]) -> FakeNode:
    return _node(real_amdsmi, cpx)


@pytest.fixture
def backend(node: FakeNode) -> Iterator[AmdBackend]:
    with backend_for(node) as b:
        yield b


def test_a_cpx_mi300x_is_eight_devices_of_one_chip(backend: AmdBackend, cpx: list[dict[str, Any]]) -> None:
    devices = backend.open()

    assert [d.gpu for d in devices] == list(range(16))
    for chip, first in ((devices[:8], cpx[0]), (devices[8:], cpx[8])):
        assert {d.chip_uuid for d in chip} == {first["gpu_device_uuid"]}
        assert {d.pci_bus_id for d in chip} == {first["gpu_device_bdf"]}
        assert {(d.partition, d.memory_partition, d.compute_share) for d in chip} == {("CPX", "NPS4", 1 / 8)}
        assert {d.peak_flops for d in chip} == {MI300X_PEAK / 8}
        assert {d.memory_bytes for d in chip} == {24574 * MIB}  # each handle's own VRAM: half its NPS4 quadrant
    assert [d.uuid for d in devices] == [p["gpu_device_uuid"] for p in cpx]
    assert devices[0].chip_uuid != devices[8].chip_uuid
    assert sum(d.compute_share for d in devices[:8]) == pytest.approx(1.0)
    assert sum(d.peak_flops for d in devices[:8]) == pytest.approx(MI300X_PEAK)
    # The device plugin's ids are each handle's own address.
    assert backend.pci_bus_ids() == {gpu: p["gpu_device_bdf"] for gpu, p in enumerate(cpx)}


def test_chip_wide_values_come_with_the_first_partition_only(backend: AmdBackend, node: FakeNode) -> None:
    backend.open()
    node.opened = True

    samples = backend.sample(T0)

    firsts = [s for s in samples if s.gpu in (0, 8)]
    others = [s for s in samples if s.gpu not in (0, 8)]
    for s in firsts:
        assert (s.power_w, s.temp_c, s.mem_temp_c, s.vr_temp_c) == (742.0, 78.0, 64.0, 52.0)
        assert len(s.links) == 7 and s.errors
        assert all(e.chip_wide for e in s.errors)
    for s in others:
        assert all(math.isnan(getattr(s, f)) for f in CHIP_WIDE), s.gpu
        assert s.links == () and s.errors == ()
    # A sum of power over a chip's partitions is the chip's power, not eight times it.
    assert sum(s.power_w for s in samples[:8] if not math.isnan(s.power_w)) == 742.0
    # What amdsmi answers per handle stays per partition.
    assert [s.mem_used_bytes for s in samples[:8]] == [(20117 + 7 * p) * MIB for p in range(8)]
    assert [s.busy_ratio for s in samples[:8]] == [0.98, 0.97, 0.99, 0.12, 0.98, 0.97, 0.0, 0.97]  # its XCP's row
    assert all(s.gfx_clock_mhz == 1831.5 and s.mem_busy_ratio == 0.38 for s in samples)
    # Health is asked through each chip's first partition, never its others.
    assert {c.args[0] for c in node.smi.amdsmi_get_pcie_info.call_args_list} == {"handle0", "handle8"}


def test_the_chip_counts_energy_once_across_ticks(backend: AmdBackend, node: FakeNode) -> None:
    backend.open()
    node.opened = True
    first = backend.sample(T0)
    node.tick = 1
    second = backend.sample(T0 + 100_000_000)
    grown = [b.energy_j - a.energy_j for a, b in zip(first, second, strict=True) if not math.isnan(a.energy_j)]
    assert grown == pytest.approx([4_862_771 / 65536] * 2)  # one figure per chip


def test_the_first_partition_is_partition_id_zero_wherever_amdsmi_lists_it(
        real_amdsmi: ModuleType, cpx: list[dict[str, Any]]) -> None:
    chip = [cpx[i] for i in (3, 0, 1, 2, 4, 5, 6, 7)]
    node = _node(real_amdsmi, chip)
    backend = AmdBackend("node-a", smi=node.smi)

    devices = backend.open()
    samples = backend.sample(T0)

    assert {d.chip_uuid for d in devices} == {cpx[0]["gpu_device_uuid"]}
    assert [s.gpu for s in samples if not math.isnan(s.power_w)] == [1]
    assert [s.gpu for s in samples if s.errors] == [1]


def test_partitions_sharing_one_bdf_are_one_chip(real_amdsmi: ModuleType, cpx: list[dict[str, Any]]) -> None:
    # amdsmi versions that give every partition the chip's own address, function 0.
    same = [{**p, "gpu_device_bdf": p["gpu_device_bdf"][:-1] + "0"} for p in cpx]
    node = _node(real_amdsmi, same)

    devices = AmdBackend("node-a", smi=node.smi).open()

    assert [d.compute_share for d in devices] == [1 / 8] * 16
    assert len({d.chip_uuid for d in devices}) == 2


def test_dpx_halves_the_chip(real_amdsmi: ModuleType, cpx: list[dict[str, Any]]) -> None:
    dpx = [{**p, "gpu_compute_partition": "DPX", "gpu_memory_partition": "NPS1",
            "gpu_vram_usage": {"vram_total": 98296, "vram_used": 1}} for p in cpx[:2]]
    node = _node(real_amdsmi, dpx)

    devices = AmdBackend("node-a", smi=node.smi).open()

    assert [(d.partition, d.memory_partition, d.compute_share) for d in devices] == [("DPX", "NPS1", 0.5)] * 2
    assert [d.peak_flops for d in devices] == [MI300X_PEAK / 2] * 2
    assert [d.memory_bytes for d in devices] == [98296 * MIB] * 2


def test_a_gpu_without_partitioning_is_a_whole_chip(real_amdsmi: ModuleType) -> None:
    node = FakeNode(real_amdsmi, load("mi300x_under_load.json"))
    unsupported = real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED
    for query in ("amdsmi_get_gpu_compute_partition", "amdsmi_get_gpu_memory_partition", "amdsmi_get_gpu_kfd_info"):
        node.fail(query, unsupported)  # MI200: no partition API

    devices = AmdBackend("node-a", smi=node.smi).open()

    assert [(d.partition, d.memory_partition, d.compute_share) for d in devices] == [("", "", 1.0)] * 2
    assert [d.chip_uuid for d in devices] == [d.uuid for d in devices]


def test_unreadable_addresses_make_each_handle_a_chip(real_amdsmi: ModuleType, cpx: list[dict[str, Any]],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    node = _node(real_amdsmi, cpx[:2])
    node.fail("amdsmi_get_gpu_device_bdf", real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NO_PERM)
    backend = AmdBackend("node-a", smi=node.smi)

    devices = backend.open()

    assert [(d.compute_share, d.pci_bus_id) for d in devices] == [(1.0, "")] * 2
    assert backend.pci_bus_ids() == {}
    assert sum("identity_unreadable" in r.getMessage() and "pci bus id" in r.getMessage()
               for r in caplog.records) == 2


def test_a_further_partition_without_gpu_metrics_still_opens(backend: AmdBackend, node: FakeNode,
                                                            real_amdsmi: ModuleType) -> None:
    unsupported = node.error(real_amdsmi.amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED)
    chip_table = node.smi.amdsmi_get_gpu_metrics_info.side_effect
    node.smi.amdsmi_get_gpu_metrics_info.side_effect = \
        lambda h: chip_table(h) if h in ("handle0", "handle8") else (_ for _ in ()).throw(unsupported)

    devices = backend.open()
    samples = backend.sample(T0)

    assert len(devices) == 16
    assert math.isnan(samples[1].busy_ratio) and samples[1].mem_used_bytes == 20124 * MIB
    assert samples[0].power_w == 742.0


def test_a_partition_without_its_xcp_row_has_no_activity_not_the_chips(backend: AmdBackend, node: FakeNode) -> None:
    backend.open()
    del node.metrics(0, 0)["xcp_stats.gfx_busy_inst"]  # a driver before gpu_metrics v1.6

    samples = backend.sample(T0)

    assert all(math.isnan(s.busy_ratio) for s in samples[:8])
    assert samples[8].busy_ratio == 0.98  # the other chip's table still has its rows
