"""Model strings as the vendor libraries report them map to the right data sheet.

The strings are those ``nvmlDeviceGetName`` and ``amdsmi_get_gpu_asic_info``'s ``market_name``
return on these boards (as printed by ``nvidia-smi -L`` / ``amd-smi static``); the expected peaks
are the vendors' dense BF16 figures, so a PCIe or NVL card is never credited with an SXM module's
peak (which would understate its MFU by 15–25 %).
"""
from __future__ import annotations

import pytest

from agent.backends.specs import find_spec


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
