from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MarkerKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MARKER_KIND_UNSPECIFIED: _ClassVar[MarkerKind]
    MARKER_KIND_STEP_BEGIN: _ClassVar[MarkerKind]
    MARKER_KIND_STEP_END: _ClassVar[MarkerKind]
    MARKER_KIND_PHASE_BEGIN: _ClassVar[MarkerKind]
    MARKER_KIND_PHASE_END: _ClassVar[MarkerKind]
    MARKER_KIND_COLLECTIVE_BEGIN: _ClassVar[MarkerKind]
    MARKER_KIND_COLLECTIVE_END: _ClassVar[MarkerKind]

class ClockSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLOCK_SOURCE_UNSPECIFIED: _ClassVar[ClockSource]
    CLOCK_SOURCE_CPU: _ClassVar[ClockSource]
    CLOCK_SOURCE_DEVICE: _ClassVar[ClockSource]

class CollectiveSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COLLECTIVE_SOURCE_UNSPECIFIED: _ClassVar[CollectiveSource]
    COLLECTIVE_SOURCE_NONE: _ClassVar[CollectiveSource]
    COLLECTIVE_SOURCE_MARKERS: _ClassVar[CollectiveSource]
    COLLECTIVE_SOURCE_INSPECTOR: _ClassVar[CollectiveSource]
MARKER_KIND_UNSPECIFIED: MarkerKind
MARKER_KIND_STEP_BEGIN: MarkerKind
MARKER_KIND_STEP_END: MarkerKind
MARKER_KIND_PHASE_BEGIN: MarkerKind
MARKER_KIND_PHASE_END: MarkerKind
MARKER_KIND_COLLECTIVE_BEGIN: MarkerKind
MARKER_KIND_COLLECTIVE_END: MarkerKind
CLOCK_SOURCE_UNSPECIFIED: ClockSource
CLOCK_SOURCE_CPU: ClockSource
CLOCK_SOURCE_DEVICE: ClockSource
COLLECTIVE_SOURCE_UNSPECIFIED: CollectiveSource
COLLECTIVE_SOURCE_NONE: CollectiveSource
COLLECTIVE_SOURCE_MARKERS: CollectiveSource
COLLECTIVE_SOURCE_INSPECTOR: CollectiveSource

class Marker(_message.Message):
    __slots__ = ("ts_ns", "kind", "step", "name", "flops", "tokens", "bytes", "clock")
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    ts_ns: int
    kind: MarkerKind
    step: int
    name: str
    flops: float
    tokens: int
    bytes: int
    clock: ClockSource
    def __init__(self, ts_ns: _Optional[int] = ..., kind: _Optional[_Union[MarkerKind, str]] = ..., step: _Optional[int] = ..., name: _Optional[str] = ..., flops: _Optional[float] = ..., tokens: _Optional[int] = ..., bytes: _Optional[int] = ..., clock: _Optional[_Union[ClockSource, str]] = ...) -> None: ...

class MarkerColumns(_message.Message):
    __slots__ = ("ts_ns", "kind", "step", "name", "names", "flops", "tokens", "bytes", "clock")
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    ts_ns: _containers.RepeatedScalarFieldContainer[int]
    kind: _containers.RepeatedScalarFieldContainer[MarkerKind]
    step: _containers.RepeatedScalarFieldContainer[int]
    name: _containers.RepeatedScalarFieldContainer[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    flops: _containers.RepeatedScalarFieldContainer[float]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    bytes: _containers.RepeatedScalarFieldContainer[int]
    clock: _containers.RepeatedScalarFieldContainer[ClockSource]
    def __init__(self, ts_ns: _Optional[_Iterable[int]] = ..., kind: _Optional[_Iterable[_Union[MarkerKind, str]]] = ..., step: _Optional[_Iterable[int]] = ..., name: _Optional[_Iterable[int]] = ..., names: _Optional[_Iterable[str]] = ..., flops: _Optional[_Iterable[float]] = ..., tokens: _Optional[_Iterable[int]] = ..., bytes: _Optional[_Iterable[int]] = ..., clock: _Optional[_Iterable[_Union[ClockSource, str]]] = ...) -> None: ...

class MarkerBatch(_message.Message):
    __slots__ = ("job", "rank", "gpu", "seq", "markers", "client_dropped_total", "pid", "device_uuid", "inspector_enabled", "columns")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_UUID_FIELD_NUMBER: _ClassVar[int]
    INSPECTOR_ENABLED_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    gpu: int
    seq: int
    markers: _containers.RepeatedCompositeFieldContainer[Marker]
    client_dropped_total: int
    pid: int
    device_uuid: str
    inspector_enabled: bool
    columns: MarkerColumns
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., gpu: _Optional[int] = ..., seq: _Optional[int] = ..., markers: _Optional[_Iterable[_Union[Marker, _Mapping]]] = ..., client_dropped_total: _Optional[int] = ..., pid: _Optional[int] = ..., device_uuid: _Optional[str] = ..., inspector_enabled: _Optional[bool] = ..., columns: _Optional[_Union[MarkerColumns, _Mapping]] = ...) -> None: ...

