"""Typed RM events and the bus that delivers them to subscribers.

Subscribers run on one dispatcher thread, never on the RM's serving loop: a slow or failing
subscriber delays other subscribers but not heartbeats. A subscriber that raises is logged and
kept. Lifecycle events are never dropped; heartbeat records are dropped (and counted) if a
subscriber falls ``max_backlog`` records behind, so memory stays bounded.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .payload import Payload

log = logging.getLogger(__name__)


class EventKind(enum.Enum):
    REGISTERED = "REGISTERED"
    REREGISTERED = "REREGISTERED"
    HEARTBEAT_TIMEOUT = "HEARTBEAT_TIMEOUT"
    UNREACHABLE = "UNREACHABLE"
    UNREGISTERED = "UNREGISTERED"


@dataclass(frozen=True)
class ExecutorEvent:
    """A lifecycle change of one executor; ``ts`` is wall-clock epoch seconds."""

    kind: EventKind
    executor_id: str
    host: str
    instance_id: str
    ts: float
    detail: str = ""


@dataclass(frozen=True)
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

_STOP = object()


class EventBus:
    """Fan-out of events to subscribers on a dedicated thread; ``close`` ends delivery for good."""

    def __init__(self, max_backlog: int = 100_000) -> None:
        self._subscribers: list[Subscriber] = []
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._max_backlog = max_backlog
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
        if isinstance(event, HeartbeatRecord) and self._queue.qsize() >= self._max_backlog:
            self.dropped_records += 1
            if self.dropped_records == 1:
                log.warning("event subscribers are falling behind; dropping heartbeat records")
            return
        self._queue.put(event)

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what was published before, then stop; later ``publish`` calls are ignored."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._queue.put(_STOP)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _dispatch(self) -> None:
        while True:
            event = self._queue.get()
            if event is _STOP:
                return
            for callback in self._subscribers:
                try:
                    callback(event)  # type: ignore[arg-type]
                except Exception:
                    log.exception("heartbeat event subscriber %r raised; it stays subscribed", callback)
