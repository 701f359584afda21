"""``HeartbeatMonitor``: the liveness state of one target (Flink's ``HeartbeatMonitorImpl``).

States are one-way: RUNNING -> TIMEOUT | UNREACHABLE | CANCELED, changed only by compare-and-set,
so a timeout or an unreachable notification fires at most once and ``cancel`` is idempotent.

The timer is lazy: a heartbeat only moves the deadline, and the timer, when it fires early,
re-arms itself for the remainder. That keeps the per-heartbeat cost to a store instead of a
cancel-and-reschedule, which matters with thousands of targets per RM. Deadlines are readings
of the injected clock's ``monotonic()``, and the timer comes from the injected scheduler, so a
``ManualScheduler`` drives every transition in tests.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.listener import HeartbeatListener
from heartbeat.scheduler import Cancellable, Scheduler
from heartbeat.target import HeartbeatTarget

O = TypeVar("O")  # noqa: E741

RPC_FAILURE_DETECTION_DISABLED = -1


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
        self._deadline = clock.monotonic() + timeout_s
        self._timer: Cancellable | None = scheduler.schedule(timeout_s, self._on_timer)

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
            remaining = self._deadline - self._clock.monotonic()
            if remaining > 0:
                self._timer = self._scheduler.schedule(remaining, self._on_timer)
                return
        if self._transition(MonitorState.TIMEOUT):
            self._listener.notify_heartbeat_timeout(self.target_id)
