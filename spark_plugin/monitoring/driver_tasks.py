"""The driver side of stuck tasks and of explained gaps (issue 17), from the agents' heartbeats.

An agent's payload lists its executor's running tasks (``heartbeat.WorkProgress``, filled by
``monitoring.executor_tasks``). Here each task attempt that turns stuck becomes one ``TASK_STUCK``
event (its label, idle and running time, where it waits), and one that progresses again or ends
becomes ``TASK_RESUMED``; with ``spark.arrowbeat.onStuckTask=kill`` the attempt is also killed
through the driver JVM (``SparkContext.killTaskAttempt``), and Spark runs it again.

A ``REREGISTERED`` event is held until the new registration's first heartbeat (or ``hold_s``):
its payload carries the agent's account of the JVM's last silence (``jvm_gap_*``: its GC and CPU
time across it), so the event's detail says what the gap was: garbage collection, the process
stopped, or unknown. The same payloads give the GC time of every heartbeat interval.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, WorkProgress
from spark_plugin.errors import JvmCommandError
from spark_plugin.monitoring.gaps import explain_gap

log = logging.getLogger("arrowbeat.driver.tasks")

_GONE = (EventKind.UNREGISTERED, EventKind.SPARK_REMOVED, EventKind.SPARK_LOST)
"""After one of these the executor's state goes: its agent left, or Spark let the executor go."""
_AGENT_LOST = (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE)
"""The agent's end without a word; its state goes too when Spark removed the executor before."""
MAX_DEPARTED = 10_000
"""Executors Spark removed that are remembered (so a late word of their agent does not bring
their state back); the RM keeps as many ended registrations (``max_ended``)."""


@dataclass
class _Executor:
    stuck: dict[str, WorkProgress]
    gc_s: float | None = None
    gaps_seen: float = 0.0
    held: list[ExecutorEvent] = field(default_factory=list)
    """``REREGISTERED`` events waiting for a heartbeat of the executor (several when it flapped:
    timed out again before its first heartbeat, as during a burst of long collections)."""
    held_since: float = 0.0


