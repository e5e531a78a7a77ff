from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("stage", "step", "policy_version", "rollouts_trained", "rollouts_dropped_stale", "last_mean_reward", "checkpoint_path", "last_logprob_gap", "weight_sync_alarms")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    LAST_MEAN_REWARD_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PATH_FIELD_NUMBER: _ClassVar[int]
    LAST_LOGPROB_GAP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_SYNC_ALARMS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    step: int
    policy_version: int
    rollouts_trained: int
    rollouts_dropped_stale: int
    last_mean_reward: float
    checkpoint_path: str
    last_logprob_gap: float
    weight_sync_alarms: int
    def __init__(self, stage: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., rollouts_trained: _Optional[int] = ..., rollouts_dropped_stale: _Optional[int] = ..., last_mean_reward: _Optional[float] = ..., checkpoint_path: _Optional[str] = ..., last_logprob_gap: _Optional[float] = ..., weight_sync_alarms: _Optional[int] = ...) -> None: ...
