"""Fakes over mocks: a recording listener, targets and links that keep what they were sent."""

from __future__ import annotations

from dataclasses import dataclass, field

from heartbeat.errors import HeartbeatRpcError
from heartbeat.events import Event, EventKind, ExecutorEvent, HeartbeatRecord


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

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        if self.broken or self.closed is not None:
            raise HeartbeatRpcError("stream closed")
        self.sent.append((epoch, instance_id, seq))

    def close(self, status: str, detail: str) -> None:
        self.closed = (status, detail)


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
