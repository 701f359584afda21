"""Flink-style heartbeats between a driver-side ResourceManager and executor agents.

Knows nothing of Spark (the Spark wiring lives in ``spark_plugin``) and takes its settings as a
validated ``HeartbeatServices``. One module per role:

* the one clock: ``clock`` (``Clock``, ``SystemClock``/``SYSTEM_CLOCK``, ``ManualClock``); timers:
  ``scheduler``;
* the heartbeat protocol, as in Flink: ``target``, ``listener``, ``monitor`` (one target's
  liveness), ``manager`` (receiver side), ``sender`` (requests every interval), ``services``
  (validated settings and the factory for both managers);
* what travels and what is told: ``payload``, ``events``; the exception tree: ``errors``;
* the ResourceManager: ``resource_manager`` (its core, no transport) and ``rm_server`` (gRPC);
* the agent: ``agent_core`` (its core, no transport), ``agent_session`` (one registered stream),
  ``agent`` (``AsyncAgent``: registration with ``retry`` and re-registration),
  ``agent_thread`` (``AgentThread``: an ``AsyncAgent`` on the shared loop for sync callers),
  ``agent_main`` (a stand-alone agent process);
* ``admin``: the RM's ``ListExecutors`` for operators; ``_io_loop`` (the process's one grpc.aio
  loop), ``_wire`` (wire constants and conversions), ``_auth`` (proofs of the secret, never the
  secret itself, on the wire), ``_transport`` (where channels and the server port are made: the
  one place for TLS), ``_text`` (wire text checked or escaped before it is logged or recorded).

The gRPC side (``AsyncAgent``, ``AgentThread``, ``ResourceManagerServer``, ``io_loop``) is imported
on first use, so ``import heartbeat.clock`` (the shuffle engine's clock) loads no grpc.
"""

from typing import TYPE_CHECKING

from ._text import one_line
from .agent_core import AgentCore, Registration
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
from .payload import (
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

if TYPE_CHECKING:  # the real imports are lazy (``__getattr__``): no grpc for clock-only users
    from ._io_loop import io_loop
    from .agent import AsyncAgent
    from .agent_thread import AgentThread
    from .rm_server import ResourceManagerServer

_GRPC_SIDE = {
    "io_loop": "_io_loop",
    "AsyncAgent": "agent",
    "AgentThread": "agent_thread",
    "ResourceManagerServer": "rm_server",
}


def __getattr__(name: str) -> object:
    """The gRPC-bound classes, imported on first use (PEP 562)."""
    module = _GRPC_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module 'heartbeat' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{module}"), name)
