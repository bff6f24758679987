"""The simulated backend's partitioned chips: identity, scaling, per-partition activity, chip-wide quantities."""
from __future__ import annotations

import math

import numpy as np
import pytest

from agent.backends.simulated import SimulatedBackend
from agent.backends.specs import SPECS
from chopper.schema import MarkerKind as K
from chopper.schema import Sample

T0 = 1_700_000_000_000_000_000
TICK = 100_000_000  # 10 Hz
MS = 1_000_000


def _train(b: SimulatedBackend, devices: list[int], seconds: float) -> list[list[Sample]]:
    """Open ``b``; ``devices`` run 500 ms steps of 450 ms forward+backward for ``seconds`` at 10 Hz."""
    b.open()
    out = []
    for i in range(int(seconds * 10) + 1):
        t = T0 + i * TICK
        if i % 5 == 0:
            for g in devices:
                b.observe_marker(g, K.STEP_BEGIN, "", t, 0)
                b.observe_marker(g, K.PHASE_BEGIN, "forward", t + MS, 0)
                b.observe_marker(g, K.PHASE_END, "forward", t + 450 * MS, 0)
                b.observe_marker(g, K.STEP_END, "", t + 499 * MS, 0)
        out.append(b.sample(t))
    return out


def test_a_cpx_mi300x_chip_is_eight_devices_with_an_eighth_each() -> None:
    chip = SimulatedBackend("n", model="MI300X", gpus=1, seed=4).open()[0]
    b = SimulatedBackend("n", model="MI300X", gpus=1, seed=4, partition="CPX", memory_partition="NPS4")
    devs = b.open()
    spec = SPECS["MI300X"]
    assert [d.gpu for d in devs] == list(range(8)) and b.gpus == 8 and b.chips == 1
    assert {(d.partition, d.memory_partition, d.compute_share, d.vendor) for d in devs} == {
        ("CPX", "NPS4", 0.125, "simulated")}
    assert {d.peak_flops for d in devs} == {spec.peak_flops / 8} and {d.memory_bytes for d in devs} == {24 * 2**30}
    assert {d.max_gfx_clock_mhz for d in devs} == {spec.max_gfx_clock_mhz}  # partitions clock as the chip does
    # Each partition its own UUID; all of them the chip's, the one it has as a whole chip.
    assert len({d.uuid for d in devs}) == 8 and {d.chip_uuid for d in devs} == {chip.uuid} == {chip.chip_uuid}
    assert chip.uuid not in {d.uuid for d in devs}
    assert (chip.partition, chip.memory_partition, chip.compute_share) == ("", "", 1.0)
    # A compute partition without a memory partition runs NPS1, as the driver's default.
    assert {d.memory_partition for d in SimulatedBackend("n", gpus=2, partition="DPX").open()} == {"NPS1"}
    assert len(SimulatedBackend("n", gpus=2, partition="QPX").open()) == 8


def test_an_h100_in_mig_3g_40gb_is_two_instances_of_60_sms_and_40_gib() -> None:
    b = SimulatedBackend("n", model="H100", gpus=2, partition="3g.40gb")
    devs = b.open()
    assert len(devs) == 4 and [d.partition for d in devs] == ["MIG 3g.40gb"] * 4
    assert {d.compute_share for d in devs} == {60 / 132} and {d.memory_bytes for d in devs} == {40 * 2**30}
    assert {d.peak_flops for d in devs} == {SPECS["H100"].peak_flops * (60 / 132)}
    assert {d.memory_partition for d in devs} == {""}
    assert devs[0].chip_uuid == devs[1].chip_uuid != devs[2].chip_uuid == devs[3].chip_uuid
    one = SimulatedBackend("n", model="H100", gpus=1, partition="1g.10gb").open()
    assert len(one) == 7 and one[0].compute_share == 16 / 132 and one[0].memory_bytes == 10 * 2**30


def test_each_partition_follows_its_own_markers_and_the_chip_draws_for_their_work() -> None:
    ticks = _train(SimulatedBackend("n", gpus=2, seed=1, partition="CPX"), [3, 9], 10.0)
    busy = np.array([[s.busy_ratio for s in t] for t in ticks[-40:]]).mean(axis=0)
    assert busy[3] > 0.7 and busy[9] > 0.7
    assert max(busy[g] for g in range(16) if g not in (3, 9)) < 0.05
    mem = [s.mem_used_bytes for s in ticks[-1]]
    assert mem[3] > 0.7 * 24 * 2**30 and mem[3] < 0.85 * 24 * 2**30 and mem[0] == 0.5 * 2**30
    # One partition of eight busy: its chip draws well under a whole busy chip, above an idle one.
    whole = _train(SimulatedBackend("n", gpus=2, seed=1), [0], 10.0)
    idle = _train(SimulatedBackend("n", gpus=2, seed=1, partition="CPX"), [], 10.0)
    e_part, e_whole, e_idle = ticks[-1][0].energy_j, whole[-1][0].energy_j, idle[-1][0].energy_j
    assert e_idle < e_part < e_idle + 0.25 * (e_whole - e_idle)