class TaskEvents:
    """Turns heartbeats and lifecycle events into task events and explained re-registrations."""

    def __init__(
        self,
        kill_task: Callable[[int], None] | None = None,
        hold_s: float = 3.0,
        max_departed: int = MAX_DEPARTED,
    ) -> None:
        self._kill_task = kill_task
        self._hold_s = hold_s
        self._executors: dict[str, _Executor] = {}
        self._departed: OrderedDict[str, None] = OrderedDict()
        """Executors Spark removed (ids are never reused), newest last, at most ``max_departed``:
        a heartbeat their agent sent before it ended may bring their state back for a while, and
        the agent's end (a timeout, once its JVM is gone) then drops it for good."""
        self._max_departed = max_departed

    def tracks(self, executor_id: str) -> bool:
        """Whether state of ``executor_id`` is kept (it is live, or its agent may come back):
        what the driver keeps per executor beside this (the last heartbeat's time) follows."""
        return executor_id in self._executors

    def tracked(self) -> int:
        """How many executors have state: bounded by the live ones, however many came and went."""
        return len(self._executors)

    def _of(self, executor_id: str) -> _Executor:
        return self._executors.setdefault(executor_id, _Executor({}))

    def adopt_stuck(self, executor_id: str, tasks: list[tuple[str, str]]) -> None:
        """Task attempts ``(task id, label)`` a previous RM of this application reported stuck
        and not resumed (``history.recovery``): taken as stuck still, so the next heartbeat that
        lists one stuck records (and kills) nothing again, and one that lists it moving, or not
        at all, records its ``TASK_RESUMED``. A restarted RM calls this before it serves."""
        state = self._of(executor_id)
        for task_id, label in tasks:
            state.stuck.setdefault(task_id, WorkProgress(task_id, label, 0.0, 0.0, stuck=True))

    def on_event(self, event: ExecutorEvent, now: float) -> list[ExecutorEvent]:
        """What to record for a lifecycle event: a ``REREGISTERED`` is held (``[]``) until the
        executor's next heartbeat; anything else passes at once (a row keeps its own time), after
        held events that waited too long."""
        out = self.flush(now)
        executor_id = event.executor_id
        if event.kind is EventKind.REREGISTERED:
            holding = self._of(executor_id)
            if not holding.held:
                holding.held_since = now
            holding.held.append(event)
            return out
        if event.kind in (EventKind.SPARK_REMOVED, EventKind.SPARK_LOST):
            self._departed[executor_id] = None
            self._departed.move_to_end(executor_id)
            while len(self._departed) > self._max_departed:
                self._departed.popitem(last=False)
        gone = event.kind in _GONE or (event.kind in _AGENT_LOST and executor_id in self._departed)
        state = self._executors.pop(executor_id, None) if gone else None  # no state made for a word
        if state is not None:  # gone for good: dynamic allocation adds new ids
            out += [
                _with_detail(h, "gap not explained: the executor left before a heartbeat") for h in state.held
            ]
            out += self._ended(state, event, f"its executor is gone ({event.kind.name})")
        out.append(event)
        return out

    def close(self) -> list[ExecutorEvent]:
        """Every held event, as it is (the application is stopping)."""
        return self.flush(float("inf"))

    def on_heartbeat(self, record: HeartbeatRecord, now: float) -> tuple[list[ExecutorEvent], float | None]:
        """Events a heartbeat brings (held ``REREGISTERED`` events explained, stuck and resumed
        tasks) and the GC seconds of the interval it closes (None if unknown)."""
        out = self.flush(now, keep=record.executor_id)
        state = self._of(record.executor_id)
        metrics = record.payload.metrics
        out += self._explained(state.held, metrics, state.gaps_seen)
        state.held = []
        state.gaps_seen = metrics.get("jvm_gaps", state.gaps_seen)
        gc_now = metrics.get("jvm_gc_s")
        gc_s = None if gc_now is None or state.gc_s is None else max(0.0, gc_now - state.gc_s)
        state.gc_s = gc_now
        out += self._tasks(record, state)
        return out, gc_s

    def flush(self, now: float, keep: str = "") -> list[ExecutorEvent]:
        """Held ``REREGISTERED`` events older than ``hold_s`` (no heartbeat came), as they are;
        not ``keep``'s, whose heartbeat is at hand."""
        out = []
        for executor_id, state in self._executors.items():
            if state.held and executor_id != keep and now - state.held_since >= self._hold_s:
                out += [_with_detail(h, "gap not explained: no heartbeat followed") for h in state.held]
                state.held = []
        return out

    def _explained(
        self, held: list[ExecutorEvent], metrics: dict[str, float], gaps_seen: float
    ) -> list[ExecutorEvent]:
        """The held re-registrations with what the agent says of the JVM's pauses since its last
        heartbeat. It reports its last pause only: with one pause, that explains every held event
        (an executor may time out twice in one long collection); with several, only the newest
        event is explained by it, the others say how many pauses there were."""
        pauses = int(metrics.get("jvm_gaps", 0.0) - gaps_seen)
        if pauses <= 0 or "jvm_gap_s" not in metrics:
            why = "gap: no pause of the executor JVM seen by its agent (the agent, its host or the network)"
            return [_with_detail(h, why) for h in held]
        cause = explain_gap(
            metrics["jvm_gap_s"], metrics.get("jvm_gap_gc_s", 0.0), metrics.get("jvm_gap_cpu_s", -1.0)
        )
        if pauses == 1:
            return [_with_detail(h, f"gap: {cause}") for h in held]
        earlier = f"gap: one of {pauses} JVM pauses before the next heartbeat (the last: {cause})"
        return [_with_detail(h, earlier) for h in held[:-1]] + [_with_detail(held[-1], f"gap: {cause}")]

    def _tasks(self, record: HeartbeatRecord, state: _Executor) -> list[ExecutorEvent]:
        out = []
        running = {w.id: w for w in record.payload.work}
        for work in record.payload.work:
            if work.stuck and work.id not in state.stuck:
                state.stuck[work.id] = work
                out.append(self._event(EventKind.TASK_STUCK, record, _stuck_detail(work)))
                self._kill(work)
            elif not work.stuck and work.id in state.stuck:
                was = state.stuck.pop(work.id)
                out.append(
                    self._event(
                        EventKind.TASK_RESUMED,
                        record,
                        f"{was.label}: progressing again ({work.idle_s:.1f}s idle)",
                    )
                )
        for task_id in [t for t in state.stuck if t not in running]:
            was = state.stuck.pop(task_id)
            out.append(
                self._event(
                    EventKind.TASK_RESUMED, record, f"{was.label}: ended (finished, failed or killed)"
                )
            )
        return out

    def _ended(self, state: _Executor, event: ExecutorEvent, why: str) -> list[ExecutorEvent]:
        out = [
            ExecutorEvent(
                EventKind.TASK_RESUMED,
                event.executor_id,
                event.host,
                event.instance_id,
                event.ts,
                f"{w.label}: {why}",
            )
            for w in state.stuck.values()
        ]
        state.stuck.clear()
        state.gc_s = None
        return out

    def _kill(self, work: WorkProgress) -> None:
        if self._kill_task is None:
            return
        try:
            self._kill_task(int(work.id))
            log.warning("asked Spark to kill stuck %s", work.label)
        except (ValueError, JvmCommandError) as exc:  # one per stuck task: bounded
            log.warning("not asking Spark to kill stuck %s: %s", work.label, exc)

    @staticmethod
    def _event(kind: EventKind, record: HeartbeatRecord, detail: str) -> ExecutorEvent:
        return ExecutorEvent(kind, record.executor_id, record.host, record.instance_id, record.ts, detail)


def _stuck_detail(work: WorkProgress) -> str:
    return f"{work.label}: no progress for {work.idle_s:.1f}s ({work.running_s:.1f}s running); {work.where}"


def _with_detail(event: ExecutorEvent, extra: str) -> ExecutorEvent:
    return replace(event, detail=f"{event.detail}; {extra}" if event.detail else extra)
