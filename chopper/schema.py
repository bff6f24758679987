"""The DESIGN data model: device rows, sample rows and marker rows, with their units.

Every part of Chopper (backends, the agent, recorded runs, the attribution model) speaks these
three tables. Column names and order here are the contract; ``docs/DATA_MODEL.md`` documents
them. A sample's per-link counters (``Sample.links``) are not columns of the samples table: a
recorded run keeps them in its optional ``links`` table (``LINK_COLUMNS``), one row per link.
This module stays import-light (no numpy, pandas or torch) because ``import chopper`` pulls it in.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

NAN = math.nan

# Most markers in one MarkerBatch. The agent validates a batch under one lock; 4096 markers hold it
# for ~20 ms, so a broken client's huge batches cannot delay the other ranks' markers for long. The
# client sends at most this many (512 by default).
MAX_MARKERS_PER_BATCH = 4096
# Invocation metadata in which a local client states its process id: every process on the agent's
# unix socket is the same gRPC peer, and this gives each its own stream budget (chopper/daemon/access.py).
PID_METADATA = "chopper-pid"
# Trailing metadata of a call refused before the server read any of its messages: a client that
# wrote batches on such a stream counts them dropped, not sent.
UNREAD_METADATA = "chopper-unread"


# The marker socket beside the agent's unix socket (agent.marker_socket): its path is the socket's plus this.
MARKER_SOCKET_SUFFIX = ".markers"
# And the control socket (agent.control_socket).
CONTROL_SOCKET_SUFFIX = ".control"


def marker_socket_path(socket_path: str) -> str:
    """Where the agent serving the unix socket ``socket_path`` takes marker batches as datagrams."""
    return socket_path + MARKER_SOCKET_SUFFIX


def control_socket_path(socket_path: str) -> str:
    """Where the agent serving the unix socket ``socket_path`` holds trainers' ``Control`` streams as connections."""
    return socket_path + CONTROL_SOCKET_SUFFIX


def marker_count(batch: Any) -> int:
    """Markers a ``MarkerBatch`` holds, as messages and as columns (docs/DATA_MODEL.md)."""
    return len(batch.markers) + len(batch.columns.ts_ns)


class MarkerKind(enum.IntEnum):
    """Marker kinds; the integer values are the wire values of ``chopper.v1.MarkerKind``."""

    STEP_BEGIN = 1
    STEP_END = 2
    PHASE_BEGIN = 3
    PHASE_END = 4
    COLLECTIVE_BEGIN = 5
    COLLECTIVE_END = 6

    @property
    def label(self) -> str:
        """The lower-case name used in tables and metric labels, e.g. ``step_begin``."""
        return self.name.lower()


