from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HelloRequest(_message.Message):
    __slots__ = ("protocol_version",)
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    def __init__(self, protocol_version: _Optional[int] = ...) -> None: ...

class HelloResponse(_message.Message):
    __slots__ = ("challenge", "protocol_version")
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    challenge: bytes
    protocol_version: int
    def __init__(self, challenge: _Optional[bytes] = ..., protocol_version: _Optional[int] = ...) -> None: ...

class ListExecutorsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExecutorStatus(_message.Message):
    __slots__ = ("executor_id", "host", "pid", "instance_id", "state", "registered_at", "last_heartbeat", "last_rtt_ms", "payload", "detail")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    LAST_RTT_MS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    host: str
    pid: int
    instance_id: str
    state: str
    registered_at: float
    last_heartbeat: float
    last_rtt_ms: float
    payload: Payload
    detail: str
    def __init__(self, executor_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., instance_id: _Optional[str] = ..., state: _Optional[str] = ..., registered_at: _Optional[float] = ..., last_heartbeat: _Optional[float] = ..., last_rtt_ms: _Optional[float] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., detail: _Optional[str] = ...) -> None: ...

class ListExecutorsResponse(_message.Message):
    __slots__ = ("epoch", "executors")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    executors: _containers.RepeatedCompositeFieldContainer[ExecutorStatus]
    def __init__(self, epoch: _Optional[str] = ..., executors: _Optional[_Iterable[_Union[ExecutorStatus, _Mapping]]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "unregister")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    UNREGISTER_FIELD_NUMBER: _ClassVar[int]
    register: RegisterRequest
    heartbeat: HeartbeatResponse
    unregister: UnregisterRequest
    def __init__(self, register: _Optional[_Union[RegisterRequest, _Mapping]] = ..., heartbeat: _Optional[_Union[HeartbeatResponse, _Mapping]] = ..., unregister: _Optional[_Union[UnregisterRequest, _Mapping]] = ...) -> None: ...

class RmMessage(_message.Message):
    __slots__ = ("registered", "heartbeat_request", "challenge", "kill_host")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    KILL_HOST_FIELD_NUMBER: _ClassVar[int]
    registered: RegisterResponse
    heartbeat_request: HeartbeatRequest
    challenge: Challenge
    kill_host: KillHost
    def __init__(self, registered: _Optional[_Union[RegisterResponse, _Mapping]] = ..., heartbeat_request: _Optional[_Union[HeartbeatRequest, _Mapping]] = ..., challenge: _Optional[_Union[Challenge, _Mapping]] = ..., kill_host: _Optional[_Union[KillHost, _Mapping]] = ...) -> None: ...

class KillHost(_message.Message):
    __slots__ = ("epoch", "instance_id", "reason")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    instance_id: str
    reason: str
    def __init__(self, epoch: _Optional[str] = ..., instance_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Challenge(_message.Message):
    __slots__ = ("rm_nonce", "protocol_version")
    RM_NONCE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    rm_nonce: bytes
    protocol_version: int
    def __init__(self, rm_nonce: _Optional[bytes] = ..., protocol_version: _Optional[int] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("executor_id", "host", "pid", "resume_epoch", "resume_instance_id", "protocol_version", "agent_nonce", "proof")
    EXECUTOR_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RESUME_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_NONCE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    executor_id: str
    host: str
    pid: int
    resume_epoch: str
    resume_instance_id: str
    protocol_version: int
    agent_nonce: bytes
    proof: bytes
    def __init__(self, executor_id: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., resume_epoch: _Optional[str] = ..., resume_instance_id: _Optional[str] = ..., protocol_version: _Optional[int] = ..., agent_nonce: _Optional[bytes] = ..., proof: _Optional[bytes] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("epoch", "instance_id", "interval_ms", "timeout_ms", "resumed", "proof")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    instance_id: str
    interval_ms: int
    timeout_ms: int
    resumed: bool
    proof: bytes
    def __init__(self, epoch: _Optional[str] = ..., instance_id: _Optional[str] = ..., interval_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., resumed: bool = ..., proof: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("epoch", "instance_id", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    instance_id: str
    seq: int
    def __init__(self, epoch: _Optional[str] = ..., instance_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class Payload(_message.Message):
    __slots__ = ("slots_total", "slots_busy", "running_tasks", "rss_bytes", "jvm_pulse_age_ms", "metrics", "work", "notices")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    SLOTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_BUSY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_TASKS_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    JVM_PULSE_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    WORK_FIELD_NUMBER: _ClassVar[int]
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    slots_total: int
    slots_busy: int
    running_tasks: int
    rss_bytes: int
    jvm_pulse_age_ms: int
    metrics: _containers.ScalarMap[str, float]
    work: _containers.RepeatedCompositeFieldContainer[WorkProgress]
    notices: _containers.RepeatedCompositeFieldContainer[Notice]
    def __init__(self, slots_total: _Optional[int] = ..., slots_busy: _Optional[int] = ..., running_tasks: _Optional[int] = ..., rss_bytes: _Optional[int] = ..., jvm_pulse_age_ms: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., work: _Optional[_Iterable[_Union[WorkProgress, _Mapping]]] = ..., notices: _Optional[_Iterable[_Union[Notice, _Mapping]]] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("id", "kind", "detail")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    detail: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class WorkProgress(_message.Message):
    __slots__ = ("id", "label", "running_s", "idle_s", "stuck", "where")
    ID_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    RUNNING_S_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    id: str
    label: str
    running_s: float
    idle_s: float
    stuck: bool
    where: str
    def __init__(self, id: _Optional[str] = ..., label: _Optional[str] = ..., running_s: _Optional[float] = ..., idle_s: _Optional[float] = ..., stuck: bool = ..., where: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("epoch", "instance_id", "seq", "payload")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    instance_id: str
    seq: int
    payload: Payload
    def __init__(self, epoch: _Optional[str] = ..., instance_id: _Optional[str] = ..., seq: _Optional[int] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ...) -> None: ...

class UnregisterRequest(_message.Message):
    __slots__ = ("epoch", "instance_id", "reason")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    epoch: str
    instance_id: str
    reason: str
    def __init__(self, epoch: _Optional[str] = ..., instance_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
