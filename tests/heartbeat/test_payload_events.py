"""Payload providers, the wire form of payloads, and the event bus."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from heartbeat import (
    EventKind,
    ExecutorEvent,
    ManualClock,
    Payload,
    pulse_file_provider,
    slots_provider,
    static_provider,
)
from heartbeat.events import EventBus
from heartbeat.payload import collect_payload
from heartbeat.wire.codec import payload_from_proto, payload_to_proto


def test_providers_merge_into_typed_fields_and_metrics() -> None:
    def broken() -> dict[str, float]:
        raise RuntimeError("metrics backend down")

    failed: set[int] = set()
    payload = collect_payload(
        [slots_provider(4, lambda: 3), broken, static_provider({"shuffle.pool.used": 12.5, "rss_bytes": 99})],
        failed,
    )
    assert payload == Payload(
        slots_total=4, slots_busy=3, running_tasks=3, rss_bytes=99, metrics={"shuffle.pool.used": 12.5}
    )
    assert failed == {1}


def test_pulse_age_from_file_mtime(tmp_path: Path) -> None:
    pulse = tmp_path / "pulse"
    clock = ManualClock(start=0.0, wall_start=1000.0)
    provider = pulse_file_provider(str(pulse), clock)
    assert provider() == {"jvm_pulse_age_ms": None}
    pulse.touch()
    os.utime(pulse, (997.5, 997.5))
    assert provider() == {"jvm_pulse_age_ms": 2500}
    clock.jump(1.5)
    assert provider() == {"jvm_pulse_age_ms": 4000}, "a file age is read on the clock's wall time"


def test_payload_wire_round_trip_keeps_unknowns_unknown() -> None:
    payload = Payload(slots_total=2, jvm_pulse_age_ms=0, metrics={"a": 1.5})
    assert payload_from_proto(payload_to_proto(payload)) == payload
    assert payload_to_proto(Payload()).rss_bytes == -1


def test_a_raising_subscriber_does_not_break_delivery_and_close_is_final() -> None:
    bus = EventBus()
    got: list[object] = []
    done = threading.Event()

    def bad(event: object) -> None:
        raise RuntimeError("subscriber bug")

    def good(event: object) -> None:
        got.append(event)
        if len(got) == 2:
            done.set()

    bus.subscribe(bad)
    bus.subscribe(good)
    first = ExecutorEvent(EventKind.REGISTERED, "1", "h", "i", 0.0)
    second = ExecutorEvent(EventKind.UNREGISTERED, "1", "h", "i", 1.0)
    bus.publish(first)
    bus.publish(second)
    bus.close()
    bus.publish(ExecutorEvent(EventKind.REGISTERED, "2", "h", "j", 2.0))
    assert done.is_set()
    assert got == [first, second]
