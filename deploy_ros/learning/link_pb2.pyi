from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FromRobot(_message.Message):
    __slots__ = ("hello", "rows", "rollback", "good")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    GOOD_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    rows: Rows
    rollback: Rollback
    good: Good
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., rows: _Optional[_Union[Rows, _Mapping]] = ..., rollback: _Optional[_Union[Rollback, _Mapping]] = ..., good: _Optional[_Union[Good, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("protocol", "capacity", "obs_dim", "action_dim", "joints")
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    OBS_DIM_FIELD_NUMBER: _ClassVar[int]
    ACTION_DIM_FIELD_NUMBER: _ClassVar[int]
    JOINTS_FIELD_NUMBER: _ClassVar[int]
    protocol: int
    capacity: int
    obs_dim: int
    action_dim: int
    joints: int
    def __init__(self, protocol: _Optional[int] = ..., capacity: _Optional[int] = ..., obs_dim: _Optional[int] = ..., action_dim: _Optional[int] = ..., joints: _Optional[int] = ...) -> None: ...

class Rows(_message.Message):
    __slots__ = ("first", "data", "dropped")
    FIRST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    first: int
    data: bytes
    dropped: int
    def __init__(self, first: _Optional[int] = ..., data: _Optional[bytes] = ..., dropped: _Optional[int] = ...) -> None: ...

class Rollback(_message.Message):
    __slots__ = ("version", "refused", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    refused: int
    reason: str
    def __init__(self, version: _Optional[int] = ..., refused: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Good(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class FromLearner(_message.Message):
    __slots__ = ("ready", "rewards", "chunk", "candidate", "failure")
    READY_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ready: Ready
    rewards: Rewards
    chunk: FileChunk
    candidate: Candidate
    failure: Failure
    def __init__(self, ready: _Optional[_Union[Ready, _Mapping]] = ..., rewards: _Optional[_Union[Rewards, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ..., candidate: _Optional[_Union[Candidate, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: str
    def __init__(self, run: _Optional[str] = ...) -> None: ...

class Rewards(_message.Message):
    __slots__ = ("start", "values")
    START_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    start: int
    values: bytes
    def __init__(self, start: _Optional[int] = ..., values: _Optional[bytes] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("name", "offset", "data", "last")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    data: bytes
    last: bool
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("version", "step")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    version: int
    step: int
    def __init__(self, version: _Optional[int] = ..., step: _Optional[int] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
