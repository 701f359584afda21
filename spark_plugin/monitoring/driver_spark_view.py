"""Spark's own view of the executors, as the JVM DriverPlugin's SparkListener forwards it.

The agents say what they know of themselves; Spark knows what it started and why it let an
executor go. The DriverPlugin (``launcher/.../ArrowBeatDriverPlugin.java``) writes one line per
Spark event on the driver-side process's stdin (``spark_plugin.jvm.sidecar.JvmLink``; the grammar
is ``spark_plugin.jvm.protocol.parse_executor_line``):

* ``executor-added <id> <host>``: Spark registered the executor (``onExecutorAdded``);
* ``executor-removed <id> <facts> <reason>``: Spark removed it (``onExecutorRemoved``); ``facts``
  is what the JVM saw beyond Spark's text: ``replaced`` (arrowbeat had asked Spark to kill and
  replace it), ``app-end`` (the application had begun to stop), both, or ``spark`` for neither;
  :func:`removal_cause` makes one cause of them. ``reason`` is Spark's free text, escaped by the
  JVM and cut; it is passed through :func:`wire_text` all the same;
* ``executor-unmonitored <id> <reason>``: the executor's plugin told the driver its agent did not
  start (``reason`` one ``[a-z-]`` token);
* ``executor-agent-down <id> <pid> <restart in ms> <cause>``: the executor's plugin saw its agent
  process exit (or a restart of it fail) and restarts it (:func:`agent_down_detail` words it);
* ``executor-outputs-lost`` and ``executor-replacement``: an executor's map outputs are lost, and
  what became of a replacement; ``monitoring.driver_lost_outputs`` decides on those.

:func:`classify` reads Spark's reason: Spark 4.0 posts ``Executor killed by driver.`` for an
executor the driver killed without counting a failure (dynamic allocation's idle removal, or the
application's own ``killExecutors``), ``Executor decommission: ...`` for a decommissioned one,
and otherwise the loss as the scheduler backend saw it (an exit code, ``Remote RPC client
disassociated...``, ``Executor heartbeat timed out after N ms``, ``Worker lost``). It posts no
listener event of its own for decommissioning; the reason text is where it shows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from heartbeat import EventKind
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.jvm import protocol
from spark_plugin.jvm.protocol import (
    AgentDown,
    AgentNotStarted,
    ExecutorAdded,
    OutputsLost,
    ReplacementOutcome,
)
from spark_plugin.monitoring.driver_lost_outputs import LostOutputs

log = logging.getLogger("arrowbeat.spark_view")

CAUSES = frozenset({"spark", "replaced", "app-end"})
KILLED_BY_DRIVER = "Executor killed by driver."
DECOMMISSION = "Executor decommission"


@dataclass(frozen=True)
class ExecutorRemoved:
    """A removal with one cause (:data:`CAUSES`) and Spark's reason, made safe to log."""

    executor_id: str
    cause: str
    reason: str


SparkEvent = ExecutorAdded | ExecutorRemoved | AgentNotStarted | AgentDown | OutputsLost | ReplacementOutcome


def removal_cause(facts: frozenset[str]) -> str:
    """The one cause of a removal: ``app-end`` first (during the application's stop, even an
    executor arrowbeat asked to replace goes because the application ends), then ``replaced``,
    else ``spark`` (Spark's reason is all there is)."""
    if "app-end" in facts:
        return "app-end"
    return "replaced" if "replaced" in facts else "spark"


def parse_line(line: str) -> SparkEvent | None:
    """The event on ``line``, or None for anything not exactly of the grammar above."""
    event = protocol.parse_executor_line(line)
    if isinstance(event, protocol.ExecutorRemoved):
        return ExecutorRemoved(event.executor_id, removal_cause(event.facts), wire_text(event.reason))
    return event


def agent_down_detail(down: AgentDown) -> str:
    """The UNMONITORED detail of an agent the JVM saw exit: its cause, then what the JVM does."""
    if down.restart_in_ms == 0:
        then = "restarting it"
    else:
        then = f"restarting it in {down.restart_in_ms / 1000:.3g} s (restarts are rate-limited)"
    return f"{wire_text(down.cause)}; {then}"


