"""Flink-style heartbeats between a driver-side ResourceManager and executor agents.

Knows nothing of Spark: the Spark wiring lives in ``spark_plugin``. Roles, one module each:
``target``, ``listener``, ``monitor``, ``manager``, ``sender``, ``services``; the RM core in
``resource_manager`` and its gRPC server in ``rm_server``; the agent in ``agent``.
"""

from ._io_loop import io_loop
from .agent import AsyncAgent, Registration
from .agent_thread import AgentThread
from .clock import Clock, ManualClock, SystemClock
from .errors import (
    ClosedError,
    HeartbeatAuthenticationError,
    HeartbeatConfigError,
    HeartbeatError,
    HeartbeatProtocolError,
    HeartbeatRpcError,
    MalformedMessageError,
    RegistrationError,
    RegistrationReplacedError,
    RegistrationTimeoutError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from .events import EventKind, ExecutorEvent, HeartbeatRecord
from .listener import HeartbeatListener
from .manager import HeartbeatManager
from .monitor import HeartbeatMonitor, MonitorState
from .payload import (
    Payload,
    PayloadProvider,
    pulse_file_provider,
    rss_provider,
    slots_provider,
    static_provider,
)
from .resource_manager import ExecutorInfo
from .retry import RetryPolicy
from .rm_server import ResourceManagerServer
from .scheduler import Cancellable, LoopScheduler, ManualScheduler, Scheduler, ThreadScheduler
from .sender import HeartbeatManagerSender
from .services import CONFIG_KEYS, HeartbeatServices
from .target import HeartbeatTarget

__all__ = [
    "CONFIG_KEYS",
    "AgentThread",
    "AsyncAgent",
    "Cancellable",
    "Clock",
    "ClosedError",
    "EventKind",
    "ExecutorEvent",
    "ExecutorInfo",
    "HeartbeatAuthenticationError",
    "HeartbeatConfigError",
    "HeartbeatError",
    "HeartbeatListener",
    "HeartbeatManager",
    "HeartbeatManagerSender",
    "HeartbeatMonitor",
    "HeartbeatProtocolError",
    "HeartbeatRecord",
    "HeartbeatRpcError",
    "HeartbeatServices",
    "HeartbeatTarget",
    "LoopScheduler",
    "MalformedMessageError",
    "ManualClock",
    "ManualScheduler",
    "MonitorState",
    "Payload",
    "PayloadProvider",
    "Registration",
    "RegistrationError",
    "RegistrationReplacedError",
    "RegistrationTimeoutError",
    "ResourceManagerServer",
    "RetryPolicy",
    "Scheduler",
    "StaleEpochError",
    "StaleInstanceError",
    "SystemClock",
    "ThreadScheduler",
    "UnknownExecutorError",
    "io_loop",
    "pulse_file_provider",
    "rss_provider",
    "slots_provider",
    "static_provider",
]
