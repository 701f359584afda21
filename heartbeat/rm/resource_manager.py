"""The ResourceManager's transport-free core: registrations, fencing and the heartbeat sender.

It owns the epoch (fencing token, fresh per RM start) and one registration per executor id with
its own instance id. Messages with another epoch or a replaced instance id raise a
``HeartbeatProtocolError`` and change nothing. The RM is the heartbeat sender: it asks each agent
for a heartbeat every interval through that agent's ``AgentLink``. Time comes from one injected
``Clock``: ``monotonic()`` for RTTs and every timeout, ``time()`` only for the wall-clock
timestamps it records (registration, last heartbeat, events); ``rm.server`` is its gRPC
transport, and the agent side has the same split (``agent.core`` / ``agent.session``).

Beside the agents' own word, the core keeps the cluster manager's view (Spark's, which the
driver plugin forwards): an executor the cluster manager started is *expected* (``expect``); if no
agent registers for it in time it is reported and listed UNMONITORED instead of being silently
missing, and a removal by the cluster manager is recorded as such (``cluster_removed``), so an
executor let go on purpose does not read as a crash.

Every executor the cluster manager runs is listed RUNNING, or UNMONITORED with the reason, never
TIMEOUT (or UNREACHABLE, UNREGISTERED) for good: the executor's side reports an agent that exited
(``agent_down``: UNMONITORED at once, with the exit and what its JVM does about it), and an
executor whose registration ended by any other way gets the same grace as a new one (``expect``'s
``within_s``: the driver gives the startup timeout plus the heartbeat timeout) to have an agent
registered again, else it is reported UNMONITORED ("no agent registered again within ...").

A timeout counts only if the RM asked the agent steadily over its silence (``rm.trust``, each
monitor's vetting): after the RM's own stall (its process paused or starved, so every agent looks
silent) the monitors judge nothing and watch again from then, so an agent that really stopped is
timed out one timeout later, on evidence of its own, and a healthy one does not lose its
registration to the RM's stall. With the phi detector (``HeartbeatServices.phi``) each
registration's monitor also suspects a silent agent early (``phi_monitor``); a suspicion passes
the same check and is recorded as ``HEARTBEAT_TIMEOUT`` with its phi and the agent's interval
statistics.

All methods are meant to run on one thread (the server's loop); a lock still guards the table
so ``executors()`` can be read from any thread.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from arrowbeat_base.clock import Clock
from arrowbeat_base.rate_log import RateLog
from heartbeat.errors import StaleEpochError, StaleInstanceError, UnknownExecutorError
from heartbeat.events import Event, EventKind, ExecutorEvent, HeartbeatRecord
from heartbeat.executor_info import ExecutorInfo
from heartbeat.monitor import HeartbeatMonitor
from heartbeat.payload import Payload
from heartbeat.rm.trust import trusted_timeout
from heartbeat.scheduler import Cancellable, Scheduler
from heartbeat.services import HeartbeatServices
from heartbeat.wire.text import MAX_REASON_CHARS, check_text, clean_reason, excerpt

log = logging.getLogger(__name__)

RM_ID = "resource-manager"
_MIN_OUTSTANDING, _MAX_OUTSTANDING = 64, 4096
"""Bounds on the unanswered request times kept per agent: enough for two timeouts of requests
(``_outstanding``), so a stall anywhere in a silence stays in view of the trust check."""
_STALL_LOG_S = 10.0
"""At most one WARNING per this many seconds tells of silences the RM's own stall vetoed."""


class EventSink(Protocol):
    """Where the core publishes events (an ``EventBus`` in production, a list in tests)."""

    def publish(self, event: Event) -> None: ...


class AgentLink(Protocol):
    """The RM's one-way handle on an agent's connection (a fake in unit tests, a stream in production)."""

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        """Enqueue a request without blocking; raise ``HeartbeatRpcError`` if it cannot be sent."""
        ...

    def close(self, status: str, detail: str) -> None:
        """End the connection with a gRPC status name and a message telling the agent what to do."""
        ...

    def ask_kill_host(self, epoch: str, instance_id: str, reason: str) -> None:
        """Make the next ``close`` first tell the agent that it may end its frozen host (its
        executor JVM): sent last on the stream, the agent checks locally before it acts."""
        ...


