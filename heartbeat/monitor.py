"""``HeartbeatMonitor``: the liveness state of one target (Flink's ``HeartbeatMonitorImpl``).

States are one-way: RUNNING -> TIMEOUT | UNREACHABLE | CANCELED, changed only by compare-and-set,
so a timeout or an unreachable notification fires at most once and ``cancel`` is idempotent.

A timeout judges only a silence its owner vouches for: the owner's vetting hook
(:meth:`HeartbeatMonitor.set_vetting`, e.g. the RM's ``rm.trust``: did it send its requests
steadily over the silence?) may veto it, and the silence then counts again from that check, so the
target gets a whole timeout of the owner's own awake time: a target that stays silent is timed
out one timeout later, on evidence that is its own.

The timer is lazy: a heartbeat only moves the deadline, and the timer, when it fires early,
re-arms itself for the remainder. That keeps the per-heartbeat cost to a store instead of a
cancel-and-reschedule, which matters with thousands of targets per RM. Deadlines are readings
of the injected clock's ``monotonic()``, and the timer comes from the injected scheduler, so a
``ManualScheduler`` drives every transition in tests.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.listener import HeartbeatListener
from heartbeat.scheduler import Cancellable, Scheduler
from heartbeat.target import HeartbeatTarget

log = logging.getLogger(__name__)

O = TypeVar("O")  # noqa: E741

RPC_FAILURE_DETECTION_DISABLED = -1

Vetting = Callable[[float, float], bool]
"""``(since, now) -> trusted``: whether the owner's own view of that silence can be believed."""


def _vouched(since: float, now: float) -> bool:
    return True


class MonitorState(enum.Enum):
    RUNNING = "RUNNING"
    TIMEOUT = "TIMEOUT"
    UNREACHABLE = "UNREACHABLE"
    CANCELED = "CANCELED"


class HeartbeatMonitor(Generic[O]):
    """Watches one target; the timer starts at creation (registration counts as a heartbeat)."""

    def __init__(
        self,
        target_id: str,
        target: HeartbeatTarget[O],
        listener: HeartbeatListener[Any, Any],
        clock: Clock,
        scheduler: Scheduler,
        timeout_s: float,
        rpc_failure_threshold: int = RPC_FAILURE_DETECTION_DISABLED,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("the heartbeat timeout must be > 0")
        self.target_id = target_id
        self.target = target
        self._listener = listener
        self._clock = clock
        self._scheduler = scheduler
        self._timeout_s = timeout_s
        self._threshold = rpc_failure_threshold
        self._lock = threading.Lock()
        self._state = MonitorState.RUNNING
        self._failures = 0
        self._last_heartbeat: float | None = None
        self._vetting: Vetting = _vouched
        self.checks_skipped = 0
        """Checks that judged nothing: vetoed by the vetting hook (or, for phi, run late)."""
        self._deadline = clock.monotonic() + timeout_s
        self._timer: Cancellable | None = scheduler.schedule(timeout_s, self._on_timer)

    def set_vetting(self, vetting: Vetting) -> None:
        """The owner's check of a silence before it counts (see the module doc)."""
        self._vetting = vetting

    def _vetted(self, since: float, now: float) -> bool:
        """The vetting hook's word on the silence from ``since`` to ``now``; one that fails
        judges nothing."""
        try:
            return bool(self._vetting(since, now))
        except Exception:
            log.exception("vetting the silence of %s failed: judged nothing", self.target_id)
            return False

    @property
    def state(self) -> MonitorState:
        return self._state

    @property
    def last_heartbeat(self) -> float | None:
        """``clock.monotonic()`` reading at the last heartbeat, or None if none arrived yet."""
        return self._last_heartbeat

    @property
    def consecutive_rpc_failures(self) -> int:
        return self._failures

    def is_running(self) -> bool:
        return self._state is MonitorState.RUNNING

    def report_heartbeat(self) -> None:
        """A heartbeat arrived: push the deadline back and forget earlier RPC failures."""
        now = self._clock.monotonic()
        with self._lock:
            if self._state is not MonitorState.RUNNING:
                return
            self._last_heartbeat = now
            self._deadline = now + self._timeout_s
            self._failures = 0

    def report_rpc_success(self) -> None:
        with self._lock:
            self._failures = 0

    def report_rpc_failure(self) -> None:
        """Count one failed RPC; the threshold-th consecutive one makes the target UNREACHABLE."""
        if self._threshold == RPC_FAILURE_DETECTION_DISABLED:
            return
        with self._lock:
            if self._state is not MonitorState.RUNNING:
                return
            self._failures += 1
            if self._failures < self._threshold:
                return
        if self._transition(MonitorState.UNREACHABLE):
            self._listener.notify_target_unreachable(self.target_id)

    def cancel(self) -> None:
        """Stop watching; idempotent and harmless after a timeout already fired."""
        self._transition(MonitorState.CANCELED)

    def _transition(self, new: MonitorState, still: Callable[[], bool] | None = None) -> bool:
        """Compare-and-set RUNNING -> ``new`` (and ``still()`` true, read under the same lock);
        only the winner gets True and notifies."""
        with self._lock:
            if self._state is not MonitorState.RUNNING or (still is not None and not still()):
                return False
            self._state = new
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        return True

    def _on_timer(self) -> None:
        with self._lock:
            if self._state is not MonitorState.RUNNING:
                return
            self._timer = None  # this one fired: whoever re-arms sets the next
            now = self._clock.monotonic()
            deadline = self._deadline
            if deadline > now:
                self._timer = self._scheduler.schedule(deadline - now, self._on_timer)
                return
        if not self._vetted(deadline - self._timeout_s, now):
            with self._lock:
                if self._state is not MonitorState.RUNNING:
                    return
                if self._deadline == deadline:  # no heartbeat meanwhile: the silence counts from now
                    self.checks_skipped += 1
                    self._deadline = now + self._timeout_s
                self._timer = self._scheduler.schedule(self._deadline - now, self._on_timer)
            return
        # Only if no heartbeat came while the silence was vetted (compared under the lock).
        if self._transition(MonitorState.TIMEOUT, still=lambda: self._deadline == deadline):
            self._listener.notify_heartbeat_timeout(self.target_id)
            return
        with self._lock:  # a heartbeat came meanwhile: not silent any more, watch on
            if self._state is MonitorState.RUNNING and self._timer is None:
                self._timer = self._scheduler.schedule(self._deadline - now, self._on_timer)