class PushMarkersResponse(_message.Message):
    __slots__ = ("accepted", "rejected", "errors")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    rejected: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, accepted: _Optional[int] = ..., rejected: _Optional[int] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class GetInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeviceInfo(_message.Message):
    __slots__ = ("node", "gpu", "vendor", "model", "uuid", "max_gfx_clock_mhz", "peak_flops", "memory_bytes", "power_cap_w", "pci_bus_id", "partition", "memory_partition", "chip_uuid", "compute_share")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MAX_GFX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    PEAK_FLOPS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_CAP_W_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PARTITION_FIELD_NUMBER: _ClassVar[int]
    CHIP_UUID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SHARE_FIELD_NUMBER: _ClassVar[int]
    node: str
    gpu: int
    vendor: str
    model: str
    uuid: str
    max_gfx_clock_mhz: float
    peak_flops: float
    memory_bytes: int
    power_cap_w: float
    pci_bus_id: str
    partition: str
    memory_partition: str
    chip_uuid: str
    compute_share: float
    def __init__(self, node: _Optional[str] = ..., gpu: _Optional[int] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., uuid: _Optional[str] = ..., max_gfx_clock_mhz: _Optional[float] = ..., peak_flops: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., power_cap_w: _Optional[float] = ..., pci_bus_id: _Optional[str] = ..., partition: _Optional[str] = ..., memory_partition: _Optional[str] = ..., chip_uuid: _Optional[str] = ..., compute_share: _Optional[float] = ...) -> None: ...