class _AgentTarget:
    """``HeartbeatTarget`` for one registration: numbers requests and remembers when they left."""

    def __init__(
        self, link: AgentLink, epoch: str, instance_id: str, clock: Clock, keep: int = _MIN_OUTSTANDING
    ) -> None:
        self.link = link
        self._epoch = epoch
        self._instance_id = instance_id
        self._clock = clock
        self._seq = 0
        self._keep = keep
        self.sent: dict[int, float] = {}
        """Unanswered requests by number: when each left (the newest ``keep``)."""
        self.dropped_at: float | None = None
        """When the newest request dropped from ``sent`` left: the RM was sending then. Only a
        silence longer than ``keep`` requests reaches it, and the trust check then judges from it
        (else a silence would look, at its start, like a stall of the RM's and be vetoed forever)."""

    def request_heartbeat(self, request_origin: str, payload: None) -> None:
        self._seq += 1
        self.sent[self._seq] = self._clock.monotonic()
        if len(self.sent) > self._keep:
            self.dropped_at = self.sent.pop(next(iter(self.sent)))
        self.link.send_heartbeat_request(self._epoch, self._instance_id, self._seq)

    def receive_heartbeat(self, heartbeat_origin: str, payload: None) -> None:
        """The RM only sends requests; agents never ask it for a heartbeat."""


@dataclass
class _Registration:
    executor_id: str
    host: str
    instance_id: str
    target: _AgentTarget
    monitor: HeartbeatMonitor[None]
    registered_at: float
    state: str = "RUNNING"
    last_heartbeat: float | None = None
    last_rtt_ms: float | None = None
    payload: Payload | None = None
    pid: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    replaced: tuple[str, ...] = ()
    """Instances this registration replaced while they ran (and those they had replaced), newest
    first, at most ``_REPLACED_KEPT``: an agent that resumes one of them is refused, not let in."""


_REPLACED_KEPT = 8


@dataclass
class _Expected:
    """An executor the cluster manager started whose agent has not registered (yet)."""

    host: str
    added_at: float  # wall clock
    timer: Cancellable | None = None
    unmonitored: bool = False
    detail: str = ""


@dataclass(frozen=True)
class Registered:
    epoch: str
    instance_id: str
    resumed: bool


