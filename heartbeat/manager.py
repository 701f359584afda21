"""``HeartbeatManager``: monitors many targets and answers heartbeat requests (Flink's receiver side).

The manager is itself addressed like a target: ``request_heartbeat`` is how a sender's request
arrives here, ``receive_heartbeat`` is how a target's answer arrives. Both reset that target's
monitor, hand the payload to the listener, and (for a request) answer with our own payload.
"""

from __future__ import annotations

import logging
import threading
from typing import Generic, TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.errors import ClosedError, HeartbeatRpcError
from heartbeat.listener import HeartbeatListener
from heartbeat.monitor import HeartbeatMonitor
from heartbeat.phi_accrual import PhiSettings
from heartbeat.phi_monitor import PhiMonitor
from heartbeat.scheduler import Scheduler
from heartbeat.target import HeartbeatTarget

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

log = logging.getLogger(__name__)


class HeartbeatManager(Generic[I, O]):
    """Receiver side: tracks targets and answers their heartbeat requests."""

    def __init__(
        self,
        own_id: str,
        listener: HeartbeatListener[I, O],
        clock: Clock,
        scheduler: Scheduler,
        timeout_s: float,
        rpc_failure_threshold: int,
        *,
        phi: PhiSettings | None = None,
    ) -> None:
        """``phi``: every monitor also suspects its target early, by phi accrual (``phi_monitor``)."""
        self.own_id = own_id
        self._phi = phi
        self._listener = listener
        self._clock = clock
        self._scheduler = scheduler
        self._timeout_s = timeout_s
        self._threshold = rpc_failure_threshold
        self._lock = threading.Lock()
        self._monitors: dict[str, HeartbeatMonitor[O]] = {}
        self._stopped = False

    @property
    def listener(self) -> HeartbeatListener[I, O]:
        return self._listener

    def monitor_target(self, target_id: str, target: HeartbeatTarget[O]) -> HeartbeatMonitor[O]:
        """Start watching ``target_id``; an existing monitor for it is replaced (and cancelled)."""
        monitor: HeartbeatMonitor[O]
        args = (target_id, target, self._listener, self._clock, self._scheduler)
        if self._phi is None:
            monitor = HeartbeatMonitor(*args, self._timeout_s, self._threshold)
        else:
            monitor = PhiMonitor(*args, self._timeout_s, self._threshold, phi=self._phi)
        with self._lock:
            if self._stopped:
                monitor.cancel()
                raise ClosedError("the heartbeat manager was stopped")
            old = self._monitors.get(target_id)
            self._monitors[target_id] = monitor
            self._on_added(target_id, monitor, old)
        if old is not None:
            old.cancel()
        return monitor

    def unmonitor_target(self, target_id: str) -> None:
        """Stop watching ``target_id``; a pending timeout for it will not fire. Idempotent."""
        with self._lock:
            monitor = self._monitors.pop(target_id, None)
            if monitor is not None:
                self._on_removed(target_id, monitor)
        if monitor is not None:
            monitor.cancel()

    def unmonitor_if(self, target_id: str, monitor: HeartbeatMonitor[O]) -> bool:
        """Remove ``target_id`` only if ``monitor`` is still its current monitor (no stale removal)."""
        with self._lock:
            if self._monitors.get(target_id) is not monitor:
                return False
            del self._monitors[target_id]
            self._on_removed(target_id, monitor)
        monitor.cancel()
        return True

    def stop(self) -> None:
        """Cancel every monitor; nothing is notified afterwards. Idempotent."""
        with self._lock:
            self._stopped = True
            monitors = list(self._monitors.items())
            self._monitors.clear()
            for target_id, monitor in monitors:
                self._on_removed(target_id, monitor)
        for _, monitor in monitors:
            monitor.cancel()

    def last_heartbeat_from(self, target_id: str) -> float | None:
        """``clock.monotonic()`` reading at the last heartbeat from ``target_id``; None if unknown or none."""
        monitor = self._monitors.get(target_id)
        return None if monitor is None else monitor.last_heartbeat

    def monitor(self, target_id: str) -> HeartbeatMonitor[O] | None:
        return self._monitors.get(target_id)

    def targets(self) -> list[str]:
        with self._lock:
            return list(self._monitors)

    def receive_heartbeat(self, heartbeat_origin: str, payload: I) -> bool:
        """A target answered; returns False (and ignores it) if the target is not monitored."""
        monitor = self._monitors.get(heartbeat_origin)
        if monitor is None or self._stopped or not monitor.is_running():
            return False
        monitor.report_heartbeat()
        self._listener.report_payload(heartbeat_origin, payload)
        return True

    def request_heartbeat(self, request_origin: str, payload: I) -> bool:
        """A sender asked for our heartbeat: note it as alive and answer with our payload."""
        monitor = self._monitors.get(request_origin)
        if monitor is None or self._stopped or not monitor.is_running():
            return False
        monitor.report_heartbeat()
        self._listener.report_payload(request_origin, payload)
        answer = self._listener.retrieve_payload(request_origin)
        try:
            monitor.target.receive_heartbeat(self.own_id, answer)
        except HeartbeatRpcError:
            monitor.report_rpc_failure()
        return True

    def report_rpc_failure(self, target_id: str) -> None:
        """An asynchronous send to ``target_id`` failed (e.g. its stream broke)."""
        monitor = self._monitors.get(target_id)
        if monitor is not None:
            monitor.report_rpc_failure()

    # Hooks for the sender subclass; called with the manager lock held.
    def _on_added(
        self, target_id: str, monitor: HeartbeatMonitor[O], old: HeartbeatMonitor[O] | None
    ) -> None:
        pass

    def _on_removed(self, target_id: str, monitor: HeartbeatMonitor[O]) -> None:
        pass
