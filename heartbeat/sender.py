"""``HeartbeatManagerSender``: the manager that requests heartbeats every interval (Flink's sender).

Flink requests from every target in one sweep per interval. With thousands of targets a single
sweep makes a burst whose tail waits behind the head, inflating RTT, so targets are spread over
``spread`` evenly filled slices and one slice is swept every ``interval / spread``: each target is
still requested exactly once per interval. Sweeps are planned on the injected clock's
``monotonic()`` and run by the injected scheduler.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.errors import HeartbeatRpcError
from heartbeat.listener import HeartbeatListener
from heartbeat.manager import HeartbeatManager
from heartbeat.monitor import HeartbeatMonitor
from heartbeat.phi_accrual import PhiSettings
from heartbeat.scheduler import Cancellable, Scheduler

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

log = logging.getLogger(__name__)


class HeartbeatManagerSender(HeartbeatManager[I, O]):
    """Requests a heartbeat from each monitored target once per ``interval_s``."""

    def __init__(
        self,
        own_id: str,
        listener: HeartbeatListener[I, O],
        clock: Clock,
        scheduler: Scheduler,
        interval_s: float,
        timeout_s: float,
        rpc_failure_threshold: int,
        spread: int = 10,
        *,
        phi: PhiSettings | None = None,
    ) -> None:
        super().__init__(own_id, listener, clock, scheduler, timeout_s, rpc_failure_threshold, phi=phi)
        if spread < 1:
            raise ValueError("spread must be >= 1")
        self._interval_s = interval_s
        self._slices: list[dict[str, HeartbeatMonitor[O]]] = [{} for _ in range(spread)]
        self._slice_of: dict[str, int] = {}
        self._step_s = interval_s / spread
        self._tick = 0
        self._started_at: float | None = None
        self._timer: Cancellable | None = None

    def start(self) -> None:
        """Begin the periodic requests (the first slice is swept right away)."""
        if self._started_at is None:
            self._started_at = self._clock.monotonic()
            self._timer = self._scheduler.schedule(0.0, self._run)

    def stop(self) -> None:
        super().stop()
        if self._timer is not None:
            self._timer.cancel()

    def _on_added(
        self, target_id: str, monitor: HeartbeatMonitor[O], old: HeartbeatMonitor[O] | None
    ) -> None:
        index = self._slice_of.get(target_id)
        if index is None:
            index = min(range(len(self._slices)), key=lambda i: len(self._slices[i]))
            self._slice_of[target_id] = index
        self._slices[index][target_id] = monitor

    def _on_removed(self, target_id: str, monitor: HeartbeatMonitor[O]) -> None:
        index = self._slice_of.pop(target_id, None)
        if index is not None:
            self._slices[index].pop(target_id, None)

    def _run(self) -> None:
        if self._stopped or self._started_at is None:
            return
        with self._lock:
            due = list(self._slices[self._tick % len(self._slices)].values())
        self._tick += 1
        for monitor in due:
            self._request(monitor)
        # Schedule against the planned start so the period does not drift with callback cost.
        next_at = self._started_at + self._tick * self._step_s
        if not self._stopped:
            self._timer = self._scheduler.schedule(max(0.0, next_at - self._clock.monotonic()), self._run)

    def _request(self, monitor: HeartbeatMonitor[O]) -> None:
        if not monitor.is_running():
            return
        try:
            payload = self._listener.retrieve_payload(monitor.target_id)
            monitor.target.request_heartbeat(self.own_id, payload)
        except HeartbeatRpcError as exc:
            log.debug("heartbeat request to %s failed: %s", monitor.target_id, exc)
            monitor.report_rpc_failure()
        except Exception:  # a bug in one target must not end the sweep for every other
            log.exception("heartbeat request to %s failed", monitor.target_id)
            monitor.report_rpc_failure()
        else:
            monitor.report_rpc_success()
