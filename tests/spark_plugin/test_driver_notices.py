"""Agents' notices become executor events on the driver side, each once (``driver_notices``), from
the agent's board through the wire to the ``executor_events`` rows the driver's router writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, ManualClock, Notice, NoticeBoard, Payload
from heartbeat.payload import collect_payload
from heartbeat.wire.codec import payload_from_proto, payload_to_proto
from heartbeat.wire.proto import heartbeat_pb2 as pb
from spark_plugin.history import EXECUTOR_EVENTS, event_row
from spark_plugin.jvm.plugin_metrics import LivenessTally
from spark_plugin.monitoring.driver_notices import NoticeEvents
from spark_plugin.processes.driver import DERIVED_KINDS, EventRouter

DETAIL = (
    "shuffle 3, map partition 5, executor 1, file /tmp/x/m5-2.42.0-0a1b2c3d.arrows: checksum mismatch "
    "in segment 2; Spark recomputes map partition 5"
)


def heartbeat(
    board: NoticeBoard, executor_id: str = "1", instance_id: str = "i1", ts: float = 0.0
) -> HeartbeatRecord:
    """A heartbeat as the RM receives it: the agent's payload, through its wire form."""
    payload = collect_payload([lambda: {"slots_total": 2}, board])
    received = payload_from_proto(pb.Payload.FromString(payload_to_proto(payload).SerializeToString()))
    return HeartbeatRecord(executor_id, "host-a", instance_id, ts, 1.0, received)


def test_a_notice_carried_in_many_heartbeats_is_one_event() -> None:
    clock = ManualClock()
    board = NoticeBoard(clock, carry_payloads=3, carry_s=10.0)
    events = NoticeEvents()
    board.add("SHUFFLE_CORRUPT", DETAIL)
    got = []
    beats = 0
    while board.pending() or beats == 0:
        got += events.on_heartbeat(heartbeat(board, ts=float(beats)))
        clock.jump(1.0)
        beats += 1
    assert beats > 10, "carried for 10 s at one heartbeat a second"
    assert [(e.kind, e.executor_id, e.host, e.instance_id, e.ts, e.detail) for e in got] == [
        (EventKind.SHUFFLE_CORRUPT, "1", "host-a", "i1", 0.0, DETAIL)
    ]


def test_a_re_registered_agent_still_carrying_a_notice_records_nothing_new() -> None:
    board = NoticeBoard(ManualClock())
    events = NoticeEvents()
    board.add("SHUFFLE_CORRUPT", DETAIL)
    assert len(events.on_heartbeat(heartbeat(board, instance_id="i1"))) == 1
    assert events.on_heartbeat(heartbeat(board, instance_id="i2")) == []
    board.add("SHUFFLE_CORRUPT", "another file")
    again = events.on_heartbeat(heartbeat(board, instance_id="i2"))
    assert [(e.detail, e.instance_id) for e in again] == [("another file", "i2")]


def test_the_same_id_from_another_executor_is_its_own_event() -> None:
    events = NoticeEvents()
    payload = Payload(notices=(Notice("a-1", "SHUFFLE_CORRUPT", "d"),))
    first = events.on_heartbeat(HeartbeatRecord("1", "h", "i", 0.0, 1.0, payload))
    second = events.on_heartbeat(HeartbeatRecord("2", "h", "j", 0.0, 1.0, payload))
    assert [e.executor_id for e in first + second] == ["1", "2"]


def test_memory_is_bounded_and_the_oldest_is_forgotten_first() -> None:
    events = NoticeEvents(max_seen=3)
    for i in range(10):
        payload = Payload(notices=(Notice(f"a-{i}", "SHUFFLE_CORRUPT", f"finding {i}"),))
        assert len(events.on_heartbeat(HeartbeatRecord("1", "h", "i", 0.0, 1.0, payload))) == 1
    assert events.remembered() == 3
    newest = Payload(notices=(Notice("a-9", "SHUFFLE_CORRUPT", "finding 9"),))
    assert events.on_heartbeat(HeartbeatRecord("1", "h", "i", 0.0, 1.0, newest)) == []


