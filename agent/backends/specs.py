"""Peak specifications of the GPU models Chopper knows, used for MFU and the simulator.

``peak_flops`` is dense BF16 (no sparsity) at the maximum graphics clock, from the vendors'
data sheets (NVIDIA's H100 and H200 product briefs give the PCIe and NVL cards fewer SMs at a lower
clock and power than the SXM modules, so each form factor is its own entry). Operators override
the peak per node in the agent config when their SKU differs from its data sheet.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """Data-sheet figures for one GPU model.

    Attributes:
        model: Canonical name, e.g. ``MI300X``.
        vendor: ``amd`` or ``nvidia``.
        peak_flops: Dense BF16 FLOP/s at ``max_gfx_clock_mhz``.
        max_gfx_clock_mhz: Peak engine clock, MHz.
        memory_bytes: HBM capacity, bytes.
        tdp_w: Default board/socket power limit, watts.
        idle_w: Typical idle power, watts (simulator only).
        mem_clock_mhz: Memory clock, MHz.
    """

    model: str
    vendor: str
    peak_flops: float
    max_gfx_clock_mhz: float
    memory_bytes: int
    tdp_w: float
    idle_w: float
    mem_clock_mhz: float


_GIB = 1024**3
_GB = 1000**3

SPECS: dict[str, GpuSpec] = {
    s.model: s
    for s in (
        GpuSpec("MI300X", "amd", 1307.4e12, 2100.0, 192 * _GIB, 750.0, 140.0, 1300.0),
        GpuSpec("MI325X", "amd", 1307.4e12, 2100.0, 256 * _GIB, 1000.0, 160.0, 1300.0),
        GpuSpec("MI250X", "amd", 383.0e12, 1700.0, 128 * _GIB, 560.0, 90.0, 1600.0),
        GpuSpec("H100", "nvidia", 989.4e12, 1980.0, 80 * _GIB, 700.0, 70.0, 2619.0),  # SXM5
        GpuSpec("H100 PCIE", "nvidia", 756.5e12, 1755.0, 80 * _GIB, 350.0, 45.0, 1593.0),
        GpuSpec("H100 NVL", "nvidia", 835.5e12, 1785.0, 94 * _GB, 400.0, 50.0, 2619.0),
        GpuSpec("H200", "nvidia", 989.4e12, 1980.0, 141 * _GB, 700.0, 75.0, 3201.0),  # SXM5
        GpuSpec("H200 NVL", "nvidia", 835.5e12, 1785.0, 141 * _GB, 600.0, 60.0, 3201.0),
        GpuSpec("A100", "nvidia", 312.0e12, 1410.0, 80 * _GIB, 400.0, 55.0, 1593.0),
    )
}


def find_spec(model_name: str) -> GpuSpec | None:
    """Return the spec whose canonical name appears in a vendor's model string.

    ``"AMD Instinct MI300X"`` → MI300X, ``"NVIDIA H100 80GB HBM3"`` → H100 (SXM), ``"NVIDIA H100
    PCIe"`` → H100 PCIE. Longest names are tried first so that ``MI325X`` or ``H200 NVL`` is not
    mistaken for a shorter match; the match ignores case. None when unknown.
    """
    upper = model_name.upper()
    for name in sorted(SPECS, key=len, reverse=True):
        if name in upper:
            return SPECS[name]
    return None