def classify(removed: ExecutorRemoved, dynamic_allocation: bool) -> tuple[EventKind, str]:
    """The event kind and detail for a removal: ``SPARK_REMOVED`` when Spark let the executor go
    on purpose, ``SPARK_LOST`` when it lost it; the detail names which, then Spark's reason."""
    reason = removed.reason or "(Spark gave no reason)"
    if removed.cause == "replaced":
        return EventKind.SPARK_REMOVED, f"replaced by Spark at arrowbeat's request: {reason}"
    if removed.cause == "app-end":
        return EventKind.SPARK_REMOVED, f"removed by Spark (the application is stopping): {reason}"
    if reason.startswith(KILLED_BY_DRIVER):
        why = "idle, dynamic allocation" if dynamic_allocation else "killed by the driver"
        return EventKind.SPARK_REMOVED, f"removed by Spark ({why}): {reason}"
    if reason.startswith(DECOMMISSION):
        return EventKind.SPARK_REMOVED, f"removed by Spark (decommissioned): {reason}"
    lowered = reason.lower()
    if "heartbeat timed out" in lowered:
        return EventKind.SPARK_LOST, f"lost (no heartbeat reached Spark): {reason}"
    if "worker lost" in lowered or "agent lost" in lowered:
        return EventKind.SPARK_LOST, f"lost (its host's Worker was lost): {reason}"
    return EventKind.SPARK_LOST, f"lost (crash): {reason}"


class ClusterView(Protocol):
    """What the Spark view drives (``heartbeat.ResourceManagerServer``)."""

    def executor_started(self, executor_id: str, host: str, within_s: float) -> None: ...

    def agent_not_started(self, executor_id: str, reason: str) -> None: ...

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None: ...

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None: ...


class SparkView:
    """Applies Spark's events to the RM: an added executor is expected to get an agent within
    ``register_within_s`` (else it is UNMONITORED); a removal is recorded as classified. Lost map
    outputs and replacement outcomes go to ``lost_outputs`` (dropped without one)."""

    def __init__(
        self,
        rm: ClusterView,
        register_within_s: float,
        dynamic_allocation: bool,
        lost_outputs: LostOutputs | None = None,
    ) -> None:
        self._rm = rm
        self._within_s = register_within_s
        self._dynamic_allocation = dynamic_allocation
        self._lost_outputs = lost_outputs
        self._refused = 0

    def __call__(self, line: str) -> None:
        event = parse_line(line)
        if isinstance(event, ExecutorAdded):
            self._rm.executor_started(event.executor_id, event.host, self._within_s)
        elif isinstance(event, ExecutorRemoved):
            kind, detail = classify(event, self._dynamic_allocation)
            self._rm.executor_removed(event.executor_id, kind, detail)
            if self._lost_outputs is not None:
                self._lost_outputs.forget(event.executor_id)
        elif isinstance(event, AgentNotStarted):
            self._rm.agent_not_started(event.executor_id, event.reason)
        elif isinstance(event, AgentDown):
            self._rm.agent_down(event.executor_id, event.pid, agent_down_detail(event))
        elif isinstance(event, OutputsLost):
            if self._lost_outputs is not None:
                self._lost_outputs.on_lost(event)
        elif isinstance(event, ReplacementOutcome):
            if self._lost_outputs is not None:
                self._lost_outputs.on_outcome(event)
        else:
            self._refused += 1
            if self._refused == 1 or self._refused % 100 == 0:  # the JVM is ours: a bug, not a flood
                log.warning(
                    "ignored a malformed Spark-view line from the JVM (%d so far): %s",
                    self._refused,
                    wire_text(line, MAX_ID_CHARS),
                )


__all__ = [
    "AgentDown",
    "AgentNotStarted",
    "ExecutorAdded",
    "ExecutorRemoved",
    "SparkView",
    "agent_down_detail",
    "classify",
    "parse_line",
    "removal_cause",
]