def test_a_restarted_rm_does_not_record_again_what_its_predecessor_recorded() -> None:
    board = NoticeBoard(ManualClock())
    board.add("SHUFFLE_CORRUPT", DETAIL)
    before = NoticeEvents()
    assert len(before.on_heartbeat(heartbeat(board))) == 1
    after = NoticeEvents()  # a new driver-side process: no ids known
    after.adopt([("1", DETAIL), ("2", "another executor's")])  # from history.recovery
    board.add("SHUFFLE_CORRUPT", "x" * 600)  # a new finding, its detail cut in the table
    again = after.on_heartbeat(heartbeat(board))
    assert [e.detail for e in again] == ["x" * 600], "only the finding the old RM never recorded"
    elsewhere = NoticeEvents()
    elsewhere.adopt([("2", DETAIL)])  # the same words of another executor are not this finding
    assert len(elsewhere.on_heartbeat(heartbeat(board))) == 2
    cut = NoticeEvents()
    cut.adopt([("1", DETAIL), ("1", event_row("app-1", again[0])["detail"])])  # as the table holds it
    assert cut.on_heartbeat(heartbeat(board)) == []


def test_a_kind_outside_the_notice_kinds_never_becomes_an_event() -> None:
    # The wire drops such a notice (test_notices); a record built otherwise is no way around it.
    payload = Payload(notices=(Notice("a-1", "UNREGISTERED", "forged"), Notice("a-2", "NOPE", "x")))
    assert NoticeEvents().on_heartbeat(HeartbeatRecord("1", "h", "i", 0.0, 1.0, payload)) == []


class Rows:
    """The history writer's ``append`` as the router calls it."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, dict[str, Any]]] = []

    def append(self, table: str, row: dict[str, Any]) -> None:
        self.rows.append((table, row))


def test_the_driver_router_writes_one_shuffle_corrupt_row_naming_executor_and_file() -> None:
    clock = ManualClock()
    board = NoticeBoard(clock, carry_payloads=2, carry_s=0.0)
    history = Rows()
    router = EventRouter(lambda: "app-1", history, clock=clock)
    shown: list[ExecutorEvent] = []
    router.watch_derived(shown.append)  # the live page's view
    tally = LivenessTally()  # Spark's driver gauges
    router.watch_derived(tally)
    router(ExecutorEvent(EventKind.REGISTERED, "7", "host-a", "i1", 1_700_000_000.0))  # the bus's own
    board.add("SHUFFLE_CORRUPT", DETAIL)
    for beat in range(4):
        router(heartbeat(board, executor_id="7", ts=1_700_000_000.0 + beat))
        clock.jump(1.0)
    events = [row for table, row in history.rows if table == EXECUTOR_EVENTS.name]
    assert [(r["event"], r["executor_id"], r["detail"]) for r in events] == [
        ("REGISTERED", "7", ""),
        ("SHUFFLE_CORRUPT", "7", DETAIL),
    ]
    assert "/tmp/x/m5-2.42.0-0a1b2c3d.arrows" in events[1]["detail"]
    assert [(e.kind, e.detail) for e in shown] == [(EventKind.SHUFFLE_CORRUPT, DETAIL)]
    assert tally.counts()["events.shuffleCorrupt"] == 1


def test_every_event_kind_is_listed_where_people_read_them() -> None:
    import spark_plugin.history.tables as tables
    from scripts.docs_site import event_kinds
    from spark_plugin.tools.report_plots import EVENT_COLOURS

    listed = event_kinds()  # the site's tables reference: every kind with its doc line
    live_js = (Path(__file__).parents[2] / "spark_plugin/tools/web/live.js").read_text()
    for kind in EventKind:
        assert f"| `{kind.name}` |" in listed, kind
        assert kind.name in EVENT_COLOURS, kind
        assert kind.name in (tables.__doc__ or ""), kind
    for name in DERIVED_KINDS:  # the live page shows them (the router hands them over)
        assert f"{name}:" in live_js, name
