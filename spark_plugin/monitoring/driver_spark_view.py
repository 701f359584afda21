"""Spark's own view of the executors, as the JVM DriverPlugin's SparkListener forwards it.

The agents say what they know of themselves; Spark knows what it started and why it let an
executor go. The DriverPlugin (``launcher/.../ArrowBeatDriverPlugin.java``) writes one line per
Spark event on the driver-side process's stdin (``spark_plugin.jvm.sidecar.JvmLink``), printable
ASCII, at most :data:`MAX_LINE_CHARS`:

* ``executor-added <id> <host>``: Spark registered the executor (``onExecutorAdded``);
* ``executor-removed <id> <cause> <reason>``: Spark removed it (``onExecutorRemoved``); ``cause``
  is what the JVM knows beyond Spark's text: ``spark`` (nothing more), ``replaced`` (arrowbeat
  asked Spark to kill and replace it), ``app-end`` (after the application began to stop);
  ``reason`` is Spark's free text, escaped by the JVM and cut; it is passed through
  :func:`wire_text` all the same;
* ``executor-unmonitored <id> <reason>``: the executor's plugin told the driver its agent did not
  start (``reason`` one ``[a-z-]`` token).

:func:`classify` reads Spark's reason: Spark 4.0 posts ``Executor killed by driver.`` for an
executor the driver killed without counting a failure (dynamic allocation's idle removal, or the
application's own ``killExecutors``), ``Executor decommission: ...`` for a decommissioned one,
and otherwise the loss as the scheduler backend saw it (an exit code, ``Remote RPC client
disassociated...``, ``Executor heartbeat timed out after N ms``, ``Worker lost``). It posts no
listener event of its own for decommissioning; the reason text is where it shows.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Protocol

from heartbeat import EventKind
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.jvm.sidecar import EXECUTOR_ID, LOST_REASON

log = logging.getLogger("arrowbeat.spark_view")

MAX_LINE_CHARS = 1024
"""A longer line is not the JVM's (it cuts Spark's reason to 400 characters) and is ignored."""
ADDED, REMOVED, UNMONITORED = "executor-added", "executor-removed", "executor-unmonitored"
CAUSES = frozenset({"spark", "replaced", "app-end"})
_HOST = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,253}")
KILLED_BY_DRIVER = "Executor killed by driver."
DECOMMISSION = "Executor decommission"


@dataclass(frozen=True)
class ExecutorAdded:
    executor_id: str
    host: str


@dataclass(frozen=True)
class ExecutorRemoved:
    executor_id: str
    cause: str
    reason: str


@dataclass(frozen=True)
class AgentNotStarted:
    executor_id: str
    reason: str


SparkEvent = ExecutorAdded | ExecutorRemoved | AgentNotStarted


def parse_line(line: str) -> SparkEvent | None:
    """The event on ``line``, or None for anything not exactly of the grammar above."""
    if len(line) > MAX_LINE_CHARS:
        return None
    verb, _, rest = line.partition(" ")
    if verb == ADDED:
        words = rest.split(" ")
        if len(words) == 2 and _is_executor(words[0]) and _HOST.fullmatch(words[1]):
            return ExecutorAdded(words[0], words[1])
    elif verb == REMOVED:
        words = rest.split(" ", 2)
        if len(words) >= 2 and _is_executor(words[0]) and words[1] in CAUSES:
            return ExecutorRemoved(words[0], words[1], wire_text(words[2] if len(words) == 3 else ""))
    elif verb == UNMONITORED:
        words = rest.split(" ")
        if len(words) == 2 and _is_executor(words[0]) and LOST_REASON.fullmatch(words[1]):
            return AgentNotStarted(words[0], words[1])
    return None


def _is_executor(text: str) -> bool:
    return bool(EXECUTOR_ID.fullmatch(text))


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

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None: ...


class SparkView:
    """Applies Spark's events to the RM: an added executor is expected to get an agent within
    ``register_within_s`` (else it is UNMONITORED); a removal is recorded as classified."""

    def __init__(self, rm: ClusterView, register_within_s: float, dynamic_allocation: bool) -> None:
        self._rm = rm
        self._within_s = register_within_s
        self._dynamic_allocation = dynamic_allocation
        self._refused = 0

    def __call__(self, line: str) -> None:
        event = parse_line(line)
        if isinstance(event, ExecutorAdded):
            self._rm.executor_started(event.executor_id, event.host, self._within_s)
        elif isinstance(event, ExecutorRemoved):
            kind, detail = classify(event, self._dynamic_allocation)
            self._rm.executor_removed(event.executor_id, kind, detail)
        elif isinstance(event, AgentNotStarted):
            self._rm.agent_not_started(event.executor_id, event.reason)
        else:
            self._refused += 1
            if self._refused == 1 or self._refused % 100 == 0:  # the JVM is ours: a bug, not a flood
                log.warning(
                    "ignored a malformed Spark-view line from the JVM (%d so far): %s",
                    self._refused,
                    wire_text(line, MAX_ID_CHARS),
                )


__all__ = [
    "AgentNotStarted",
    "ExecutorAdded",
    "ExecutorRemoved",
    "SparkView",
    "classify",
    "parse_line",
]
