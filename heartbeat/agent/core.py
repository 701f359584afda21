"""The agent's transport-free core: the counterpart of the RM's ``ResourceManagerCore``.

``AgentCore`` holds what an executor's agent knows and decides, with no gRPC and no event loop:
who it is (executor id, host, pid), its registration (the RM's epoch and our instance id; the
last one accepted is kept so that a reconnect can resume it), what it reports (the payload
providers, and which of them already failed so each is logged once), whether its host is
healthy, and, during one registered session, the heartbeat receiver that watches the RM. The
transport feeds it what arrives and carries out what it decides through an ``RmLink``:
``agent_session`` serves one registered stream, ``agent`` runs the retrying registration loop.

What the core decides, per message from the RM:

* a heartbeat request of our registration is answered with the payload (through the receiver
  ``HeartbeatManager``, which also resets the RM's monitor) unless the host is unhealthy: a
  frozen host must look dead to the RM, so it neither answers nor registers again (the RM,
  which still asks, still counts as alive: its last word, ``kill_host``, may follow);
* a request with another epoch ends the session: the RM restarted, register again;
* a request for another instance id (an older registration of ours) is ignored;
* no request for the RM's announced timeout, or ``rpc_failure_threshold`` failed answers, end
  the session;
* the status the RM ended a stream with is mapped onto the exception tree (``rm_error``); only
  ``RegistrationReplacedError`` is final (``final_error``): registering again would replace the
  newer agent in turn, and two live agents given one executor id would replace each other forever.

Time comes from the injected ``Clock``, timers from a ``Scheduler``: the unit tests drive the
whole state machine on a ``ManualScheduler`` with a fake link. One session at a time: the
transport ends a session (``end_session``) before it serves the next.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.errors import (
    AgentFailedError,
    HeartbeatAuthenticationError,
    HeartbeatConfigError,
    HeartbeatError,
    HeartbeatRpcError,
    MalformedMessageError,
    ProtocolVersionError,
    RegistrationError,
    RegistrationReplacedError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from heartbeat.manager import HeartbeatManager
from heartbeat.payload import Payload, PayloadProvider, collect_payload
from heartbeat.scheduler import Scheduler
from heartbeat.services import HeartbeatServices
from heartbeat.wire.auth import VERSION_MISMATCH
from heartbeat.wire.text import excerpt, one_line

log = logging.getLogger(__name__)

RM_TARGET_ID = "resource-manager"


class Registration(NamedTuple):
    """One registration the RM accepted: its epoch (fencing token) and our instance id."""

    epoch: str
    instance_id: str


@dataclass(frozen=True)
class RegisterRequest:
    """What the agent sends to register; ``resume_*`` name the registration a reconnect resumes."""

    executor_id: str
    host: str
    pid: int
    resume_epoch: str
    resume_instance_id: str


class RmLink(Protocol):
    """The agent's one-way handle on its registered stream (a stream in production, a fake in tests)."""

    def send_heartbeat(self, epoch: str, instance_id: str, seq: int, payload: Payload) -> None:
        """Enqueue an answer without blocking; raise ``HeartbeatRpcError`` if it cannot be sent."""
        ...

    def end(self, reason: str) -> None:
        """End the session, saying why; idempotent."""
        ...


def error_for_status(status: str | None, details: str | None) -> HeartbeatError:
    """Map the gRPC status (by name, so the core needs no grpc) that ended a stream onto the tree.

    ``details`` came from the peer: it is escaped to one bounded line before it goes anywhere.
    """
    text = one_line(details or status or "stream ended")
    if status == "UNAUTHENTICATED":
        return HeartbeatAuthenticationError(f"the RM refused our proof of the application's secret: {text}")
    if status == "NOT_FOUND":
        return UnknownExecutorError(text)
    if status == "ALREADY_EXISTS":
        return RegistrationReplacedError(
            f"{text}: another live agent registered with the same executor id and the newer one wins; "
            "this agent stops instead of replacing it back (give every agent its own executor id)"
        )
    if status == "FAILED_PRECONDITION":
        if text.startswith(VERSION_MISMATCH):
            return ProtocolVersionError(text)
        return StaleEpochError(text) if "epoch" in text else StaleInstanceError(text)
    if status in ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"):
        return MalformedMessageError(text)
    return HeartbeatRpcError(text)


