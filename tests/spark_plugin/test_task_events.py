"""The driver side of stuck tasks and explained gaps (``monitoring.driver_tasks``), without Spark:
heartbeats and events as the RM publishes them; and a heartbeats table of an older arrowbeat
upgraded in place."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, Payload, WorkProgress
from spark_plugin.errors import JvmCommandError
from spark_plugin.history.tables import HEARTBEATS, open_table
from spark_plugin.monitoring.driver_tasks import TaskEvents


def beat(ts: float, *work: WorkProgress, **metrics: float) -> HeartbeatRecord:
    return HeartbeatRecord("3", "h", "i2", ts, 1.0, Payload(metrics=dict(metrics), work=work))


def task(tid: str, idle: float, stuck: bool = False, where: str = "") -> WorkProgress:
    return WorkProgress(tid, f"stage 1.0 partition {tid} attempt 0 (task {tid})", 20.0, idle, stuck, where)


def test_a_stuck_task_is_recorded_once_killed_if_asked_and_resumed_when_it_moves_or_ends() -> None:
    killed: list[int] = []
    events = TaskEvents(kill_task=killed.append)
    where = "Python: wait (threading.py:327) < blocked_udf (job.py:12)"
    out, _ = events.on_heartbeat(beat(1.0, task("7", 1.0), task("8", 0.1)), 1.0)
    assert out == []
    out, _ = events.on_heartbeat(beat(2.0, task("7", 11.0, True, where), task("8", 0.1)), 2.0)
    assert [(e.kind, e.executor_id) for e in out] == [(EventKind.TASK_STUCK, "3")]
    assert out[0].detail.startswith("stage 1.0 partition 7 attempt 0 (task 7): no progress for 11.0s")
    assert "blocked_udf (job.py:12)" in out[0].detail and killed == [7]
    out, _ = events.on_heartbeat(beat(3.0, task("7", 12.0, True, where), task("8", 0.1)), 3.0)
    assert out == [] and killed == [7]  # once per attempt
    out, _ = events.on_heartbeat(beat(4.0, task("7", 0.2), task("8", 12.0, True, where)), 4.0)
    assert [e.kind for e in out] == [EventKind.TASK_RESUMED, EventKind.TASK_STUCK]
    assert "progressing again" in out[0].detail
    out, _ = events.on_heartbeat(beat(5.0), 5.0)
    assert [e.kind for e in out] == [EventKind.TASK_RESUMED] and "ended" in out[0].detail


def test_a_kill_the_jvm_refuses_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def refuse(task_id: int) -> None:
        raise JvmCommandError("the JVM is gone")

    events = TaskEvents(kill_task=refuse)
    out, _ = events.on_heartbeat(beat(1.0, task("9", 30.0, True, "x")), 1.0)
    assert [e.kind for e in out] == [EventKind.TASK_STUCK]
    assert any("not asking Spark to kill" in r.getMessage() for r in caplog.records)


def test_an_executor_that_goes_ends_its_stuck_tasks() -> None:
    events = TaskEvents()
    events.on_heartbeat(beat(1.0, task("7", 30.0, True, "x")), 1.0)
    gone = ExecutorEvent(EventKind.SPARK_LOST, "3", "h", "i2", 2.0, "lost (crash): exit 137")
    out = events.on_event(gone, 2.0)
    assert [e.kind for e in out] == [EventKind.TASK_RESUMED, EventKind.SPARK_LOST]
    assert "its executor is gone (SPARK_LOST)" in out[0].detail


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (
            {"jvm_gaps": 1.0, "jvm_gap_s": 4.0, "jvm_gap_gc_s": 3.8, "jvm_gap_cpu_s": 7.0},
            "gap: garbage collection",
        ),
        (
            {"jvm_gaps": 1.0, "jvm_gap_s": 4.0, "jvm_gap_gc_s": 0.0, "jvm_gap_cpu_s": 0.0},
            "gap: process stopped",
        ),
        ({}, "gap: no pause of the executor JVM seen by its agent"),
    ],
)
def test_a_reregistration_says_what_the_gap_was(metrics: dict[str, float], expected: str) -> None:
    events = TaskEvents(hold_s=3.0)
    events.on_heartbeat(beat(1.0, jvm_gaps=0.0), 1.0)  # before the silence: no gap yet
    rereg = ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i3", 9.0, "after HEARTBEAT_TIMEOUT")
    assert events.on_event(rereg, 9.0) == []  # held for the next heartbeat
    out, _ = events.on_heartbeat(beat(9.5, **metrics), 9.5)
    assert [e.kind for e in out] == [EventKind.REREGISTERED]
    assert out[0].detail.startswith("after HEARTBEAT_TIMEOUT; " + expected), out[0].detail


def test_an_old_gap_does_not_explain_a_new_silence_and_a_held_event_is_not_lost() -> None:
    events = TaskEvents(hold_s=3.0)
    old_gap = {"jvm_gaps": 1.0, "jvm_gap_s": 4.0, "jvm_gap_gc_s": 3.8, "jvm_gap_cpu_s": 7.0}
    events.on_heartbeat(beat(1.0, **old_gap), 1.0)
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i3", 9.0), 9.0)
    out, _ = events.on_heartbeat(beat(9.5, **old_gap), 9.5)
    assert "no pause of the executor JVM" in out[0].detail
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i4", 20.0), 20.0)
    assert events.flush(21.0) == []
    late = events.flush(23.5)
    assert [e.kind for e in late] == [EventKind.REREGISTERED] and "no heartbeat followed" in late[0].detail


def test_gc_time_per_interval_comes_from_the_totals() -> None:
    events = TaskEvents()
    assert events.on_heartbeat(beat(1.0, jvm_gc_s=2.0), 1.0)[1] is None  # the first: no interval yet
    assert events.on_heartbeat(beat(2.0, jvm_gc_s=2.25), 2.0)[1] == pytest.approx(0.25)
    assert events.on_heartbeat(beat(3.0), 3.0)[1] is None  # unknown (no figure)


def test_an_older_heartbeats_table_gets_the_new_column(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    old = pa.schema([f for f in HEARTBEATS.schema if f.name != "gc_ms"])
    DeltaTable.create(str(tmp_path / "heartbeats"), schema=old)
    write_deltalake(
        str(tmp_path / "heartbeats"), pa.Table.from_pylist([{"app_id": "a"}], schema=old), mode="append"
    )
    open_table(tmp_path, HEARTBEATS)
    table = DeltaTable(str(tmp_path / "heartbeats"))
    assert "gc_ms" in table.schema().to_arrow().names
    rows = table.to_pyarrow_table().to_pylist()
    assert rows == [dict.fromkeys(HEARTBEATS.schema.names) | {"app_id": "a"}]


def test_an_executor_that_flaps_has_every_reregistration_explained_by_its_next_heartbeat() -> None:
    """A burst of long collections: it timed out again before its first heartbeat. Both
    re-registrations wait; the timeout between them is recorded at once (rows keep their own time)."""
    events = TaskEvents(hold_s=5.0)
    events.on_heartbeat(beat(1.0, jvm_gaps=0.0), 1.0)
    assert events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i3", 9.0), 9.0) == []
    timeout = ExecutorEvent(EventKind.HEARTBEAT_TIMEOUT, "3", "h", "i3", 9.2)
    assert [e.kind for e in events.on_event(timeout, 9.2)] == [EventKind.HEARTBEAT_TIMEOUT]
    assert events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i4", 9.9), 9.9) == []
    gaps = {"jvm_gaps": 1.0, "jvm_gap_s": 0.9, "jvm_gap_gc_s": 0.85, "jvm_gap_cpu_s": 0.8}  # one long GC
    out, _ = events.on_heartbeat(beat(11.0, **gaps), 11.0)
    assert [(e.instance_id, e.detail.startswith("gap: garbage collection")) for e in out] == [
        ("i3", True),
        ("i4", True),
    ]


def test_with_several_pauses_only_the_newest_reregistration_gets_the_last_cause() -> None:
    events = TaskEvents(hold_s=5.0)
    events.on_heartbeat(beat(1.0, jvm_gaps=0.0), 1.0)
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i3", 9.0), 9.0)
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i4", 9.9), 9.9)
    stopped = {"jvm_gaps": 2.0, "jvm_gap_s": 0.9, "jvm_gap_gc_s": 0.0, "jvm_gap_cpu_s": 0.0}
    out, _ = events.on_heartbeat(beat(11.0, **stopped), 11.0)
    assert out[0].detail.startswith("gap: one of 2 JVM pauses before the next heartbeat (the last: process")
    assert out[1].detail.startswith("gap: process stopped")


def test_held_events_are_not_lost_when_no_heartbeat_comes() -> None:
    events = TaskEvents(hold_s=5.0)
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "3", "h", "i3", 9.0), 9.0)
    events.on_event(ExecutorEvent(EventKind.REREGISTERED, "4", "h", "i9", 9.0), 9.0)
    gone = ExecutorEvent(EventKind.UNREGISTERED, "4", "h", "i9", 9.5, "stopped by the JVM")
    out = events.on_event(gone, 9.5)
    assert [(e.kind, e.executor_id) for e in out] == [
        (EventKind.REREGISTERED, "4"),
        (EventKind.UNREGISTERED, "4"),
    ]
    assert "left before a heartbeat" in out[0].detail
    assert [e.instance_id for e in events.close()] == ["i3"]  # the application stops: recorded
    assert events.close() == []


def test_an_executor_gone_for_good_is_forgotten() -> None:
    events = TaskEvents()
    events.on_heartbeat(beat(1.0, jvm_gc_s=1.0), 1.0)
    events.on_event(ExecutorEvent(EventKind.SPARK_REMOVED, "3", "h", "i2", 2.0, "idle"), 2.0)
    assert "3" not in events._executors


def test_a_removed_executor_whose_agent_falls_silent_leaves_no_state() -> None:
    """Issue 24 (months of churn): Spark removes an executor, its agent's last heartbeat comes
    after, then the agent times out (its JVM is gone): nothing of it stays; before, each such
    executor left an entry behind for good."""
    events = TaskEvents()
    removed = ExecutorEvent(EventKind.SPARK_REMOVED, "3", "h", "i2", 1.0, "idle")
    timeout = ExecutorEvent(EventKind.HEARTBEAT_TIMEOUT, "3", "h", "i2", 9.0, "no heartbeat")
    events.on_heartbeat(beat(0.5), 0.5)
    assert events.tracks("3")
    events.on_event(removed, 1.0)
    events.on_heartbeat(beat(2.0, task("7", 30.0, True)), 2.0)  # sent before the JVM stopped
    assert events.tracks("3")
    out = events.on_event(timeout, 9.0)
    assert [e.kind for e in out] == [EventKind.TASK_RESUMED, EventKind.HEARTBEAT_TIMEOUT]
    assert not events.tracks("3") and events.tracked() == 0
    for kind in (EventKind.UNMONITORED, EventKind.REGISTERED, EventKind.UNREACHABLE):  # words only
        events.on_event(ExecutorEvent(kind, "4", "h", "", 10.0, ""), 10.0)
    assert events.tracked() == 0


def test_a_live_executors_timeout_keeps_its_state_for_the_gap() -> None:
    events = TaskEvents()
    events.on_heartbeat(beat(0.5, jvm_gaps=0.0), 0.5)
    events.on_event(ExecutorEvent(EventKind.HEARTBEAT_TIMEOUT, "3", "h", "i2", 9.0, ""), 9.0)
    assert events.tracks("3")  # it may come back: the gap is explained by what it kept


def test_departed_executors_are_remembered_within_a_bound() -> None:
    events = TaskEvents(max_departed=3)
    for n in range(10):
        events.on_event(ExecutorEvent(EventKind.SPARK_LOST, str(n), "h", "", float(n), "crash"), float(n))
    assert list(events._departed) == ["7", "8", "9"]


def test_a_restarted_rm_takes_the_stuck_tasks_it_inherits_as_stuck() -> None:
    """The tasks a previous RM reported stuck (``history.recovery.stuck_tasks``): one still stuck is
    not recorded or killed again; one that moved on during the gap, or ended, is resumed."""
    killed: list[int] = []
    events = TaskEvents(kill_task=killed.append)
    events.adopt_stuck("3", [("7", task("7", 0).label), ("8", task("8", 0).label), ("9", task("9", 0).label)])
    out, _ = events.on_heartbeat(beat(1.0, task("7", 40.0, True, "x"), task("8", 0.2)), 1.0)
    assert [(e.kind, e.detail.split(":")[0]) for e in out] == [
        (EventKind.TASK_RESUMED, task("8", 0).label),
        (EventKind.TASK_RESUMED, task("9", 0).label),
    ]
    assert "progressing again" in out[0].detail and "ended" in out[1].detail
    assert killed == []  # task 7 was killed (or not) by the RM that reported it
    out, _ = events.on_heartbeat(beat(2.0), 2.0)
    assert [e.kind for e in out] == [EventKind.TASK_RESUMED] and out[0].detail.startswith(task("7", 0).label)
