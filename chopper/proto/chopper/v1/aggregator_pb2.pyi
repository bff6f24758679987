from chopper.proto.chopper.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SummaryBatch(_message.Message):
    __slots__ = ("agent", "incarnation", "seq", "summaries", "lost_total", "positions")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SUMMARIES_FIELD_NUMBER: _ClassVar[int]
    LOST_TOTAL_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    agent: str
    incarnation: str
    seq: _containers.RepeatedScalarFieldContainer[int]
    summaries: _containers.RepeatedCompositeFieldContainer[_agent_pb2.StepSummary]
    lost_total: int
    positions: _containers.RepeatedCompositeFieldContainer[_agent_pb2.RankPosition]
    def __init__(self, agent: _Optional[str] = ..., incarnation: _Optional[str] = ..., seq: _Optional[_Iterable[int]] = ..., summaries: _Optional[_Iterable[_Union[_agent_pb2.StepSummary, _Mapping]]] = ..., lost_total: _Optional[int] = ..., positions: _Optional[_Iterable[_Union[_agent_pb2.RankPosition, _Mapping]]] = ...) -> None: ...

class DeliveryAck(_message.Message):
    __slots__ = ("incarnation", "acked_seq")
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    incarnation: str
    acked_seq: int
    def __init__(self, incarnation: _Optional[str] = ..., acked_seq: _Optional[int] = ...) -> None: ...

class QueryStepsRequest(_message.Message):
    __slots__ = ("job", "last")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    job: str
    last: int
    def __init__(self, job: _Optional[str] = ..., last: _Optional[int] = ...) -> None: ...

class JobStepRank(_message.Message):
    __slots__ = ("rank", "node", "gpu", "step_time_s", "ideal_s", "matrix_util_loss_s", "dvfs_loss_s", "exposed_comm_s", "straggler_wait_s", "idle_s", "mfu", "mean_gfx_clock_mhz", "max_temp_c", "flags")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    IDEAL_S_FIELD_NUMBER: _ClassVar[int]
    MATRIX_UTIL_LOSS_S_FIELD_NUMBER: _ClassVar[int]
    DVFS_LOSS_S_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_COMM_S_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    MFU_FIELD_NUMBER: _ClassVar[int]
    MEAN_GFX_CLOCK_MHZ_FIELD_NUMBER: _ClassVar[int]
    MAX_TEMP_C_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    gpu: int
    step_time_s: float
    ideal_s: float
    matrix_util_loss_s: float
    dvfs_loss_s: float
    exposed_comm_s: float
    straggler_wait_s: float
    idle_s: float
    mfu: float
    mean_gfx_clock_mhz: float
    max_temp_c: float
    flags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ..., gpu: _Optional[int] = ..., step_time_s: _Optional[float] = ..., ideal_s: _Optional[float] = ..., matrix_util_loss_s: _Optional[float] = ..., dvfs_loss_s: _Optional[float] = ..., exposed_comm_s: _Optional[float] = ..., straggler_wait_s: _Optional[float] = ..., idle_s: _Optional[float] = ..., mfu: _Optional[float] = ..., mean_gfx_clock_mhz: _Optional[float] = ..., max_temp_c: _Optional[float] = ..., flags: _Optional[_Iterable[str]] = ...) -> None: ...

class JobStep(_message.Message):
    __slots__ = ("job", "step", "step_time_s", "complete", "ranks_reported", "ranks_expected", "slowest_rank", "straggler_score", "slowest_cause", "ranks")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RANKS_REPORTED_FIELD_NUMBER: _ClassVar[int]
    RANKS_EXPECTED_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_RANK_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_SCORE_FIELD_NUMBER: _ClassVar[int]
    SLOWEST_CAUSE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    job: str
    step: int
    step_time_s: float
    complete: bool
    ranks_reported: int
    ranks_expected: int
    slowest_rank: int
    straggler_score: float
    slowest_cause: str
    ranks: _containers.RepeatedCompositeFieldContainer[JobStepRank]
    def __init__(self, job: _Optional[str] = ..., step: _Optional[int] = ..., step_time_s: _Optional[float] = ..., complete: _Optional[bool] = ..., ranks_reported: _Optional[int] = ..., ranks_expected: _Optional[int] = ..., slowest_rank: _Optional[int] = ..., straggler_score: _Optional[float] = ..., slowest_cause: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[JobStepRank, _Mapping]]] = ...) -> None: ...

class QueryStepsResponse(_message.Message):
    __slots__ = ("steps", "positions")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[JobStep]
    positions: _containers.RepeatedCompositeFieldContainer[_agent_pb2.RankPosition]
    def __init__(self, steps: _Optional[_Iterable[_Union[JobStep, _Mapping]]] = ..., positions: _Optional[_Iterable[_Union[_agent_pb2.RankPosition, _Mapping]]] = ...) -> None: ...
