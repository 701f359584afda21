"""Flink-style heartbeats between a driver-side ResourceManager and executor agents.

Knows nothing of Spark (the Spark wiring lives in ``spark_plugin``) and takes its settings as a
validated ``HeartbeatServices``. One module per role:

* the one clock: ``clock`` (``Clock``, ``SystemClock``/``SYSTEM_CLOCK``, ``ManualClock``); timers:
  ``scheduler``; ``lazy_exports`` (every package's names imported on first use);
* the heartbeat protocol, as in Flink: ``target``, ``listener``, ``monitor`` (one target's
  liveness), ``manager`` (receiver side), ``sender`` (requests every interval), ``services``
  (validated settings and the factory for both managers); ``phi_accrual`` and ``phi_monitor``
  (the phi detector's early, per-target suspicion, when ``HeartbeatServices.phi`` is set);
* what travels and what is told: ``payload``, ``notices`` (the agent's findings, carried until
  surely delivered), ``events``; the exception tree: ``errors``;
* the ResourceManager: ``rm.resource_manager`` (its core, no transport) and ``rm.server`` (gRPC);
* the agent: ``agent.core`` (its core, no transport), ``agent.session`` (one registered stream),
  ``agent`` (``AsyncAgent``: registration with ``retry`` and re-registration),
  ``agent_thread`` (``AgentThread``: an ``AsyncAgent`` on the shared loop for sync callers),
  ``agent_main`` (a stand-alone agent process);
* ``admin``: the RM's ``ListExecutors`` for operators; ``_io_loop`` (the process's one grpc.aio
  loop), ``wire.codec`` (wire constants and conversions), ``wire.auth`` (proofs of the secret, never the
  secret itself, on the wire), ``_transport`` (where channels and the server port are made: the
  one place for TLS), ``_text`` (wire text checked or escaped before it is logged or recorded).

Every public name is imported on first use (``__getattr__``), so ``import arrowbeat_base.clock`` (the
shuffle engine's clock, in every Python worker) loads neither grpc nor asyncio nor the agent.
"""

from typing import TYPE_CHECKING

from arrowbeat_base.lazy_exports import lazy_exports

if TYPE_CHECKING:  # imported on first use (``__getattr__``): a worker loads only what it needs
    from arrowbeat_base.clock import SYSTEM_CLOCK, Clock, ManualClock, SystemClock
    from heartbeat.agent.async_agent import AsyncAgent
    from heartbeat.agent.core import AgentCore, Registration
    from heartbeat.agent.thread import AgentThread
    from heartbeat.errors import (
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
    from heartbeat.events import EventKind, ExecutorEvent, HeartbeatRecord
    from heartbeat.executor_info import ExecutorInfo
    from heartbeat.listener import HeartbeatListener
    from heartbeat.manager import HeartbeatManager
    from heartbeat.monitor import HeartbeatMonitor, MonitorState
    from heartbeat.notices import NoticeBoard
    from heartbeat.payload import (
        Notice,
        Payload,
        PayloadProvider,
        WorkProgress,
        pulse_file_provider,
        rss_provider,
        slots_provider,
        static_provider,
    )
    from heartbeat.retry import RetryPolicy
    from heartbeat.rm.resource_manager import ResourceManagerCore
    from heartbeat.rm.server import ResourceManagerServer
    from heartbeat.scheduler import Cancellable, LoopScheduler, ManualScheduler, Scheduler, ThreadScheduler
    from heartbeat.sender import HeartbeatManagerSender
    from heartbeat.services import HeartbeatServices
    from heartbeat.target import HeartbeatTarget
    from heartbeat.wire.io_loop import io_loop
    from heartbeat.wire.text import one_line

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
    "one_line": "heartbeat.wire.text",
    "AgentCore": "heartbeat.agent.core",
    "Registration": "heartbeat.agent.core",
    "SYSTEM_CLOCK": "arrowbeat_base.clock",
    "Clock": "arrowbeat_base.clock",
    "ManualClock": "arrowbeat_base.clock",
    "SystemClock": "arrowbeat_base.clock",
    "AgentFailedError": "heartbeat.errors",
    "ClosedError": "heartbeat.errors",
    "HeartbeatAuthenticationError": "heartbeat.errors",
    "HeartbeatConfigError": "heartbeat.errors",
    "HeartbeatError": "heartbeat.errors",
    "HeartbeatProtocolError": "heartbeat.errors",
    "HeartbeatRpcError": "heartbeat.errors",
    "MalformedMessageError": "heartbeat.errors",
    "ProtocolVersionError": "heartbeat.errors",
    "RegistrationError": "heartbeat.errors",
    "RegistrationReplacedError": "heartbeat.errors",
    "RegistrationTimeoutError": "heartbeat.errors",
    "StaleEpochError": "heartbeat.errors",
    "StaleInstanceError": "heartbeat.errors",
    "UnknownExecutorError": "heartbeat.errors",
    "EventKind": "heartbeat.events",
    "ExecutorEvent": "heartbeat.events",
    "HeartbeatRecord": "heartbeat.events",
    "HeartbeatListener": "heartbeat.listener",
    "HeartbeatManager": "heartbeat.manager",
    "HeartbeatMonitor": "heartbeat.monitor",
    "MonitorState": "heartbeat.monitor",
    "NoticeBoard": "heartbeat.notices",
    "Notice": "heartbeat.payload",
    "Payload": "heartbeat.payload",
    "PayloadProvider": "heartbeat.payload",
    "WorkProgress": "heartbeat.payload",
    "pulse_file_provider": "heartbeat.payload",
    "rss_provider": "heartbeat.payload",
    "slots_provider": "heartbeat.payload",
    "static_provider": "heartbeat.payload",
    "ExecutorInfo": "heartbeat.executor_info",
    "ResourceManagerCore": "heartbeat.rm.resource_manager",
    "RetryPolicy": "heartbeat.retry",
    "Cancellable": "heartbeat.scheduler",
    "LoopScheduler": "heartbeat.scheduler",
    "ManualScheduler": "heartbeat.scheduler",
    "Scheduler": "heartbeat.scheduler",
    "ThreadScheduler": "heartbeat.scheduler",
    "HeartbeatManagerSender": "heartbeat.sender",
    "HeartbeatServices": "heartbeat.services",
    "HeartbeatTarget": "heartbeat.target",
    "io_loop": "heartbeat.wire.io_loop",
    "AsyncAgent": "heartbeat.agent.async_agent",
    "AgentThread": "heartbeat.agent.thread",
    "ResourceManagerServer": "heartbeat.rm.server",
}
"""Each public name and the module defining it: imported when the name is first used."""


if not TYPE_CHECKING:  # for type checkers the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
