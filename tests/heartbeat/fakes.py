"""Fakes over mocks: a recording listener, targets and links that keep what they were sent, a
subscriber that collects the RM's events and lets a test wait for one, and a real RM serving on
loopback with such a subscriber (the fixtures' common body). The subscriber, ``Collector``, is
the harness's (``harness.heartbeat_processes``): the RM child processes' events land in one too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.heartbeat_processes import Collector as Collector  # re-exported: the tests' subscriber
from heartbeat.errors import HeartbeatRpcError
from heartbeat.events import Event, EventKind, ExecutorEvent, HeartbeatRecord
from heartbeat.payload import Payload
from heartbeat.rm.resource_manager import ResourceManagerCore
from heartbeat.rm.server import ResourceManagerServer
from heartbeat.scheduler import ManualScheduler
from heartbeat.services import HeartbeatServices


@dataclass
class RecordingListener:
    """A ``HeartbeatListener`` that records every callback; ``payload`` is what it hands out."""

    payload: object = "answer"
    timeouts: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    reported: list[tuple[str, object]] = field(default_factory=list)

    def notify_heartbeat_timeout(self, target_id: str) -> None:
        self.timeouts.append(target_id)

    def notify_target_unreachable(self, target_id: str) -> None:
        self.unreachable.append(target_id)

    def report_payload(self, target_id: str, payload: object) -> None:
        self.reported.append((target_id, payload))

    def retrieve_payload(self, target_id: str) -> object:
        return self.payload


@dataclass
class RecordingTarget:
    """A ``HeartbeatTarget`` that records calls and can be told to fail like a dead peer."""

    fail: bool = False
    requests: list[tuple[str, object]] = field(default_factory=list)
    answers: list[tuple[str, object]] = field(default_factory=list)

    def receive_heartbeat(self, heartbeat_origin: str, payload: object) -> None:
        if self.fail:
            raise HeartbeatRpcError("peer gone")
        self.answers.append((heartbeat_origin, payload))

    def request_heartbeat(self, request_origin: str, payload: object) -> None:
        if self.fail:
            raise HeartbeatRpcError("peer gone")
        self.requests.append((request_origin, payload))


@dataclass
class FakeLink:
    """An ``AgentLink``: keeps requests; ``broken`` makes sends fail."""

    broken: bool = False
    sent: list[tuple[str, str, int]] = field(default_factory=list)
    closed: tuple[str, str] | None = None
    kill_asked: list[tuple[str, str, str]] = field(default_factory=list)

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        if self.broken or self.closed is not None:
            raise HeartbeatRpcError("stream closed")
        self.sent.append((epoch, instance_id, seq))

    def close(self, status: str, detail: str) -> None:
        self.closed = (status, detail)

    def ask_kill_host(self, epoch: str, instance_id: str, reason: str) -> None:
        self.kill_asked.append((epoch, instance_id, reason))


@dataclass
class EventList:
    """An ``EventSink`` that keeps events in order, synchronously."""

    events: list[Event] = field(default_factory=list)

    def publish(self, event: Event) -> None:
        self.events.append(event)

    def kinds(self) -> list[tuple[EventKind, str]]:
        return [(e.kind, e.executor_id) for e in self.events if isinstance(e, ExecutorEvent)]

    def records(self) -> list[HeartbeatRecord]:
        return [e for e in self.events if isinstance(e, HeartbeatRecord)]


@dataclass
class FakeRmLink:
    """An ``RmLink``: keeps the agent's answers and why the session ended; ``broken`` fails sends."""

    broken: bool = False
    answers: list[tuple[str, str, int, Payload]] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)

    def send_heartbeat(self, epoch: str, instance_id: str, seq: int, payload: Payload) -> None:
        if self.broken:
            raise HeartbeatRpcError("stream closed")
        self.answers.append((epoch, instance_id, seq, payload))

    def end(self, reason: str) -> None:
        self.ended.append(reason)


ServedRm = tuple[ResourceManagerServer, str, Collector]
"""A serving RM, its address and the collector of its events."""


@contextlib.contextmanager
def served_rm(
    services: HeartbeatServices, secret: str, grace_s: float = 0.2, **server_args: Any
) -> Iterator[ServedRm]:
    """A real RM on loopback with a :class:`Collector` subscribed, stopped (``grace_s``) on exit."""
    server = ResourceManagerServer(services, secret, **server_args)
    collector = Collector()
    server.subscribe(collector)
    address = server.start()
    try:
        yield server, address, collector
    finally:
        server.stop(grace_s=grace_s)


class ManualRm:
    """An RM core whose time moves only through its ``ManualScheduler``, its events in a list
    (one spread, three ended registrations kept: small enough for a test to see everything)."""

    def __init__(self, services: HeartbeatServices) -> None:
        self.scheduler = ManualScheduler()
        self.events = EventList()
        self.core = ResourceManagerCore(
            services, self.scheduler.clock, self.scheduler, self.events, spread=1, max_ended=3
        )
        self.core.start()