class ResourceManagerCore:
    """Registration table + heartbeat sender + event emission; a ``HeartbeatListener`` itself."""

    def __init__(
        self,
        services: HeartbeatServices,
        clock: Clock,
        scheduler: Scheduler,
        bus: EventSink,
        *,
        epoch: str | None = None,
        known_executors: Iterable[str] = (),
        spread: int = 10,
        max_ended: int = 10_000,
        kill_frozen_hosts: bool = False,
    ) -> None:
        """``kill_frozen_hosts``: on a heartbeat timeout it trusts (``rm.trust``), the RM tells the
        agent it may end its host if that is frozen (``AgentLink.ask_kill_host``)."""
        self.services = services
        self._kill_frozen_hosts = kill_frozen_hosts
        self._stall_log = RateLog(log, _STALL_LOG_S, clock)
        two_timeouts = math.ceil(2 * services.timeout_s / services.interval_s) + 2  # requests
        self._outstanding = min(_MAX_OUTSTANDING, max(_MIN_OUTSTANDING, two_timeouts))
        self.epoch = epoch or uuid.uuid4().hex
        self._clock = clock
        self._bus = bus
        self._lock = threading.RLock()
        self._registrations: dict[str, _Registration] = {}
        self._seen: set[str] = set(known_executors)
        self._forgotten: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Seen executors whose ended entry left the table, oldest first, at most ``max_ended``."""
        self._ended: collections.deque[str] = collections.deque()
        self._ended_count: dict[str, int] = {}
        """How often each id is in ``_ended``: an O(1) "still there?" (not a scan of 10,000)."""
        self._max_ended = max_ended
        self._expected: dict[str, _Expected] = {}
        self._in_cluster: dict[str, float] = {}
        """Executors the cluster manager runs (added, not removed), with the grace their agent
        has to register (again) before the executor is reported UNMONITORED."""
        self._removed_on_purpose: dict[str, str] = {}
        self._cluster_gone: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Executors the cluster manager removed (ids are never reused), the last ``max_ended``:
        a late word that one's agent did not start must not list it UNMONITORED for good."""
        self._scheduler = scheduler
        self._stopped = False
        self._sender = services.create_heartbeat_manager_sender(RM_ID, self, scheduler, clock, spread)

    def start(self) -> None:
        self._sender.start()

    def stop(self) -> None:
        """Stop requesting and emitting; idempotent."""
        with self._lock:
            self._stopped = True
            timers = [e.timer for e in self._expected.values() if e.timer is not None]
        for timer in timers:
            timer.cancel()
        self._sender.stop()

    # ---- messages from agents -------------------------------------------------------------

    def register(
        self,
        executor_id: str,
        host: str,
        link: AgentLink,
        resume_epoch: str = "",
        resume_instance_id: str = "",
        pid: int = 0,
    ) -> Registered:
        """Register (or re-register) ``executor_id``; a previous registration becomes stale.

        Ids and host are recorded and logged: each must be 1-256 printable characters (the host
        may be empty), else ``MalformedMessageError`` and nothing is registered.
        """
        check_text("executor_id", executor_id)
        check_text("host", host, allow_empty=True)
        now_wall = self._clock.time()
        with self._lock:
            current = self._registrations.get(executor_id)
            if (
                current is not None
                and current.state == "RUNNING"
                and resume_epoch == self.epoch
                and resume_instance_id == current.instance_id
            ):
                old_link, current.target.link = current.target.link, link
                current.monitor.report_rpc_success()
                if old_link is not link:
                    old_link.close("FAILED_PRECONDITION", "this stream was replaced by a resumed one")
                return Registered(self.epoch, current.instance_id, resumed=True)
            if (
                current is not None
                and current.state == "RUNNING"
                and resume_epoch == self.epoch
                and resume_instance_id in current.replaced
            ):
                # A replaced agent that did not hear why (its stream ended with another status:
                # gRPC's client can report a write that races the RM's ALREADY_EXISTS as
                # INTERNAL) must not replace the newer one back.
                raise StaleInstanceError(self._replaced_detail(executor_id, resume_instance_id, current))
            instance_id = uuid.uuid4().hex
            target = _AgentTarget(link, self.epoch, instance_id, self._clock, self._outstanding)
            monitor = self._sender.monitor_target(executor_id, target)
            # a timeout, or a phi suspicion, counts only if the RM asked steadily over the silence
            monitor.set_vetting(self._trust_check(executor_id, target))
            replaced: tuple[str, ...] = ()
            if current is not None and current.state == "RUNNING":
                replaced = (current.instance_id, *current.replaced)[:_REPLACED_KEPT]
            elif current is not None and resume_instance_id == current.instance_id:
                # The same agent back after its registration ended (a timeout): what it had
                # replaced stays refused, or an older agent let in now would replace it in turn.
                replaced = current.replaced
            registration = _Registration(
                executor_id,
                host,
                instance_id,
                target,
                monitor,
                registered_at=now_wall,
                pid=pid,
                replaced=replaced,
            )
            self._registrations[executor_id] = registration
            seen = executor_id in self._seen
            if executor_id in self._forgotten:  # back in the table: remembered there again
                del self._forgotten[executor_id]
                seen = True
            kind = EventKind.REREGISTERED if seen else EventKind.REGISTERED
            self._seen.add(executor_id)
            expected = self._expected.pop(executor_id, None)
        if expected is not None and expected.timer is not None:
            expected.timer.cancel()
        if current is not None and current.state == "RUNNING":
            # Its own status: the replaced agent must stop, not register again and replace the
            # newer one in turn (two live agents given one executor id would flap forever).
            current.state = "REPLACED"
            current.target.link.close(
                "ALREADY_EXISTS", self._replaced_detail(executor_id, current.instance_id, registration)
            )
        detail = "" if current is None else f"replaces instance {current.instance_id}"
        if expected is not None and expected.unmonitored:
            detail = "its agent registered after the executor was reported unmonitored"
        self._emit(kind, executor_id, host, instance_id, detail)
        return Registered(self.epoch, instance_id, resumed=False)

    def receive_heartbeat(
        self, executor_id: str, epoch: str, instance_id: str, seq: int, payload: Payload
    ) -> None:
        """An agent answered a request; raises ``HeartbeatProtocolError`` (and applies nothing) if stale."""
        registration = self._live(executor_id, epoch, instance_id)
        sent = registration.target.sent.pop(seq, None)
        rtt_ms = None if sent is None else (self._clock.monotonic() - sent) * 1000.0
        if not self._sender.receive_heartbeat(executor_id, payload):
            raise UnknownExecutorError(f"executor {executor_id!r} is not monitored; register again")
        now_wall = self._clock.time()
        registration.last_heartbeat = now_wall
        registration.payload = payload
        if rtt_ms is not None:
            registration.last_rtt_ms = rtt_ms
            if not self._stopped:
                self._bus.publish(
                    HeartbeatRecord(executor_id, registration.host, instance_id, now_wall, rtt_ms, payload)
                )

    def unregister(self, executor_id: str, epoch: str, instance_id: str, reason: str = "") -> None:
        """The agent is leaving on purpose; ``reason`` (recorded and logged) must be printable."""
        check_text("reason", reason, MAX_REASON_CHARS, allow_empty=True)
        registration = self._live(executor_id, epoch, instance_id)
        self._end(registration, "UNREGISTERED", EventKind.UNREGISTERED, reason or "agent stopped", None)

    def report_rpc_failure(self, executor_id: str, link: AgentLink) -> None:
        """A send on ``link`` failed asynchronously (only counts if ``link`` is still current)."""
        registration = self._registrations.get(executor_id)
        if registration is not None and registration.target.link is link:
            registration.monitor.report_rpc_failure()

    # ---- the cluster manager's view (Spark's, forwarded by the driver plugin) -------------

    def expect(self, executor_id: str, host: str, within_s: float) -> None:
        """The cluster manager started ``executor_id`` on ``host``: unless an agent registers for
        it within ``within_s`` (on the injected scheduler's clock), it is reported UNMONITORED,
        once, and listed with that state. Nothing happens for an executor that an agent
        registered for already (the cluster manager's word may come late) or that is expected."""
        check_text("executor_id", executor_id)
        check_text("host", host, allow_empty=True)
        with self._lock:
            if self._stopped or executor_id in self._cluster_gone:
                return
            self._in_cluster[executor_id] = within_s
            if self._has_agent(executor_id) or executor_id in self._expected:
                return
        self._unmonitored_unless_registered(
            executor_id,
            host,
            within_s,
            f"no agent registered within {within_s:g} s after the executor started",
        )

    def agent_not_started(self, executor_id: str, reason: str) -> None:
        """The executor's side says its agent could not start: UNMONITORED now, with ``reason``,
        rather than after the ``expect`` bound (if no agent registered for it meanwhile)."""
        check_text("executor_id", executor_id)
        with self._lock:
            if self._stopped or self._has_agent(executor_id) or executor_id in self._cluster_gone:
                return
            self._expected.setdefault(executor_id, _Expected("", self._clock.time()))
        self._unmonitored(executor_id, f"its agent did not start: {clean_reason(reason)}")

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None:
        """The executor's side says its agent process ``pid`` exited (or could not be restarted):
        UNMONITORED now with ``detail`` (each report again, the latest detail listed), its live
        registration, if it is that agent's, ended without a timeout (nobody answers it any
        more); a newer agent's registration is left alone (the report came late), as is an
        executor the cluster manager removed. Its next registration ends the state."""
        check_text("executor_id", executor_id)
        detail = clean_reason(detail)
        with self._lock:
            if self._stopped or executor_id in self._cluster_gone:
                return
            registration = self._registrations.get(executor_id)
            live = registration is not None and registration.state == "RUNNING"
            if registration is not None and live and pid and registration.pid and registration.pid != pid:
                return
            if registration is not None and live:
                registration.state = "AGENT_EXITED"
                self._forget_old_ended(executor_id)
            host = registration.host if registration is not None else ""
            expected = self._expected.setdefault(executor_id, _Expected(host, self._clock.time()))
            timer, expected.timer = expected.timer, None
            expected.unmonitored = True
            expected.detail = detail
        if timer is not None:
            timer.cancel()
        instance_id = ""
        if registration is not None and live:
            self._sender.unmonitor_if(executor_id, registration.monitor)
            instance_id = registration.instance_id
        self._emit(EventKind.UNMONITORED, executor_id, expected.host, instance_id, detail)

    def cluster_removed(self, executor_id: str, kind: EventKind, detail: str) -> None:
        """The cluster manager removed ``executor_id``: recorded as ``kind`` (``SPARK_REMOVED`` when
        on purpose, ``SPARK_LOST`` when lost) with ``detail`` (cut to the reason limit). After a
        removal on purpose, the agent's own end (it unregisters as its JVM stops, or goes
        silent) carries that removal in its detail, so it does not read as a crash."""
        if kind not in (EventKind.SPARK_REMOVED, EventKind.SPARK_LOST):
            raise ValueError(f"a removal is SPARK_REMOVED or SPARK_LOST, not {kind.value}")
        check_text("executor_id", executor_id)
        detail = clean_reason(detail)
        with self._lock:
            expected = self._expected.pop(executor_id, None)
            self._in_cluster.pop(executor_id, None)
            registration = self._registrations.get(executor_id)
            self._cluster_gone[executor_id] = None
            while len(self._cluster_gone) > self._max_ended:
                self._cluster_gone.popitem(last=False)
            if kind is EventKind.SPARK_REMOVED:
                self._removed_on_purpose[executor_id] = detail
                while len(self._removed_on_purpose) > self._max_ended:
                    del self._removed_on_purpose[next(iter(self._removed_on_purpose))]
        if expected is not None and expected.timer is not None:
            expected.timer.cancel()
        host = registration.host if registration else expected.host if expected else ""
        self._emit(kind, executor_id, host, registration.instance_id if registration else "", detail)

    def _unmonitored(self, executor_id: str, detail: str) -> None:
        with self._lock:
            expected = self._expected.get(executor_id)
            if expected is None or expected.unmonitored or self._has_agent(executor_id):
                return
            expected.unmonitored = True
            expected.detail = detail
            timer, expected.timer = expected.timer, None
        if timer is not None:
            timer.cancel()
        self._emit(EventKind.UNMONITORED, executor_id, expected.host, "", detail)

    # ---- HeartbeatListener ----------------------------------------------------------------

    def _trust_check(self, executor_id: str, target: _AgentTarget) -> Callable[[float, float], bool]:
        """A monitor's vetting, the one judge of a silence: from ``since`` to ``now`` it counts
        only if the RM asked the agent steadily over it (``rm.trust``). A veto is the RM's own
        stall (its process paused or starved): the monitor watches again from now. A stall vetoes
        every agent's silence at once, so one WARNING per ``_STALL_LOG_S`` tells of them (each
        at DEBUG)."""
        interval = self.services.interval_s

        def trusted(since: float, now: float) -> bool:
            if target.dropped_at is not None:
                since = max(since, target.dropped_at)
            ok, stall = trusted_timeout(
                tuple(target.sent.values()), since, now, interval, max(now - since, 1e-9)
            )
            if not ok:
                message = (
                    "executor %s: a silence of %.2f s not judged: the RM itself sent no request "
                    "for %.2f s (its own stall); watching it again (other executors' silences over "
                    "a stall are logged at DEBUG)"
                )
                silent = now - since
                if not self._stall_log.log("stall", logging.WARNING, message, executor_id, silent, stall):
                    log.debug(message, executor_id, silent, stall)
            return ok

        return trusted

    def notify_heartbeat_timeout(self, target_id: str) -> None:
        """A silence the monitor's vetting (``_trust_check``) judged the agent's own."""
        registration = self._registrations.get(target_id)
        if registration is not None and registration.state == "RUNNING":
            timeout, last = self.services.timeout_s, registration.monitor.last_heartbeat
            silent = None if last is None else self._clock.monotonic() - last
            if silent is not None and silent >= 1.5 * timeout:  # judging was put off by a stall
                silence = f"no heartbeat for {silent:.1f} s"
            else:
                silence = f"no heartbeat for {timeout:g} s"
            suspicion = getattr(registration.monitor, "suspicion", None)  # PhiMonitor's, if it fired
            if suspicion is not None:
                silence = suspicion.describe()
            if self._kill_frozen_hosts:
                registration.target.link.ask_kill_host(self.epoch, registration.instance_id, silence)
            self._end(
                registration,
                "TIMEOUT",
                EventKind.HEARTBEAT_TIMEOUT,
                silence,
                ("NOT_FOUND", "heartbeat timeout: the RM dropped this registration; register again"),
            )

    def notify_target_unreachable(self, target_id: str) -> None:
        registration = self._registrations.get(target_id)
        if registration is not None and registration.state == "RUNNING":
            failures = registration.monitor.consecutive_rpc_failures
            self._end(
                registration,
                "UNREACHABLE",
                EventKind.UNREACHABLE,
                f"{failures} consecutive heartbeat RPCs failed",
                ("NOT_FOUND", "unreachable: the RM dropped this registration; register again"),
            )

    def report_payload(self, target_id: str, payload: Payload) -> None:
        """Payloads are recorded by ``receive_heartbeat``, which also knows the RTT."""

    def retrieve_payload(self, target_id: str) -> None:
        return None

    # ---- queries --------------------------------------------------------------------------

    def executors(self) -> list[ExecutorInfo]:
        """Every registration (live or ended), then every executor the cluster manager runs
        without an agent (state ``UNMONITORED``, no instance, ``detail`` the reason;
        ``registered_at`` is when it was found without one), which replaces its ended
        registration in the list."""
        with self._lock:
            unmonitored = [
                ExecutorInfo(
                    executor_id, e.host, "", "UNMONITORED", e.added_at, None, None, None, 0, e.detail
                )
                for executor_id, e in self._expected.items()
                if e.unmonitored
            ]
            shown = {info.executor_id for info in unmonitored}  # its ended registration is history
            registered = [
                ExecutorInfo(
                    r.executor_id,
                    r.host,
                    r.instance_id,
                    r.state,
                    r.registered_at,
                    r.last_heartbeat,
                    r.last_rtt_ms,
                    r.payload,
                    r.pid,
                )
                for r in self._registrations.values()
                if r.executor_id not in shown
            ]
        return registered + unmonitored

    def last_heartbeat_from(self, executor_id: str) -> float | None:
        """``clock.monotonic()`` reading at the last heartbeat from a live registration."""
        return self._sender.last_heartbeat_from(executor_id)

    # ---- internals ------------------------------------------------------------------------

    @staticmethod
    def _replaced_detail(executor_id: str, instance_id: str, newer: _Registration) -> str:
        return (
            f"registration {instance_id} of executor {executor_id!r} was replaced by a newer one "
            f"(instance {newer.instance_id}, host {newer.host or '?'}, pid {newer.pid or '?'})"
        )

    def _live(self, executor_id: str, epoch: str, instance_id: str) -> _Registration:
        if epoch != self.epoch:
            raise StaleEpochError(
                f"epoch {excerpt(epoch)} is not the RM's current epoch {self.epoch!r}; register again"
            )
        registration = self._registrations.get(executor_id)
        if registration is None or registration.state != "RUNNING":
            raise UnknownExecutorError(f"executor {executor_id!r} has no live registration; register again")
        if instance_id != registration.instance_id:
            raise StaleInstanceError(
                f"instance {excerpt(instance_id)} of executor {executor_id!r} was replaced by a newer "
                "registration"
            )
        return registration

    def _end(
        self,
        registration: _Registration,
        state: str,
        kind: EventKind,
        detail: str,
        close: tuple[str, str] | None,
    ) -> None:
        with self._lock:
            if registration.state != "RUNNING":
                return
            registration.state = state
            self._forget_old_ended(registration.executor_id)
            removal = self._removed_on_purpose.get(registration.executor_id)
        if removal is not None:  # the agent's end follows from it: say so
            detail = f"{detail}; the executor was {removal}"
        self._sender.unmonitor_if(registration.executor_id, registration.monitor)
        if close is not None:
            registration.target.link.close(*close)
        self._emit(kind, registration.executor_id, registration.host, registration.instance_id, detail)
        self._await_agent(registration.executor_id, registration.host, f"{kind.value} ({detail})")

    def _await_agent(self, executor_id: str, host: str, after: str) -> None:
        """An executor the cluster manager still runs lost its registration: it has the grace of
        a new executor to get an agent registered again, else it is UNMONITORED (never left
        TIMEOUT for good)."""
        with self._lock:
            grace = self._in_cluster.get(executor_id)
            if self._stopped or grace is None or executor_id in self._expected:
                return
        self._unmonitored_unless_registered(
            executor_id, host, grace, f"no agent registered again within {grace:g} s after {after}"
        )

    def _unmonitored_unless_registered(
        self, executor_id: str, host: str, within_s: float, reason: str
    ) -> None:
        """``executor_id`` is expected from now on: UNMONITORED with ``reason`` unless an agent
        registers for it within ``within_s`` (a registration cancels the timer). The one timer of
        ``expect`` and ``_await_agent``."""
        with self._lock:  # checked again: a registration or a removal may have come meanwhile
            if self._stopped or executor_id in self._expected or executor_id in self._cluster_gone:
                return
            if self._has_agent(executor_id):
                return
            expected = _Expected(host, self._clock.time())
            self._expected[executor_id] = expected
        expected.timer = self._scheduler.schedule(within_s, lambda: self._unmonitored(executor_id, reason))

    def _has_agent(self, executor_id: str) -> bool:
        """Whether a live (RUNNING) registration serves ``executor_id``; call under the lock."""
        registration = self._registrations.get(executor_id)
        return registration is not None and registration.state == "RUNNING"

    def _forget_old_ended(self, executor_id: str) -> None:
        """Keep at most ``max_ended`` ended entries in the table so executor churn cannot grow it.
        A forgotten executor's id is still remembered as seen, among the last ``max_ended``
        forgotten ones (else the ids seen would grow by every executor an application of months
        ever ran): an agent that comes back later than that registers as ``REGISTERED``."""
        self._ended.append(executor_id)
        self._ended_count[executor_id] = self._ended_count.get(executor_id, 0) + 1
        while len(self._ended) > self._max_ended:
            old = self._ended.popleft()
            left = self._ended_count[old] - 1  # ends of it still in the deque (it may have flapped)
            if left:
                self._ended_count[old] = left
            else:
                del self._ended_count[old]
            entry = self._registrations.get(old)
            if entry is not None and entry.state != "RUNNING" and not left:
                del self._registrations[old]
                self._seen.discard(old)
                self._forgotten[old] = None
                while len(self._forgotten) > self._max_ended:
                    self._forgotten.popitem(last=False)

    def _emit(
        self,
        kind: EventKind,
        executor_id: str,
        host: str,
        instance_id: str,
        detail: str,
    ) -> None:
        if self._stopped:
            return
        log.info("executor %s (%s) %s %s", executor_id, instance_id, kind.value, detail)
        self._bus.publish(ExecutorEvent(kind, executor_id, host, instance_id, self._clock.time(), detail))
