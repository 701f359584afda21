"""Shared fixtures: an RM on 127.0.0.1 with fast heartbeats, and an event collector."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, HeartbeatServices, ResourceManagerServer

FAST = HeartbeatServices(interval_s=0.1, timeout_s=0.5, rpc_failure_threshold=2)
SECRET = "test-secret"


class Collector:
    """Subscriber that keeps events and lets tests wait on a condition with a deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[ExecutorEvent] = []
        self.records: list[HeartbeatRecord] = []

    def __call__(self, event: ExecutorEvent | HeartbeatRecord) -> None:
        with self._cond:
            if isinstance(event, HeartbeatRecord):
                self.records.append(event)
            else:
                self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def find(self, kind: EventKind, executor_id: str) -> list[ExecutorEvent]:
        with self._cond:
            return [e for e in self.events if e.kind is kind and e.executor_id == executor_id]

    def wait_event(
        self, kind: EventKind, executor_id: str, timeout_s: float, count: int = 1
    ) -> ExecutorEvent:
        deadline = time.monotonic() + timeout_s
        ok = self.wait_for(
            lambda: len(self.find(kind, executor_id)) >= count, max(0.0, deadline - time.monotonic())
        )
        assert ok, f"no {kind.value} #{count} for {executor_id} within {timeout_s} s; saw {self.events}"
        return self.find(kind, executor_id)[count - 1]


@pytest.fixture
def rm() -> Iterator[tuple[ResourceManagerServer, str, Collector]]:
    server = ResourceManagerServer(FAST, secret=SECRET)
    collector = Collector()
    server.subscribe(collector)
    address = server.start()
    try:
        yield server, address, collector
    finally:
        server.stop(grace_s=0.2)
