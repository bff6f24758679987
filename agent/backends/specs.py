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


# Partitions. A partitioned chip shows as several devices, each with its share of the chip's
# compute and memory (``chopper.schema.DeviceInfo.compute_share``).
#
# AMD compute partitions of the MI300 series, devices per chip: the chip's eight XCDs grouped into
# one (SPX), two (DPX), four (QPX) or eight (CPX) devices, each with an equal share of compute and
# HBM. Memory partitions: NPS1 (one pool) or NPS4 (one per HBM quadrant, 48 GB each on MI300X), and
# NPS4 only with CPX (AMD Instinct MI300X GPU partitioning overview and its compatibility matrix,
# instinct.docs.amd.com/projects/amdgpu-docs/en/latest/gpu-partitioning/mi300x/overview.html).
AMD_COMPUTE_PARTITIONS: dict[str, int] = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
AMD_MEMORY_PARTITIONS: dict[str, tuple[str, ...]] = {"NPS1": tuple(AMD_COMPUTE_PARTITIONS), "NPS4": ("CPX",)}
AMD_PARTITIONED_MODELS = ("MI300X", "MI325X")


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One NVIDIA MIG GPU-instance profile of a model.

    Attributes:
        sms: Streaming multiprocessors of one instance (``nvidia-smi mig -lgip``).
        memory_eighths: Its memory in eighths of the chip's (MIG divides memory into 8 slices).
        instances: Instances of this profile one chip holds at most.
    """

    sms: int
    memory_eighths: int
    instances: int


# NVIDIA MIG profiles, from the MIG User Guide's "Supported MIG Profiles" tables
# (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html: fraction of memory,
# fraction of SMs, instances available) with each profile's SM count as ``nvidia-smi mig -lgip``
# lists it on an H100 / H200 SXM5 of 132 SMs. The H200's profiles are the H100's with names after
# its 141 GB. Other NVIDIA models are not simulated with MIG.
CHIP_SMS: dict[str, int] = {"H100": 132, "H200": 132}
MIG_PROFILES: dict[str, dict[str, MigProfile]] = {
    "H100": {
        "1g.10gb": MigProfile(16, 1, 7), "1g.20gb": MigProfile(16, 2, 4), "2g.20gb": MigProfile(32, 2, 3),
        "3g.40gb": MigProfile(60, 4, 2), "4g.40gb": MigProfile(64, 4, 1), "7g.80gb": MigProfile(132, 8, 1),
    },
    "H200": {
        "1g.18gb": MigProfile(16, 1, 7), "1g.35gb": MigProfile(16, 2, 4), "2g.35gb": MigProfile(32, 2, 3),
        "3g.71gb": MigProfile(60, 4, 2), "4g.71gb": MigProfile(64, 4, 1), "7g.141gb": MigProfile(132, 8, 1),
    },
}


@dataclass(frozen=True, slots=True)
class PartitionLayout:
    """How a chip is shown as devices.

    Attributes:
        partition: ``DeviceInfo.partition`` of each device ("MIG 3g.40gb", "CPX"; "" whole chip).
        memory_partition: ``DeviceInfo.memory_partition`` ("NPS1", "NPS4"; "" none).
        per_chip: Devices per chip.
        compute_share: Each device's share of the chip's compute, 0-1.
        memory_share: Each device's share of the chip's memory, 0-1.
    """

    partition: str
    memory_partition: str
    per_chip: int
    compute_share: float
    memory_share: float


class PartitionError(ValueError):
    """An invalid partition; ``setting`` is ``partition`` or ``memory_partition``, ``why`` what is wrong."""

    def __init__(self, setting: str, value: str, why: str) -> None:
        super().__init__(f"{setting} {value!r} {why}")
        self.setting, self.why = setting, why


def partition_choices(spec: GpuSpec) -> tuple[str, ...]:
    """The partition names ``partition_layout`` accepts for ``spec`` ("" is the whole chip)."""
    if spec.model in AMD_PARTITIONED_MODELS:
        return ("", *AMD_COMPUTE_PARTITIONS)
    return ("", *MIG_PROFILES.get(spec.model, {}))


def _choices(names: tuple[str, ...], empty: str) -> str:
    return ", ".join(repr(n) if n else f'"" ({empty})' for n in names)


def check_partition(spec: GpuSpec, partition: str) -> None:
    """Refuse a compute partition or MIG profile ``spec`` does not have, naming the ones it has.

    Raises:
        ValueError: The message names the model and its valid choices.
    """
    choices = partition_choices(spec)
    if partition in choices:
        return
    if len(choices) == 1:
        raise ValueError(f"is not simulated for {spec.model}, whose chips are simulated whole only; use \"\" "
                         f"(partitions: AMD {', '.join(AMD_PARTITIONED_MODELS)}; MIG: {', '.join(MIG_PROFILES)})")
    kind = "compute partition" if spec.vendor == "amd" else "MIG profile"
    raise ValueError(f"is not a {kind} of {spec.model}; choose one of {_choices(choices, 'whole chips')}")


def check_memory_partition(spec: GpuSpec, partition: str, memory_partition: str) -> None:
    """Refuse a memory partition that ``spec`` or the compute ``partition`` does not allow.

    Raises:
        ValueError: The message names the valid choices.
    """
    if not memory_partition:
        return
    if spec.model not in AMD_PARTITIONED_MODELS:
        raise ValueError(f"is an AMD memory partition; {spec.model} has none, use \"\" "
                         f"(memory partitions: {', '.join(AMD_PARTITIONED_MODELS)})")
    with_compute = AMD_MEMORY_PARTITIONS.get(memory_partition)
    if with_compute is None:
        choices = _choices(("", *AMD_MEMORY_PARTITIONS), "none")
        raise ValueError(f"is not a memory partition of {spec.model}; choose one of {choices}")
    compute = partition or "SPX"
    if compute not in with_compute:
        raise ValueError(f"needs compute partition {' or '.join(with_compute)}, not {compute}; use NPS1 with "
                         f"{compute}, or set the compute partition to {with_compute[0]}")


def partition_layout(spec: GpuSpec, partition: str = "", memory_partition: str = "") -> PartitionLayout:
    """The devices one chip of ``spec`` shows as with this compute and memory partition.

    AMD (MI300X, MI325X): SPX (or "") one device, DPX 2, QPX 4, CPX 8, each with an equal share;
    ``memory_partition`` defaults to NPS1 once a compute partition is named. NVIDIA: a MIG profile
    of ``MIG_PROFILES`` fills the chip with its maximum number of instances, each with
    ``sms / CHIP_SMS`` of the compute and ``memory_eighths / 8`` of the memory.

    Raises:
        PartitionError: An invalid choice or combination (``check_partition``, ``check_memory_partition``).
    """
    for setting, value, check in (("partition", partition, lambda: check_partition(spec, partition)),
                                  ("memory_partition", memory_partition,
                                   lambda: check_memory_partition(spec, partition, memory_partition))):
        try:
            check()
        except ValueError as exc:
            raise PartitionError(setting, value, str(exc)) from None
    if spec.vendor == "amd":
        if not partition or partition == "SPX":
            return PartitionLayout("", memory_partition, 1, 1.0, 1.0)
        n = AMD_COMPUTE_PARTITIONS[partition]
        return PartitionLayout(partition, memory_partition or "NPS1", n, 1.0 / n, 1.0 / n)
    if not partition:
        return PartitionLayout("", "", 1, 1.0, 1.0)
    p = MIG_PROFILES[spec.model][partition]
    return PartitionLayout(f"MIG {partition}", "", p.instances, p.sms / CHIP_SMS[spec.model], p.memory_eighths / 8)
