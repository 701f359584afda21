"""``HeartbeatServices``: the validated heartbeat settings, and the factory for managers.

The library takes settings only in this form, validated on construction as Flink does
(``0 < interval < timeout``; the RPC-failure threshold is >= 1, or -1 to disable that signal),
and keeps no table of configuration keys of its own: whoever embeds it declares and parses
its keys once and builds a ``HeartbeatServices`` from them (the Spark plugin from its
``spark.arrowbeat.heartbeat.*`` declarations, the stand-alone agent from its command line).

``phi`` (``PhiSettings``, optional) turns on the early, per-target suspicion of the phi accrual
detector (``phi_monitor``) in every monitor the managers make; the timeout stays the longest silence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.errors import HeartbeatConfigError
from heartbeat.listener import HeartbeatListener
from heartbeat.manager import HeartbeatManager
from heartbeat.monitor import RPC_FAILURE_DETECTION_DISABLED
from heartbeat.phi_accrual import PhiSettings
from heartbeat.scheduler import Scheduler
from heartbeat.sender import HeartbeatManagerSender

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class HeartbeatServices:
    """Heartbeat interval, timeout (seconds) and RPC-failure threshold, and the phi detector's
    settings if it is on; validated on construction."""

    interval_s: float = 1.0
    timeout_s: float = 5.0
    rpc_failure_threshold: int = 2
    phi: PhiSettings | None = None

    def __post_init__(self) -> None:
        if not (_is_number(self.interval_s) and math.isfinite(self.interval_s) and self.interval_s > 0):
            raise HeartbeatConfigError("interval_s", self.interval_s, "a finite number > 0 (seconds)")
        if not (
            _is_number(self.timeout_s) and math.isfinite(self.timeout_s) and self.timeout_s > self.interval_s
        ):
            raise HeartbeatConfigError(
                "timeout_s", self.timeout_s, f"a finite number > interval_s={self.interval_s} (seconds)"
            )
        threshold = self.rpc_failure_threshold
        if isinstance(threshold, bool) or not isinstance(threshold, int):
            raise HeartbeatConfigError(
                "rpc_failure_threshold", threshold, "an integer >= 1, or -1 to disable"
            )
        if threshold < 1 and threshold != RPC_FAILURE_DETECTION_DISABLED:
            raise HeartbeatConfigError(
                "rpc_failure_threshold", threshold, "an integer >= 1, or -1 to disable"
            )
        if self.phi is not None and not isinstance(self.phi, PhiSettings):
            raise HeartbeatConfigError("phi", self.phi, "a PhiSettings or None")

    def create_heartbeat_manager(
        self,
        own_id: str,
        listener: HeartbeatListener[I, O],
        scheduler: Scheduler,
        clock: Clock = SYSTEM_CLOCK,
    ) -> HeartbeatManager[I, O]:
        """A receiver: answers requests and notices when its senders fall silent."""
        return HeartbeatManager(
            own_id, listener, clock, scheduler, self.timeout_s, self.rpc_failure_threshold, phi=self.phi
        )

    def create_heartbeat_manager_sender(
        self,
        own_id: str,
        listener: HeartbeatListener[I, O],
        scheduler: Scheduler,
        clock: Clock = SYSTEM_CLOCK,
        spread: int = 10,
    ) -> HeartbeatManagerSender[I, O]:
        """A sender: requests a heartbeat from every target each interval."""
        return HeartbeatManagerSender(
            own_id,
            listener,
            clock,
            scheduler,
            self.interval_s,
            self.timeout_s,
            self.rpc_failure_threshold,
            spread,
            phi=self.phi,
        )
