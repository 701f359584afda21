"""Flink-style heartbeats between a driver-side ResourceManager and executor agents.

Knows nothing of Spark (the Spark wiring lives in ``spark_plugin``) and takes its settings as a
validated ``HeartbeatServices``. One module per role:

* the one clock: ``clock`` (``Clock``, ``SystemClock``/``SYSTEM_CLOCK``, ``ManualClock``); timers:
  ``scheduler``; ``lazy_exports`` (every package's names imported on first use);
* the heartbeat protocol, as in Flink: ``target``, ``listener``, ``monitor`` (one target's
  liveness), ``manager`` (receiver side), ``sender`` (requests every interval), ``services``
  (validated settings and the factory for both managers);
* what travels and what is told: ``payload``, ``notices`` (the agent's findings, carried until
  surely delivered), ``events``; the exception tree: ``errors``;
* the ResourceManager: ``resource_manager`` (its core, no transport) and ``rm_server`` (gRPC);
* the agent: ``agent_core`` (its core, no transport), ``agent_session`` (one registered stream),
  ``agent`` (``AsyncAgent``: registration with ``retry`` and re-registration),
  ``agent_thread`` (``AgentThread``: an ``AsyncAgent`` on the shared loop for sync callers),
  ``agent_main`` (a stand-alone agent process);
* ``admin``: the RM's ``ListExecutors`` for operators; ``_io_loop`` (the process's one grpc.aio
  loop), ``_wire`` (wire constants and conversions), ``_auth`` (proofs of the secret, never the
  secret itself, on the wire), ``_transport`` (where channels and the server port are made: the
  one place for TLS), ``_text`` (wire text checked or escaped before it is logged or recorded).

Every public name is imported on first use (``__getattr__``), so ``import heartbeat.clock`` (the
shuffle engine's clock, in every Python worker) loads neither grpc nor asyncio nor the agent.
"""

from typing import TYPE_CHECKING

from heartbeat.lazy_exports import lazy_exports

if TYPE_CHECKING:  # imported on first use (``__getattr__``): a worker loads only what it needs
    from ._io_loop import io_loop
    from ._text import one_line
    from .agent import AsyncAgent
    from .agent_core import AgentCore, Registration
    from .agent_thread import AgentThread
    from .clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
    from .errors import (
        AgentFailedError,
        ClosedError,
        HeartbeatAuthenticationError,
        HeartbeatConfigError,
        HeartbeatError,
        HeartbeatProtocolError,
        HeartbeatRpcError,
        MalformedMessageError,
        ProtocolVersionError,
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
    from .notices import NoticeBoard
    from .payload import (
        Notice,
        Payload,
        PayloadProvider,
        WorkProgress,
        pulse_file_provider,
        rss_provider,
        slots_provider,
        static_provider,
    )
    from .resource_manager import ExecutorInfo, ResourceManagerCore
    from .retry import RetryPolicy
    from .rm_server import ResourceManagerServer
    from .scheduler import Cancellable, LoopScheduler, ManualScheduler, Scheduler, ThreadScheduler
    from .sender import HeartbeatManagerSender
    from .services import HeartbeatServices
    from .target import HeartbeatTarget

__all__ = [
    "SYSTEM_CLOCK",
    "AgentCore",
    "AgentFailedError",
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
    "Notice",
    "NoticeBoard",
    "Payload",
    "PayloadProvider",
    "ProtocolVersionError",
    "Registration",
    "RegistrationError",
    "RegistrationReplacedError",
    "RegistrationTimeoutError",
    "ResourceManagerCore",
    "ResourceManagerServer",
    "RetryPolicy",
    "Scheduler",
    "StaleEpochError",
    "StaleInstanceError",
    "SystemClock",
    "ThreadScheduler",
    "UnknownExecutorError",
    "WorkProgress",
    "io_loop",
    "one_line",
    "pulse_file_provider",
    "rss_provider",
    "slots_provider",
    "static_provider",
]


_EXPORTS = {
    "one_line": "._text",
    "AgentCore": ".agent_core",
    "Registration": ".agent_core",
    "SYSTEM_CLOCK": ".clock",
    "Clock": ".clock",
    "ManualClock": ".clock",
    "SystemClock": ".clock",
    "AgentFailedError": ".errors",
    "ClosedError": ".errors",
    "HeartbeatAuthenticationError": ".errors",
    "HeartbeatConfigError": ".errors",
    "HeartbeatError": ".errors",
    "HeartbeatProtocolError": ".errors",
    "HeartbeatRpcError": ".errors",
    "MalformedMessageError": ".errors",
    "ProtocolVersionError": ".errors",
    "RegistrationError": ".errors",
    "RegistrationReplacedError": ".errors",
    "RegistrationTimeoutError": ".errors",
    "StaleEpochError": ".errors",
    "StaleInstanceError": ".errors",
    "UnknownExecutorError": ".errors",
    "EventKind": ".events",
    "ExecutorEvent": ".events",
    "HeartbeatRecord": ".events",
    "HeartbeatListener": ".listener",
    "HeartbeatManager": ".manager",
    "HeartbeatMonitor": ".monitor",
    "MonitorState": ".monitor",
    "NoticeBoard": ".notices",
    "Notice": ".payload",
    "Payload": ".payload",
    "PayloadProvider": ".payload",
    "WorkProgress": ".payload",
    "pulse_file_provider": ".payload",
    "rss_provider": ".payload",
    "slots_provider": ".payload",
    "static_provider": ".payload",
    "ExecutorInfo": ".resource_manager",
    "ResourceManagerCore": ".resource_manager",
    "RetryPolicy": ".retry",
    "Cancellable": ".scheduler",
    "LoopScheduler": ".scheduler",
    "ManualScheduler": ".scheduler",
    "Scheduler": ".scheduler",
    "ThreadScheduler": ".scheduler",
    "HeartbeatManagerSender": ".sender",
    "HeartbeatServices": ".services",
    "HeartbeatTarget": ".target",
    "io_loop": "._io_loop",
    "AsyncAgent": ".agent",
    "AgentThread": ".agent_thread",
    "ResourceManagerServer": ".rm_server",
}
"""Each public name and the module defining it: imported when the name is first used."""


if not TYPE_CHECKING:  # for type checkers the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