class AgentInfo(_message.Message):
    __slots__ = ("node", "backend", "version", "sample_hz", "devices")
    NODE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_HZ_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    node: str
    backend: str
    version: str
    sample_hz: float
    devices: _containers.RepeatedCompositeFieldContainer[DeviceInfo]
    def __init__(self, node: _Optional[str] = ..., backend: _Optional[str] = ..., version: _Optional[str] = ..., sample_hz: _Optional[float] = ..., devices: _Optional[_Iterable[_Union[DeviceInfo, _Mapping]]] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("ts_ns", "node", "gpu", "gfx_clock_mhz", "mem_clock_mhz", "busy_ratio", "matrix_ratio", "mem_busy_ratio", "power_w", "energy_j", "temp_c", "mem_used_bytes", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes", "pcie_rx_bytes", "throttle_power_s", "throttle_thermal_s", "throttle_current_s", "throttle_other_s", "job", "links", "errors", "mem_temp_c", "vr_temp_c")
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    GFX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEM_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    MATRIX_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEM_BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    TEMP_C_FIELD_NUMBER: _ClassVar[int]
    MEM_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINK_TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINK_RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PCIE_TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    PCIE_RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_POWER_S_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_THERMAL_S_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_CURRENT_S_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_OTHER_S_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LINKS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    MEM_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    VR_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    ts_ns: int
    node: str
    gpu: int
    gfx_clock_mhz: float
    mem_clock_mhz: float
    busy_ratio: float
    matrix_ratio: float
    mem_busy_ratio: float
    power_w: float
    energy_j: float
    temp_c: float
    mem_used_bytes: float
    link_tx_bytes: float
    link_rx_bytes: float
    pcie_tx_bytes: float
    pcie_rx_bytes: float
    throttle_power_s: float
    throttle_thermal_s: float
    throttle_current_s: float
    throttle_other_s: float
    job: str
    links: _containers.RepeatedCompositeFieldContainer[LinkBytes]
    errors: _containers.RepeatedCompositeFieldContainer[ErrorCount]
    mem_temp_c: float
    vr_temp_c: float
    def __init__(self, ts_ns: _Optional[int] = ..., node: _Optional[str] = ..., gpu: _Optional[int] = ..., gfx_clock_mhz: _Optional[float] = ..., mem_clock_mhz: _Optional[float] = ..., busy_ratio: _Optional[float] = ..., matrix_ratio: _Optional[float] = ..., mem_busy_ratio: _Optional[float] = ..., power_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., temp_c: _Optional[float] = ..., mem_used_bytes: _Optional[float] = ..., link_tx_bytes: _Optional[float] = ..., link_rx_bytes: _Optional[float] = ..., pcie_tx_bytes: _Optional[float] = ..., pcie_rx_bytes: _Optional[float] = ..., throttle_power_s: _Optional[float] = ..., throttle_thermal_s: _Optional[float] = ..., throttle_current_s: _Optional[float] = ..., throttle_other_s: _Optional[float] = ..., job: _Optional[str] = ..., links: _Optional[_Iterable[_Union[LinkBytes, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[ErrorCount, _Mapping]]] = ..., mem_temp_c: _Optional[float] = ..., vr_temp_c: _Optional[float] = ...) -> None: ...

class ErrorCount(_message.Message):
    __slots__ = ("kind", "window", "detail", "value", "chip_wide")
    KIND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    CHIP_WIDE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    window: str
    detail: str
    value: float
    chip_wide: bool
    def __init__(self, kind: _Optional[str] = ..., window: _Optional[str] = ..., detail: _Optional[str] = ..., value: _Optional[float] = ..., chip_wide: _Optional[bool] = ...) -> None: ...

class LinkBytes(_message.Message):
    __slots__ = ("link", "tx_bytes", "rx_bytes")
    LINK_FIELD_NUMBER: _ClassVar[int]
    TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    link: int
    tx_bytes: float
    rx_bytes: float
    def __init__(self, link: _Optional[int] = ..., tx_bytes: _Optional[float] = ..., rx_bytes: _Optional[float] = ...) -> None: ...

class CollectiveRecord(_message.Message):
    __slots__ = ("job", "node", "rank", "gpu", "collective", "begin_ns", "end_ns", "placed", "exec_s", "timing_source", "bytes", "algo_bandwidth_gbs", "bus_bandwidth_gbs", "comm_id", "comm_rank", "comm_ranks", "comm_nodes", "seq", "pid", "format_version")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    PLACED_FIELD_NUMBER: _ClassVar[int]
    EXEC_S_FIELD_NUMBER: _ClassVar[int]
    TIMING_SOURCE_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    ALGO_BANDWIDTH_GBS_FIELD_NUMBER: _ClassVar[int]
    BUS_BANDWIDTH_GBS_FIELD_NUMBER: _ClassVar[int]
    COMM_ID_FIELD_NUMBER: _ClassVar[int]
    COMM_RANK_FIELD_NUMBER: _ClassVar[int]
    COMM_RANKS_FIELD_NUMBER: _ClassVar[int]
    COMM_NODES_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    job: str
    node: str
    rank: int
    gpu: int
    collective: str
    begin_ns: int
    end_ns: int
    placed: bool
    exec_s: float
    timing_source: str
    bytes: int
    algo_bandwidth_gbs: float
    bus_bandwidth_gbs: float
    comm_id: str
    comm_rank: int
    comm_ranks: int
    comm_nodes: int
    seq: int
    pid: int
    format_version: str
    def __init__(self, job: _Optional[str] = ..., node: _Optional[str] = ..., rank: _Optional[int] = ..., gpu: _Optional[int] = ..., collective: _Optional[str] = ..., begin_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., placed: _Optional[bool] = ..., exec_s: _Optional[float] = ..., timing_source: _Optional[str] = ..., bytes: _Optional[int] = ..., algo_bandwidth_gbs: _Optional[float] = ..., bus_bandwidth_gbs: _Optional[float] = ..., comm_id: _Optional[str] = ..., comm_rank: _Optional[int] = ..., comm_ranks: _Optional[int] = ..., comm_nodes: _Optional[int] = ..., seq: _Optional[int] = ..., pid: _Optional[int] = ..., format_version: _Optional[str] = ...) -> None: ...

class RankPosition(_message.Message):
    __slots__ = ("job", "node", "rank", "gpu", "step", "step_begin_ns", "phase", "phase_begin_ns", "collective", "collective_begin_ns", "last_marker_ns", "as_of_ns", "last_step")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    PHASE_BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_MARKER_NS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_FIELD_NUMBER: _ClassVar[int]
    job: str
    node: str
    rank: int
    gpu: int
    step: int
    step_begin_ns: int
    phase: str
    phase_begin_ns: int
    collective: str
    collective_begin_ns: int
    last_marker_ns: int
    as_of_ns: int
    last_step: int
    def __init__(self, job: _Optional[str] = ..., node: _Optional[str] = ..., rank: _Optional[int] = ..., gpu: _Optional[int] = ..., step: _Optional[int] = ..., step_begin_ns: _Optional[int] = ..., phase: _Optional[str] = ..., phase_begin_ns: _Optional[int] = ..., collective: _Optional[str] = ..., collective_begin_ns: _Optional[int] = ..., last_marker_ns: _Optional[int] = ..., as_of_ns: _Optional[int] = ..., last_step: _Optional[int] = ...) -> None: ...

class MarkerRecord(_message.Message):
    __slots__ = ("job", "node", "rank", "gpu", "marker")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MARKER_FIELD_NUMBER: _ClassVar[int]
    job: str
    node: str
    rank: int
    gpu: int
    marker: Marker
    def __init__(self, job: _Optional[str] = ..., node: _Optional[str] = ..., rank: _Optional[int] = ..., gpu: _Optional[int] = ..., marker: _Optional[_Union[Marker, _Mapping]] = ...) -> None: ...

class StepSummary(_message.Message):
    __slots__ = ("job", "node", "rank", "gpu", "step", "begin_ns", "end_ns", "step_time_s", "flops", "tokens", "phases", "collectives", "mean_gfx_clock_mhz", "min_gfx_clock_mhz", "mean_power_w", "energy_j", "max_temp_c", "busy_ratio", "clock", "ideal_s", "matrix_util_loss_s", "compute_at_clock_s", "dvfs_loss_s", "dvfs_power_s", "dvfs_thermal_s", "dvfs_current_s", "dvfs_other_s", "dvfs_unattributed_s", "exposed_comm_s", "idle_s", "mfu", "matrix_ratio", "tokens_per_s", "tokens_per_j", "flags", "collective_s", "phase_times", "collective_bytes", "link_tx_bytes", "link_rx_bytes", "inspector_collective_s", "inspector_bytes", "inspector_collectives", "collective_source", "gpu_errors")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    FLOPS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    MEAN_GFX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MIN_GFX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MEAN_POWER_W_FIELD_NUMBER: _ClassVar[int]
    ENERGY_J_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    BUSY_RATIO_FIELD_NUMBER: _ClassVar[int]
    CLOCK_FIELD_NUMBER: _ClassVar[int]
    IDEAL_S_FIELD_NUMBER: _ClassVar[int]
    MATRIX_UTIL_LOSS_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_AT_CLOCK_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_LOSS_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_POWER_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_THERMAL_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_CURRENT_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_OTHER_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_UNATTRIBUTED_S_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_COMM_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    MFU_FIELD_NUMBER: _ClassVar[int]
    MATRIX_RATIO_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_J_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_S_FIELD_NUMBER: _ClassVar[int]
    PHASE_TIMES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINK_TX_BYTES_FIELD_NUMBER: _ClassVar[int]
    LINK_RX_BYTES_FIELD_NUMBER: _ClassVar[int]
    INSPECTOR_COLLECTIVE_S_FIELD_NUMBER: _ClassVar[int]
    INSPECTOR_BYTES_FIELD_NUMBER: _ClassVar[int]
    INSPECTOR_COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    GPU_ERRORS_FIELD_NUMBER: _ClassVar[int]
    job: str
    node: str
    rank: int
    gpu: int
    step: int
    begin_ns: int
    end_ns: int
    step_time_s: float
    flops: float
    tokens: int
    phases: int
    collectives: int
    mean_gfx_clock_mhz: float
    min_gfx_clock_mhz: float
    mean_power_w: float
    energy_j: float
    max_temp_c: float
    busy_ratio: float
    clock: ClockSource
    ideal_s: float
    matrix_util_loss_s: float
    compute_at_clock_s: float
    dvfs_loss_s: float
    dvfs_power_s: float
    dvfs_thermal_s: float
    dvfs_current_s: float
    dvfs_other_s: float
    dvfs_unattributed_s: float
    exposed_comm_s: float
    idle_s: float
    mfu: float
    matrix_ratio: float
    tokens_per_s: float
    tokens_per_j: float
    flags: _containers.RepeatedScalarFieldContainer[str]
    collective_s: float
    phase_times: _containers.RepeatedCompositeFieldContainer[PhaseTime]
    collective_bytes: float
    link_tx_bytes: float
    link_rx_bytes: float
    inspector_collective_s: float
    inspector_bytes: float
    inspector_collectives: int
    collective_source: CollectiveSource
    gpu_errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job: _Optional[str] = ..., node: _Optional[str] = ..., rank: _Optional[int] = ..., gpu: _Optional[int] = ..., step: _Optional[int] = ..., begin_ns: _Optional[int] = ..., end_ns: _Optional[int] = ..., step_time_s: _Optional[float] = ..., flops: _Optional[float] = ..., tokens: _Optional[int] = ..., phases: _Optional[int] = ..., collectives: _Optional[int] = ..., mean_gfx_clock_mhz: _Optional[float] = ..., min_gfx_clock_mhz: _Optional[float] = ..., mean_power_w: _Optional[float] = ..., energy_j: _Optional[float] = ..., max_temp_c: _Optional[float] = ..., busy_ratio: _Optional[float] = ..., clock: _Optional[_Union[ClockSource, str]] = ..., ideal_s: _Optional[float] = ..., matrix_util_loss_s: _Optional[float] = ..., compute_at_clock_s: _Optional[float] = ..., dvfs_loss_s: _Optional[float] = ..., dvfs_power_s: _Optional[float] = ..., dvfs_thermal_s: _Optional[float] = ..., dvfs_current_s: _Optional[float] = ..., dvfs_other_s: _Optional[float] = ..., dvfs_unattributed_s: _Optional[float] = ..., exposed_comm_s: _Optional[float] = ..., idle_s: _Optional[float] = ..., mfu: _Optional[float] = ..., matrix_ratio: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., tokens_per_j: _Optional[float] = ..., flags: _Optional[_Iterable[str]] = ..., collective_s: _Optional[float] = ..., phase_times: _Optional[_Iterable[_Union[PhaseTime, _Mapping]]] = ..., collective_bytes: _Optional[float] = ..., link_tx_bytes: _Optional[float] = ..., link_rx_bytes: _Optional[float] = ..., inspector_collective_s: _Optional[float] = ..., inspector_bytes: _Optional[float] = ..., inspector_collectives: _Optional[int] = ..., collective_source: _Optional[_Union[CollectiveSource, str]] = ..., gpu_errors: _Optional[_Iterable[str]] = ...) -> None: ...

class PhaseTime(_message.Message):
    __slots__ = ("name", "seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    seconds: float
    def __init__(self, name: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("samples", "markers", "step_summaries", "since_ns")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    STEP_SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    SINCE_NS_FIELD_NUMBER: _ClassVar[int]
    samples: bool
    markers: bool
    step_summaries: bool
    since_ns: int
    def __init__(self, samples: _Optional[bool] = ..., markers: _Optional[bool] = ..., step_summaries: _Optional[bool] = ..., since_ns: _Optional[int] = ...) -> None: ...

class TelemetryBatch(_message.Message):
    __slots__ = ("samples", "markers", "step_summaries", "missed_total", "collectives", "positions")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MARKERS_FIELD_NUMBER: _ClassVar[int]
    STEP_SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    MISSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    COLLECTIVES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    markers: _containers.RepeatedCompositeFieldContainer[MarkerRecord]
    step_summaries: _containers.RepeatedCompositeFieldContainer[StepSummary]
    missed_total: int
    collectives: _containers.RepeatedCompositeFieldContainer[CollectiveRecord]
    positions: _containers.RepeatedCompositeFieldContainer[RankPosition]
    def __init__(self, samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., markers: _Optional[_Iterable[_Union[MarkerRecord, _Mapping]]] = ..., step_summaries: _Optional[_Iterable[_Union[StepSummary, _Mapping]]] = ..., missed_total: _Optional[int] = ..., collectives: _Optional[_Iterable[_Union[CollectiveRecord, _Mapping]]] = ..., positions: _Optional[_Iterable[_Union[RankPosition, _Mapping]]] = ...) -> None: ...

class ControlHello(_message.Message):
    __slots__ = ("job", "rank", "pid")
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    job: str
    rank: int
    pid: int
    def __init__(self, job: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ...) -> None: ...

class CaptureCommand(_message.Message):
    __slots__ = ("capture_id", "steps", "trace_dir")
    CAPTURE_ID_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    TRACE_DIR_FIELD_NUMBER: _ClassVar[int]
    capture_id: str
    steps: int
    trace_dir: str
    def __init__(self, capture_id: _Optional[str] = ..., steps: _Optional[int] = ..., trace_dir: _Optional[str] = ...) -> None: ...

class ControlCommand(_message.Message):
    __slots__ = ("capture",)
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    capture: CaptureCommand
    def __init__(self, capture: _Optional[_Union[CaptureCommand, _Mapping]] = ...) -> None: ...

class CaptureRequest(_message.Message):
    __slots__ = ("job", "steps", "ranks", "out_dir", "sample_hz", "timeout_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    OUT_DIR_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_HZ_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    steps: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    out_dir: str
    sample_hz: float
    timeout_s: float
    def __init__(self, job: _Optional[str] = ..., steps: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., out_dir: _Optional[str] = ..., sample_hz: _Optional[float] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class CaptureResult(_message.Message):
    __slots__ = ("capture_id", "job", "rank", "pid", "trace_path", "steps", "error", "begin_ns", "end_ns")
    CAPTURE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TRACE_PATH_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BEGIN_NS_FIELD_NUMBER: _ClassVar[int]
    END_NS_FIELD_NUMBER: _ClassVar[int]
    capture_id: str
    job: str
    rank: int
    pid: int
    trace_path: str
    steps: int
    error: str
    begin_ns: int
    end_ns: int
    def __init__(self, capture_id: _Optional[str] = ..., job: _Optional[str] = ..., rank: _Optional[int] = ..., pid: _Optional[int] = ..., trace_path: _Optional[str] = ..., steps: _Optional[int] = ..., error: _Optional[str] = ..., begin_ns: _Optional[int] = ..., end_ns: _Optional[int] = ...) -> None: ...

class CaptureAck(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CaptureReply(_message.Message):
    __slots__ = ("capture_id", "results", "sample_hz", "started_ns", "ended_ns", "missing_ranks")
    CAPTURE_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_HZ_FIELD_NUMBER: _ClassVar[int]
    STARTED_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_NS_FIELD_NUMBER: _ClassVar[int]
    MISSING_RANKS_FIELD_NUMBER: _ClassVar[int]
    capture_id: str
    results: _containers.RepeatedCompositeFieldContainer[CaptureResult]
    sample_hz: float
    started_ns: int
    ended_ns: int
    missing_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, capture_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[CaptureResult, _Mapping]]] = ..., sample_hz: _Optional[float] = ..., started_ns: _Optional[int] = ..., ended_ns: _Optional[int] = ..., missing_ranks: _Optional[_Iterable[int]] = ...) -> None: ...