class _RmTarget:
    """``HeartbeatTarget`` for the RM during one session: answers go down the session's link."""

    def __init__(self, link: RmLink, registration: Registration) -> None:
        self.link = link
        self.registration = registration
        self.seq = 0  # of the request being answered: the RM matches the answer to it for RTT

    def receive_heartbeat(self, heartbeat_origin: str, payload: Payload) -> None:
        epoch, instance_id = self.registration
        self.link.send_heartbeat(epoch, instance_id, self.seq, payload)

    def request_heartbeat(self, request_origin: str, payload: Payload) -> None:
        """The agent never requests; the RM is the sender."""


class _Session:
    """One registered session: the RM as a target and the receiver that monitors it."""

    def __init__(self, target: _RmTarget, manager: HeartbeatManager[None, Payload]) -> None:
        self.target = target
        self.manager = manager


class AgentCore:
    """An agent's identity, registration, payload and health; the RM monitor's listener itself."""

    def __init__(
        self,
        executor_id: str,
        *,
        services: HeartbeatServices | None = None,
        clock: Clock = SYSTEM_CLOCK,
        host: str = "127.0.0.1",
        pid: int | None = None,
        payload_providers: Sequence[PayloadProvider] = (),
        is_healthy: Callable[[], bool] = lambda: True,
        on_registered: Callable[[Registration], None] | None = None,
        on_kill_host: Callable[[str], None] | None = None,
    ) -> None:
        self.executor_id = executor_id
        self._on_kill_host = on_kill_host
        self.host = host
        self.pid = os.getpid() if pid is None else pid
        self.services = services or HeartbeatServices()
        self.clock = clock
        self._providers = list(payload_providers)
        self._failed_providers: set[int] = set()
        self._is_healthy = is_healthy
        self._on_registered = on_registered
        self._accepted: Registration | None = None  # the last the RM accepted: a reconnect resumes it
        self._rm_services = self.services
        self._session: _Session | None = None
        self.registration: Registration | None = None  # the live one, while a session is served
        self.registrations = 0
        self.rm_error: HeartbeatError | None = None  # how the RM ended the last session, if it did
        self.error: HeartbeatError | None = None  # sticky: what ended the agent for good

    # ---- health and payload ---------------------------------------------------------------

    def healthy(self) -> bool:
        """The host's health; a raising check counts as unhealthy (a broken host must not answer)."""
        try:
            return bool(self._is_healthy())
        except Exception:
            log.warning("is_healthy() raised; treating the executor as unhealthy", exc_info=True)
            return False

    def payload(self) -> Payload:
        """Every provider's figures; a failing provider is skipped, and logged the first time only."""
        return collect_payload(self._providers, self._failed_providers)

    @property
    def failed_providers(self) -> frozenset[int]:
        """Indexes of the providers that failed at least once (already logged)."""
        return frozenset(self._failed_providers)

    # ---- registration ---------------------------------------------------------------------

    def register_request(self) -> RegisterRequest:
        previous = self._accepted
        return RegisterRequest(
            self.executor_id,
            self.host,
            self.pid,
            previous.epoch if previous else "",
            previous.instance_id if previous else "",
        )

    def registered(self, epoch: str, instance_id: str, interval_ms: int, timeout_ms: int) -> Registration:
        """The RM accepted us: remember it (to resume it), and watch the RM with its own settings.

        The interval and timeout the RM announces are the RM's, not ours; an unusable
        announcement (e.g. zero from an older RM) leaves ours in force.
        """
        registration = Registration(epoch, instance_id)
        self._accepted = registration
        try:
            self._rm_services = HeartbeatServices(
                interval_ms / 1000.0, timeout_ms / 1000.0, self.services.rpc_failure_threshold
            )
        except HeartbeatConfigError:
            self._rm_services = self.services
        return registration

    @property
    def rm_services(self) -> HeartbeatServices:
        """The settings the RM is watched with: its announcement, or ours before or without one."""
        return self._rm_services

    def give_up(self, error: HeartbeatError) -> None:
        """Keep the error that ended the agent (sticky, in ``error``) and say why in one line."""
        self.error = error
        if isinstance(error, AgentFailedError):  # with the traceback of what failed
            log.error("agent %s failed: %s", self.executor_id, error, exc_info=error.__cause__)
        elif isinstance(error, RegistrationReplacedError):
            log.error("agent %s stops: %s", self.executor_id, error)
        elif isinstance(error, RegistrationError):
            log.error("agent %s gives up: %s", self.executor_id, error)
        else:
            log.error("agent %s was refused by the RM: %s", self.executor_id, error)

    # ---- one registered session -----------------------------------------------------------

    def start_session(self, link: RmLink, scheduler: Scheduler) -> None:
        """The last accepted registration is served on ``link`` from now on: it is live."""
        registration = self._accepted
        if registration is None:
            raise RuntimeError("no registration to serve: the RM has accepted none yet")
        if self._session is not None:
            raise RuntimeError("a session is already being served; end it first")
        self.rm_error = None
        target = _RmTarget(link, registration)
        manager: HeartbeatManager[None, Payload] = self._rm_services.create_heartbeat_manager(
            self.executor_id, self, scheduler, self.clock
        )
        self._session = _Session(target, manager)
        self.registration = registration
        self.registrations += 1
        if self._on_registered is not None:
            self._on_registered(registration)
        manager.monitor_target(RM_TARGET_ID, target)

    def on_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        """The RM asked for a heartbeat: answer, end the session, or ignore it (see the module doc)."""
        session = self._session
        if session is None:
            return
        current = session.target.registration
        if epoch != current.epoch:
            session.target.link.end(f"the RM restarted (epoch {excerpt(epoch)} replaces {current.epoch})")
            return
        if instance_id != current.instance_id:
            return
        if not self.healthy():  # silent to the RM, which is alive: its own last word may follow
            session.manager.receive_heartbeat(RM_TARGET_ID, None)
            return
        session.target.seq = seq
        session.manager.request_heartbeat(RM_TARGET_ID, None)

    def on_kill_host(self, epoch: str, instance_id: str, reason: str) -> bool:
        """The RM timed out the registration being served and says its host may be ended if it is
        frozen: handed to ``on_kill_host`` (which checks the host itself before it acts) only for
        this session's own registration, and only while the host is unhealthy (a healthy host
        answers, so the RM's verdict is stale). Whether it was handed on."""
        session = self._session
        if session is None or self._on_kill_host is None:
            return False
        if (epoch, instance_id) != tuple(session.target.registration) or self.healthy():
            log.warning("agent %s ignored the RM's word that its host may be ended", self.executor_id)
            return False
        try:
            self._on_kill_host(one_line(reason))
        except Exception:
            log.exception("ending the frozen host of agent %s failed", self.executor_id)
        return True

    def rm_closed_stream(self, status: str | None, details: str | None, *, failed: bool = False) -> None:
        """The stream ended with ``status``: keep it typed in ``rm_error`` and end the session.

        ``failed``: the call ended with a non-OK status raised by a read, which also counts as a
        failed RPC toward UNREACHABLE.
        """
        session = self._session
        if session is None:
            return
        error = error_for_status(status, details)
        self.rm_error = error
        if failed:
            session.manager.report_rpc_failure(RM_TARGET_ID)
            session.target.link.end(f"the stream to the RM ended: {error!r}")
        else:
            session.target.link.end(f"the RM ended the stream: {error!r}")

    def stream_broke(self, exc: BaseException) -> None:
        """Reading or writing the stream failed: a failed RPC, and the session is over."""
        session = self._session
        if session is None:
            return
        session.manager.report_rpc_failure(RM_TARGET_ID)
        session.target.link.end(f"the stream to the RM broke: {one_line(repr(exc))}")

    def end_session(self) -> None:
        """The session is over, whatever ended it: stop watching the RM; nothing is live. Idempotent."""
        session, self._session = self._session, None
        if session is not None:
            session.manager.stop()
        self.registration = None

    @property
    def final_error(self) -> RegistrationReplacedError | None:
        """The RM's verdict on the last session if it is final (stop, do not register again)."""
        return self.rm_error if isinstance(self.rm_error, RegistrationReplacedError) else None

    # ---- HeartbeatListener for the RM target ------------------------------------------------

    def notify_heartbeat_timeout(self, target_id: str) -> None:
        self._end(f"no heartbeat request from the RM for {self._rm_services.timeout_s:g} s")

    def notify_target_unreachable(self, target_id: str) -> None:
        self._end("answers to the RM kept failing")

    def report_payload(self, target_id: str, payload: None) -> None:
        """Requests carry no payload."""

    def retrieve_payload(self, target_id: str) -> Payload:
        return self.payload()

    def _end(self, reason: str) -> None:
        if self._session is not None:
            self._session.target.link.end(reason)