def test_all_partitions_busy_draw_as_the_whole_chip_does() -> None:
    """Shares sum to the chip: eight busy CPX partitions are one busy chip, two 3g.40gb instances 120/132 of it."""
    cpx = _train(SimulatedBackend("n", gpus=1, seed=3, partition="CPX"), list(range(8)), 5.0)
    whole = _train(SimulatedBackend("n", gpus=1, seed=3), [0], 5.0)
    assert cpx[-1][0].energy_j == pytest.approx(whole[-1][0].energy_j, rel=1e-9)
    assert [t[0].gfx_clock_mhz for t in cpx] == pytest.approx([t[0].gfx_clock_mhz for t in whole], rel=1e-9)
    mig = _train(SimulatedBackend("n", model="H100", gpus=1, seed=3, partition="3g.40gb"), [0, 1], 5.0)
    h100 = _train(SimulatedBackend("n", model="H100", gpus=1, seed=3), [0], 5.0)
    assert mig[-1][0].energy_j < h100[-1][0].energy_j


def test_chip_wide_quantities_come_once_on_the_first_partition() -> None:
    b = SimulatedBackend("n", model="MI300X", gpus=2, seed=2, partition="CPX", health_events=["1:ecc_corrected:1:8"])
    ticks = _train(b, list(range(16)), 3.0)
    for t in ticks:
        for s in t:
            first = s.gpu % 8 == 0
            assert all(math.isnan(x) != first for x in (s.power_w, s.energy_j, s.temp_c)), s
            assert bool(s.errors) == (first and (s.ts_ns - T0) % 10**9 == 0)
            assert all(e.chip_wide for e in s.errors)
            assert math.isfinite(s.gfx_clock_mhz) and math.isfinite(s.throttle_power_s)
        # The chip's clock and throttle residency on each of its partitions.
        assert len({s.gfx_clock_mhz for s in t[:8]}) == 1 and len({s.throttle_power_s for s in t[8:]}) == 1
    # A sum over devices counts each chip's power once: 2 chips, not 16.
    assert np.nansum([s.power_w for s in ticks[-1]]) < 2 * 750.0
    # Chip 1's errors are reported on its first partition, device 8.
    last = {(e.kind, e.detail): e.value for e in ticks[-1][8].errors if e.window == "volatile"}
    assert last[("ecc_corrected", "umc")] == 8.0
    assert not any(e.value for e in ticks[-1][0].errors)


def test_markers_for_a_device_the_node_lacks_are_ignored() -> None:
    b = SimulatedBackend("n", model="H100", gpus=1, partition="3g.40gb")
    b.open()
    b.observe_marker(2, K.STEP_BEGIN, "", T0, 0)
    assert b.ignored_markers == 1 and len(b.sample(T0)) == 2


def test_same_seed_same_partitioned_node() -> None:
    runs = [_train(SimulatedBackend("n", model="H200", gpus=2, seed=6, partition="3g.71gb",
                                    health_events=["1:link_replay:1:5"]), [0, 3], 3.0) for _ in range(2)]
    values = [np.array([[(s.busy_ratio, s.power_w, s.energy_j, s.link_tx_bytes) for s in t] for t in r]) for r in runs]
    np.testing.assert_array_equal(values[0], values[1])  # NaN where NaN, every other value exactly
    assert [[s.errors for s in t] for t in runs[0]] == [[s.errors for s in t] for t in runs[1]]
    assert any(e.value == 5.0 for t in runs[0] for e in t[2].errors)
    other = _train(SimulatedBackend("n", model="H200", gpus=2, seed=7, partition="3g.71gb"), [0, 3], 3.0)
    assert [s.busy_ratio for s in other[-1]] != [s.busy_ratio for s in runs[0][-1]]


@pytest.mark.parametrize(("model", "partition", "memory", "message"), [
    ("H100", "CPX", "", r"'CPX' is not a MIG profile of H100; choose one of \"\" \(whole chips\), '1g.10gb'"),
    ("MI300X", "3g.40gb", "", r"not a compute partition of MI300X; choose one of .*'DPX', 'QPX', 'CPX'"),
    ("MI300X", "", "NPS4", r"needs compute partition CPX, not SPX"),
    ("H100", "5g.50gb", "", r"not a MIG profile of H100"),
    ("A100", "3g.40gb", "", r"not simulated for A100"),
])
def test_invalid_partitions_are_refused_with_the_choices(model: str, partition: str, memory: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimulatedBackend("n", model=model, partition=partition, memory_partition=memory)
