"""``HeartbeatServices``: validated heartbeat settings and the factory for managers.

Every setting is declared once in ``CONFIG_KEYS`` (name, type, default, unit, doc) so the Spark
wiring and the README table read the same source. Validation follows Flink:
``0 < interval < timeout``; the RPC-failure threshold is >= 1, or -1 to disable that signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from .clock import Clock, SystemClock
from .errors import HeartbeatConfigError
from .listener import HeartbeatListener
from .manager import HeartbeatManager
from .monitor import RPC_FAILURE_DETECTION_DISABLED
from .scheduler import Scheduler
from .sender import HeartbeatManagerSender

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741

CONF_PREFIX = "spark.arrowbeat.heartbeat."


@dataclass(frozen=True)
class ConfigKey:
    name: str
    type: type
    default: float | int
    unit: str
    doc: str


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("interval", float, 1.0, "s", "How often the RM requests a heartbeat from each executor agent."),
    ConfigKey(
        "timeout",
        float,
        5.0,
        "s",
        "Silence after which a peer counts as lost (RM: no answer; agent: no request). Must exceed interval.",
    ),
    ConfigKey(
        "rpcFailureThreshold",
        int,
        2,
        "count",
        "Consecutive failed heartbeat RPCs (e.g. on a broken stream) that mark an executor UNREACHABLE; "
        "-1 disables.",
    ),
)


@dataclass(frozen=True)
class HeartbeatServices:
    """Heartbeat interval, timeout and RPC-failure threshold; validated on construction."""

    interval_s: float = 1.0
    timeout_s: float = 5.0
    rpc_failure_threshold: int = 2

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise HeartbeatConfigError("interval_s", self.interval_s, "a finite number > 0 (seconds)")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > self.interval_s):
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

    @classmethod
    def from_conf(cls, conf: Mapping[str, str], prefix: str = CONF_PREFIX) -> HeartbeatServices:
        """Parse ``spark.arrowbeat.heartbeat.*`` string settings; missing keys take their defaults."""
        values: dict[str, float | int] = {}
        for key in CONFIG_KEYS:
            raw = conf.get(prefix + key.name)
            if raw is None:
                values[key.name] = key.default
                continue
            try:
                values[key.name] = key.type(raw)
            except ValueError:
                raise HeartbeatConfigError(
                    prefix + key.name, raw, f"a {key.type.__name__} in {key.unit}"
                ) from None
        return cls(float(values["interval"]), float(values["timeout"]), int(values["rpcFailureThreshold"]))

    def create_heartbeat_manager(
        self, own_id: str, listener: HeartbeatListener[I, O], scheduler: Scheduler, clock: Clock | None = None
    ) -> HeartbeatManager[I, O]:
        """A receiver: answers requests and notices when its senders fall silent."""
        return HeartbeatManager(
            own_id, listener, clock or SystemClock(), scheduler, self.timeout_s, self.rpc_failure_threshold
        )

    def create_heartbeat_manager_sender(
        self,
        own_id: str,
        listener: HeartbeatListener[I, O],
        scheduler: Scheduler,
        clock: Clock | None = None,
        spread: int = 10,
    ) -> HeartbeatManagerSender[I, O]:
        """A sender: requests a heartbeat from every target each interval."""
        return HeartbeatManagerSender(
            own_id,
            listener,
            clock or SystemClock(),
            scheduler,
            self.interval_s,
            self.timeout_s,
            self.rpc_failure_threshold,
            spread,
        )
