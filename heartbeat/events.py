"""Typed RM events and the bus that delivers them to subscribers.

Subscribers run on one dispatcher thread, never on the RM's serving loop: a slow or failing
subscriber delays other subscribers but not heartbeats. Delivery is batched (see ``EventBus``).
A subscriber that raises is logged and kept. Lifecycle events are never dropped; heartbeat
records are dropped (and counted) if subscribers fall ``max_backlog`` records behind, so memory
stays bounded.
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from heartbeat.payload import Payload

log = logging.getLogger(__name__)


class EventKind(enum.Enum):
    """What happened to an executor. The first five are the agent's own protocol; the next three
    are the cluster manager's view (Spark's, told by the driver plugin), so a reader can tell an
    executor Spark let go on purpose from one that crashed, and one that never had an agent; then
    what its payloads tell (its tasks, its shuffle's damaged outputs), how it compares with its
    peers (slower: degraded, then recovered) and the RM's own gaps."""

    REGISTERED = "REGISTERED"
    REREGISTERED = "REREGISTERED"
    HEARTBEAT_TIMEOUT = "HEARTBEAT_TIMEOUT"
    UNREACHABLE = "UNREACHABLE"
    UNREGISTERED = "UNREGISTERED"
    SPARK_REMOVED = "SPARK_REMOVED"
    """Spark removed the executor on purpose (idle under dynamic allocation, decommissioned,
    replaced at arrowbeat's request, the application stopping); the detail says which."""
    SPARK_LOST = "SPARK_LOST"
    """Spark lost the executor (its process exited or crashed, its host or connection was lost)."""
    UNMONITORED = "UNMONITORED"
    """Spark runs the executor but no agent registered for it in time (its agent did not start)."""
    TASK_STUCK = "TASK_STUCK"
    """A unit of work on the executor (a task attempt) made no progress for the stuck timeout;
    the detail names it and where it waits (``WorkProgress`` in the payload)."""
    TASK_RESUMED = "TASK_RESUMED"
    """A stuck unit of work progressed again or ended; the detail says which."""
    SHUFFLE_CORRUPT = "SHUFFLE_CORRUPT"
    """The executor's agent found a map output of its own damaged (a checksum mismatch, a truncated
    or undecodable file) and arranged its recompute; the detail names the shuffle, the map
    partition, the file and what Spark does about it. Told by the agent as a ``Notice`` in its
    payloads (``payload.NOTICE_KINDS``), recorded once by the driver side."""
    DEGRADED = "DEGRADED"
    """The executor is alive but consistently slower than its peers (a gray failure: a starved,
    throttled or stopped-and-continued JVM); the detail gives the evidence: which signal, how far
    from the peers, since when. Judged on the driver side from the heartbeats of all executors."""
    RECOVERED = "RECOVERED"
    """A ``DEGRADED`` executor is back in line with its peers; the detail says for how long."""
    MONITORING_GAP = "MONITORING_GAP"
    """Not about one executor: the RM itself was down (dead or hung, then restarted) and nothing
    was recorded between the event's ``ts`` and the end its detail gives; an interval without
    history is a hole, never health. Written by the restarted RM's host process."""


@dataclass(frozen=True, slots=True)
class ExecutorEvent:
    """A lifecycle change of one executor; ``ts`` is wall-clock epoch seconds."""

    kind: EventKind
    executor_id: str
    host: str
    instance_id: str
    ts: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """One answered heartbeat; ``rtt_ms`` is answer time minus request time on the RM's clock."""

    executor_id: str
    host: str
    instance_id: str
    ts: float
    rtt_ms: float
    payload: Payload


Event = ExecutorEvent | HeartbeatRecord
Subscriber = Callable[[Event], None]


class EventBus:
    """Fan-out of events to subscribers on a dedicated thread; ``close`` ends delivery for good.

    Publishing only appends to a deque and wakes the dispatcher if it is idle; the dispatcher
    then lingers ``batch_s`` before the next drain, so thousands of heartbeats per second cost
    at most ~1/batch_s thread wake-ups instead of one each (a wake-up is a GIL hand-off that
    would otherwise add latency to the RM's serving loop).
    """

    def __init__(self, max_backlog: int = 100_000, batch_s: float = 0.01) -> None:
        self._subscribers: list[Subscriber] = []
        self._pending: collections.deque[Event] = collections.deque()
        self._wake = threading.Event()
        self._signalled = False
        self._max_backlog = max_backlog
        self._batch_s = batch_s
        self._lock = threading.Lock()
        self._closed = False
        self.dropped_records = 0
        self._thread = threading.Thread(target=self._dispatch, name="heartbeat-events", daemon=True)
        self._thread.start()

    def subscribe(self, callback: Subscriber) -> None:
        with self._lock:
            self._subscribers = [*self._subscribers, callback]

    def publish(self, event: Event) -> None:
        if self._closed:
            return
        if isinstance(event, HeartbeatRecord) and len(self._pending) >= self._max_backlog:
            self.dropped_records += 1
            if self.dropped_records == 1:
                log.warning("event subscribers are falling behind; dropping heartbeat records")
            return
        self._pending.append(event)
        if not self._signalled:
            self._signalled = True
            self._wake.set()

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what was published before, then stop; later ``publish`` calls are ignored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _dispatch(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            self._signalled = False
            while self._pending:
                event = self._pending.popleft()
                for callback in self._subscribers:
                    try:
                        callback(event)
                    except Exception:
                        log.exception("heartbeat event subscriber %r raised; it stays subscribed", callback)
            if self._closed and not self._pending:
                return
            time.sleep(self._batch_s)