class ClockSource(enum.IntEnum):
    """Where a marker timestamp came from; values match ``chopper.v1.ClockSource``."""

    CPU = 1
    DEVICE = 2


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One GPU of a node.

    Attributes:
        node: Node name (hostname unless configured).
        gpu: Local device index on the node.
        vendor: ``amd``, ``nvidia``, ``simulated`` or the vendor of a replayed run.
        model: Marketing name, e.g. ``AMD Instinct MI300X``.
        uuid: Stable device identifier.
        max_gfx_clock_mhz: Maximum graphics/SM clock, MHz.
        peak_flops: Dense BF16 FLOP/s at the maximum clock.
        memory_bytes: Device memory, bytes.
        power_cap_w: Current power cap, watts.
        pci_bus_id: PCI bus id ("00000000:1B:00.0"), the parent chip's for a partition; "" unread.
        partition: NVIDIA MIG instance ("MIG 3g.40gb") or AMD compute partition ("CPX"); "" whole chip.
        memory_partition: AMD memory partition mode of the chip ("NPS1", "NPS4"); "" none.
        chip_uuid: UUID of the physical chip (the device's own for a whole chip); "" unread.
        compute_share: Fraction of the chip's compute this device holds, 0-1 (1 whole chip);
            ``peak_flops`` and ``memory_bytes`` are already scaled to it.
    """

    node: str
    gpu: int
    vendor: str
    model: str
    uuid: str
    max_gfx_clock_mhz: float
    peak_flops: float
    memory_bytes: int
    power_cap_w: float
    pci_bus_id: str = ""
    partition: str = ""
    memory_partition: str = ""
    chip_uuid: str = ""
    compute_share: float = 1.0


# Highest NVLink / XGMI link index plus one that a sample may carry: NVML numbers up to
# NVML_NVLINK_MAX_LINKS (36 in NVML 13) links, amdsmi's gpu_metrics up to 8 (16 in later tables).
# It bounds the per-link series on /metrics and the ``link`` column of a recorded run.
MAX_LINKS = 64


# Health and error counter kinds (Sample.errors) -> whether the value is a counter (only grows
# while the driver runs) or a state/gauge; docs/HEALTH.md gives each kind's vendor source.
ERROR_KINDS: dict[str, str] = {
    "xid": "counter",                 # NVML XID events, detail = the XID code
    "ecc_corrected": "counter",       # window volatile|aggregate; detail = RAS block or "total"
    "ecc_uncorrected": "counter",
    "ecc_deferred": "counter",        # AMD RAS deferred errors
    "retired_pages": "gauge",         # NVML page retirement, detail single_bit|double_bit
    "retirement_pending": "state",
    "remapped_rows": "gauge",         # NVML row remapping (Ampere+), detail correctable|uncorrectable
    "remap_pending": "state",
    "remap_failed": "state",
    "bad_pages": "gauge",             # AMD retired (bad) HBM pages
    "pcie_replay": "counter",
    "pcie_nak_sent": "counter",
    "pcie_nak_received": "counter",
    "link_crc": "counter",            # NVLink CRC errors, detail flit|data, summed over links
    "link_replay": "counter",
    "link_recovery": "counter",
    "xgmi_error": "state",            # AMD XGMI error status: 0 none, 1 error, 2 multiple
}
ECC_WINDOWS: tuple[str, ...] = ("volatile", "aggregate")


class ErrorCount(NamedTuple):
    """One health or error counter of a GPU at a sample's ``ts_ns`` (``pb.ErrorCount``).

    Attributes:
        kind: One of ``ERROR_KINDS``.
        window: ECC: ``volatile`` or ``aggregate``; "" for other kinds.
        detail: The kind's split (RAS block, XID code, cause, row class, CRC type); "" none.
        value: Count, or a state's value (0 none, 1 set; xgmi_error 2 multiple).
        chip_wide: The counter is the whole chip's, reported with its first partition only.
    """

    kind: str
    window: str
    detail: str
    value: float
    chip_wide: bool = False


class LinkBytes(NamedTuple):
    """One NVLink / XGMI link of a GPU at a sample's ``ts_ns``.

    A named tuple, not a dataclass: backends make one per link per GPU per tick (18 per H100),
    and a tuple is built in half the time of a frozen dataclass.

    Attributes:
        link: The link's index as the vendor library numbers it (NVML's link id, the position
            in amdsmi's per-link lists), 0 to ``MAX_LINKS - 1``.
        tx_bytes: Cumulative bytes this GPU sent over the link; NaN when unread.
        rx_bytes: Cumulative bytes this GPU received over the link; NaN when unread.
    """

    link: int
    tx_bytes: float
    rx_bytes: float


@dataclass(slots=True)
class Sample:
    """One GPU over the interval since its previous sample.

    Ratios and clocks are averages over that interval; fields ending in ``_j``, ``_bytes`` (link
    and PCIe) and ``throttle_*_s`` are cumulative counters read at ``ts_ns``. A value the
    backend cannot read is NaN.

    Attributes:
        ts_ns: End of the interval, CLOCK_REALTIME nanoseconds.
        node: Node name.
        gpu: Local device index.
        gfx_clock_mhz: Mean graphics clock, MHz.
        mem_clock_mhz: Mean memory clock, MHz.
        busy_ratio: Graphics/compute engine activity, 0–1.
        matrix_ratio: Matrix-core/tensor activity, 0–1.
        mem_busy_ratio: Memory controller activity, 0–1.
        power_w: Mean board/socket power, watts.
        energy_j: Cumulative energy, joules.
        temp_c: Hotspot temperature, Celsius.
        mem_used_bytes: Device memory in use, bytes.
        link_tx_bytes: Cumulative XGMI/NVLink bytes sent.
        link_rx_bytes: Cumulative XGMI/NVLink bytes received.
        pcie_tx_bytes: Cumulative PCIe bytes sent.
        pcie_rx_bytes: Cumulative PCIe bytes received.
        throttle_power_s: Cumulative seconds throttled by the power limit.
        throttle_thermal_s: Cumulative seconds throttled by temperature.
        throttle_current_s: Cumulative seconds throttled by current (EDC/PROCHOT-style) limits.
        throttle_other_s: Cumulative seconds throttled for any other reason.
        mem_temp_c: Hottest HBM/memory temperature, Celsius.
        vr_temp_c: Hottest voltage-regulator temperature, Celsius.
        links: Each link's cumulative bytes, ordered by link index; ``link_tx_bytes`` and
            ``link_rx_bytes`` are their sums where the backend reads both. Empty when the
            backend reads no per-link counter.
        errors: Health and error counters (``ErrorCount``); empty when the backend reads none.
    """

    ts_ns: int
    node: str
    gpu: int
    gfx_clock_mhz: float = NAN
    mem_clock_mhz: float = NAN
    busy_ratio: float = NAN
    matrix_ratio: float = NAN
    mem_busy_ratio: float = NAN
    power_w: float = NAN
    energy_j: float = NAN
    temp_c: float = NAN
    mem_used_bytes: float = NAN
    link_tx_bytes: float = NAN
    link_rx_bytes: float = NAN
    pcie_tx_bytes: float = NAN
    pcie_rx_bytes: float = NAN
    throttle_power_s: float = NAN
    throttle_thermal_s: float = NAN
    throttle_current_s: float = NAN
    throttle_other_s: float = NAN
    mem_temp_c: float = NAN
    vr_temp_c: float = NAN
    links: tuple[LinkBytes, ...] = ()
    errors: tuple[ErrorCount, ...] = ()


DEVICE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(DeviceInfo))
# The samples table's columns: every field of Sample but the per-link and error tuples.
SAMPLE_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Sample) if f.name not in ("links", "errors"))
# The links table of a recorded run: one row per (sample, link), keyed by the sample's ts_ns, node, gpu.
LINK_COLUMNS: tuple[str, ...] = ("ts_ns", "node", "gpu", "link", "tx_bytes", "rx_bytes")
# The errors table of a recorded run: one row per (sample, counter), keyed like the links table.
ERROR_COLUMNS: tuple[str, ...] = ("ts_ns", "node", "gpu", "kind", "window", "detail", "value", "chip_wide")
MARKER_COLUMNS: tuple[str, ...] = (
    "ts_ns", "job", "node", "rank", "gpu", "kind", "step", "name", "flops", "tokens", "bytes",
)
# Throttle causes in the order every report and metric uses.
THROTTLE_CAUSES: tuple[str, ...] = ("power", "thermal", "current", "other")
