"""Model strings as the vendor libraries report them map to the right data sheet; partition tables.

The strings are those ``nvmlDeviceGetName`` and ``amdsmi_get_gpu_asic_info``'s ``market_name``
return on these boards (as printed by ``nvidia-smi -L`` / ``amd-smi static``); the expected peaks
are the vendors' dense BF16 figures, so a PCIe or NVL card is never credited with an SXM module's
peak (which would understate its MFU by 15–25 %).
"""
from __future__ import annotations

import pytest

from agent.backends.specs import CHIP_SMS, MIG_PROFILES, SPECS, PartitionError, find_spec, partition_layout


@pytest.mark.parametrize(("reported", "model", "dense_bf16_tflops", "tdp_w"), [
    ("NVIDIA H100 80GB HBM3", "H100", 989.4, 700.0),
    ("NVIDIA H100 PCIe", "H100 PCIE", 756.5, 350.0),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5, 400.0),
    ("NVIDIA H200", "H200", 989.4, 700.0),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5, 600.0),
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0, 400.0),
    ("AMD Instinct MI300X", "MI300X", 1307.4, 750.0),
    ("AMD Instinct MI325X", "MI325X", 1307.4, 1000.0),
])
def test_reported_names_find_their_own_data_sheet(reported: str, model: str, dense_bf16_tflops: float,
                                                  tdp_w: float) -> None:
    spec = find_spec(reported)
    assert spec is not None
    assert (spec.model, spec.peak_flops / 1e12, spec.tdp_w) == (model, pytest.approx(dense_bf16_tflops), tdp_w)


def test_an_unknown_model_has_no_spec() -> None:
    assert find_spec("NVIDIA GeForce RTX 4090") is None


@pytest.mark.parametrize("model", sorted(MIG_PROFILES))
def test_mig_profiles_fit_their_chip_as_nvidias_table_says(model: str) -> None:
    """The MIG User Guide's table: 7 compute slices of 132 SMs, 8 memory slices, instances that fit both."""
    spec = SPECS[model]
    for name, p in MIG_PROFILES[model].items():
        layout = partition_layout(spec, name)
        assert layout.partition == f"MIG {name}" and layout.per_chip == p.instances
        assert layout.per_chip * p.sms <= CHIP_SMS[model] and layout.per_chip * p.memory_eighths <= 8
        assert layout.compute_share == p.sms / CHIP_SMS[model]
        gb = layout.memory_share * spec.memory_bytes / 1e9
        assert gb == pytest.approx(float(name.split(".")[1].removesuffix("gb")), rel=0.1)  # 3g.40gb: ~40 GB
    assert partition_layout(spec, "").per_chip == 1


def test_h100_3g_40gb_is_60_of_132_sms_and_half_the_memory() -> None:
    layout = partition_layout(SPECS["H100"], "3g.40gb")
    assert (layout.per_chip, layout.compute_share, layout.memory_share) == (2, 60 / 132, 0.5)


@pytest.mark.parametrize(("mode", "per_chip"), [("SPX", 1), ("DPX", 2), ("QPX", 4), ("CPX", 8)])
def test_amd_compute_partitions_split_the_chip_evenly(mode: str, per_chip: int) -> None:
    layout = partition_layout(SPECS["MI300X"], mode)
    assert (layout.per_chip, layout.compute_share, layout.memory_share) == (per_chip, 1 / per_chip, 1 / per_chip)
    assert layout.partition == ("" if mode == "SPX" else mode)  # SPX is the whole chip
    assert layout.memory_partition == ("" if mode == "SPX" else "NPS1")
    assert partition_layout(SPECS["MI300X"], "CPX", "NPS4").memory_partition == "NPS4"


def test_invalid_partitions_say_which_setting_and_the_choices() -> None:
    with pytest.raises(PartitionError) as err:
        partition_layout(SPECS["MI300X"], "DPX", "NPS4")
    assert (err.value.setting, str(err.value)) == (
        "memory_partition", "memory_partition 'NPS4' needs compute partition CPX, not DPX; use NPS1 with DPX, "
        "or set the compute partition to CPX")
    with pytest.raises(PartitionError, match=r"partition '7g.141gb' is not a MIG profile of H100; .*'7g.80gb'"):
        partition_layout(SPECS["H100"], "7g.141gb")
    with pytest.raises(PartitionError, match=r"memory_partition 'NPS4' is an AMD memory partition; H100 has none"):
        partition_layout(SPECS["H100"], "", "NPS4")
