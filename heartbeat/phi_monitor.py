"""``PhiMonitor``: a ``HeartbeatMonitor`` that also suspects a silent target early, by phi accrual.

The timeout stays what it is: a silence of ``timeout_s`` ends the target as with the plain
monitor, whatever phi says. Before that, each heartbeat adds the interval since the previous one
to the target's own history (``phi_accrual``), and one lazy timer is armed for the silence at
which phi would reach the threshold (``suspect_after_s``): a steady target that stops is suspected
a few of its own deviations after its usual interval, a jittery one only later. A suspicion ends
the target the same one-way way (``TIMEOUT``, the listener's ``notify_heartbeat_timeout``) and
leaves its numbers in :attr:`PhiMonitor.suspicion` for the record.

Nothing is judged on evidence that may be the observer's own silence:

* the local-pause guard: a check that runs more than ``late_check_s`` after it was due judges
  nothing (the observer, not the target, may have been paused); the silence then counts from that
  late check, so the target gets a whole margin of the observer's own awake time;
* the vetting hook (``HeartbeatMonitor.set_vetting``, which the timeout passes too): the owner's
  own check of the window, e.g. the RM's ``rm.trust`` (did it send its requests steadily
  meanwhile?); a veto judges nothing either;
* no judgement before the first heartbeat: until then only the timeout applies.

Same clock and scheduler as the plain monitor, so a ``ManualScheduler`` drives it in tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.listener import HeartbeatListener
from heartbeat.monitor import RPC_FAILURE_DETECTION_DISABLED, HeartbeatMonitor, MonitorState, Vetting
from heartbeat.phi_accrual import PhiAccrual, PhiSettings
from heartbeat.scheduler import Cancellable, Scheduler
from heartbeat.target import HeartbeatTarget

O = TypeVar("O")  # noqa: E741


@dataclass(frozen=True, slots=True)
class Suspicion:
    """Why a target was suspected: phi, the silence, and its history's interval statistics."""

    phi: float
    silent_s: float
    mean_s: float
    std_s: float

    def describe(self) -> str:
        return (
            f"phi {self.phi:.1f} after {self.silent_s:.2f} s without a heartbeat "
            f"(its intervals: mean {self.mean_s * 1000:.0f} ms, sd {self.std_s * 1000:.0f} ms)"
        )


class PhiMonitor(HeartbeatMonitor[O]):
    """The plain monitor plus an early, per-target suspicion (see the module doc)."""

    def __init__(
        self,
        target_id: str,
        target: HeartbeatTarget[O],
        listener: HeartbeatListener[Any, Any],
        clock: Clock,
        scheduler: Scheduler,
        timeout_s: float,
        rpc_failure_threshold: int = RPC_FAILURE_DETECTION_DISABLED,
        *,
        phi: PhiSettings,
    ) -> None:
        super().__init__(target_id, target, listener, clock, scheduler, timeout_s, rpc_failure_threshold)
        self._history = PhiAccrual(phi)
        self.suspicion: Suspicion | None = None
        self._last_arrival: float | None = None
        self._since = clock.monotonic()  # where the silence being judged starts
        self._check_due = self._since + self._history.suspect_after_s()
        self._check: Cancellable | None = scheduler.schedule(self._check_due - self._since, self._on_check)

    @property
    def history(self) -> PhiAccrual:
        return self._history

    def report_heartbeat(self) -> None:
        super().report_heartbeat()
        now = self._clock.monotonic()
        with self._lock:
            if self._state is not MonitorState.RUNNING:
                return
            if self._last_arrival is not None:
                self._history.add_interval(now - self._last_arrival)
            self._last_arrival = self._since = now
            due = now + self._history.suspect_after_s()
            if self._check is None or due < self._check_due:  # none armed, or it would come too late
                self._arm(due)

    def _arm(self, due: float) -> None:
        """(Re)arms the one check timer for ``due``; call with the lock held."""
        old, self._check_due = self._check, due
        self._check = self._scheduler.schedule(max(0.0, due - self._clock.monotonic()), self._on_check)
        if old is not None:
            old.cancel()

    def _skip(self, now: float) -> None:
        """Judge nothing now: the silence counts again from ``now``; call with the lock held."""
        self.checks_skipped += 1
        self._since = max(self._since, now)
        self._arm(now + self._history.suspect_after_s())

    def _on_check(self) -> None:
        now = self._clock.monotonic()
        with self._lock:
            if self._state is not MonitorState.RUNNING:
                return
            self._check = None
            if now - self._check_due > self._history.settings.late_check_s:
                self._skip(now)  # the local-pause guard: a late check judges nothing
                return
            if self._last_arrival is None:  # nothing to judge against yet: the timeout rules
                self._arm(now + self._history.suspect_after_s())
                return
            since = self._since
            due = since + self._history.suspect_after_s()
            if now < due:  # a heartbeat came meanwhile (the timer is lazy): wait for the rest
                self._arm(due)
                return
            silent = now - since
            suspicion = Suspicion(
                self._history.phi(silent), silent, self._history.mean_s, self._history.std_s
            )
        if not self._vetted(since, now):
            with self._lock:
                if self._state is MonitorState.RUNNING:
                    self._skip(now)
            return
        # Only if no heartbeat came while the suspicion was vetted (compared under the lock).
        if self._transition(MonitorState.TIMEOUT, still=lambda: self._since == since):
            self.suspicion = suspicion
            self._listener.notify_heartbeat_timeout(self.target_id)
            return
        with self._lock:  # a heartbeat came meanwhile: not silent any more, watch on
            if self._state is MonitorState.RUNNING and self._check is None:
                self._arm(self._since + self._history.suspect_after_s())

    def _transition(self, new: MonitorState, still: Callable[[], bool] | None = None) -> bool:
        if not super()._transition(new, still):
            return False
        with self._lock:
            check, self._check = self._check, None
        if check is not None:
            check.cancel()
        return True


__all__ = ["PhiMonitor", "Suspicion", "Vetting"]
