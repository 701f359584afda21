"""Monitoring gaps (``spark_plugin.history.gaps``) on a fake clock: what a restarted RM records, what
the driver-side process answers the JVM's pulses, how far the history writer's history is complete,
and how the readers show a gap. No JVM: the JVM's side of the hand-over is ``Supervision.java``'s
(``test_supervision``) and the real thing runs in ``tests/spark/test_launcher.py``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest

from arrowbeat_base.clock import ManualClock
from heartbeat import EventKind, ExecutorEvent
from spark_plugin.history import EXECUTOR_EVENTS, HEARTBEATS, HistoryWriter, event_row
from spark_plugin.history.event_lines import format_event
from spark_plugin.history.gaps import (
    CAUSE,
    FROM_MS,
    UNSAVED_ROWS,
    CarriedGap,
    GapBook,
    MonitoringGap,
    carried_gap,
    gap_detail,
    parse_gap,
)
from spark_plugin.history.reader import load_history
from spark_plugin.jvm.sidecar import PulseAnswers
from spark_plugin.processes.driver import record_gap

WALL = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def test_a_first_start_carries_no_gap_and_a_restart_carries_the_jvms_hand_over() -> None:
    assert carried_gap({"spark.app.id": "app-1"}) is None
    settings = {FROM_MS: "1767225600250", UNSAVED_ROWS: "12", CAUSE: "exited with status 137"}
    assert carried_gap(settings) == CarriedGap(WALL + 0.25, 12, "exited with status 137")
    # A predecessor that kept no history (0), or figures the JVM should never send: still a gap.
    assert carried_gap({FROM_MS: "0", UNSAVED_ROWS: "x", CAUSE: ""}) == CarriedGap(None, 0, "unknown")


def test_a_gap_detail_reads_back_and_says_which_interval_has_no_history() -> None:
    gap = MonitoringGap(WALL + 0.25, WALL + 8.5, "hung: no answer\nfor 5000 ms; killed pid 7", 31)
    detail = gap_detail(gap)
    assert detail == (
        "from=2026-01-01T00:00:00.250Z to=2026-01-01T00:00:08.500Z lost_rows=31 "
        "cause=hung: no answer for 5000 ms; killed pid 7"
    )
    back = parse_gap(detail)
    assert back is not None and back.lost_rows == 31 and back.seconds == pytest.approx(8.25)
    assert parse_gap(gap_detail(MonitoringGap(None, WALL, "exited", 0))) == MonitoringGap(
        None, WALL, "exited", 0
    )
    assert parse_gap("its agent did not start") is None and parse_gap(None) is None


class FakeWriter:
    """The two figures a ``GapBook`` reads from the history writer."""

    def __init__(self, complete_until: float) -> None:
        self.complete = complete_until
        self.unsaved = 0


def book_of(clock: ManualClock, carried: CarriedGap | None, writer: FakeWriter | None) -> GapBook:
    return GapBook(
        clock,
        carried,
        None if writer is None else (lambda: writer.complete),
        (lambda: 0) if writer is None else (lambda: writer.unsaved),
    )


def test_a_first_start_answers_its_own_writers_figures() -> None:
    clock = ManualClock(wall_start=WALL)
    writer = FakeWriter(WALL)
    book = book_of(clock, None, writer)
    assert book.gap() is None
    writer.unsaved = 7
    assert book.answer() == (1_767_225_600_000, 7)
    clock.jump(2)
    writer.complete, writer.unsaved = WALL + 2, 3
    assert book.answer() == (1_767_225_602_000, 3)
    assert book_of(clock, None, None).answer() == (0, 0)  # no history: nothing complete


def test_a_restarted_process_records_the_gap_once_and_passes_it_on_until_committed() -> None:
    clock = ManualClock(wall_start=WALL + 9)
    writer = FakeWriter(WALL + 9)  # its writer was created now
    book = book_of(clock, CarriedGap(WALL + 1, 12, "exited with status 137"), writer)
    gap = book.gap()
    assert gap == MonitoringGap(WALL + 1, WALL + 9, "exited with status 137", 12)
    book.recorded()
    assert book.gap() is None  # once
    writer.unsaved = 5  # the gap row and four heartbeats, not committed yet
    assert book.answer() == (1_767_225_601_000, 17)  # it dies now: the next records from WALL + 1
    odd = book_of(clock, carried_gap({FROM_MS: "1767225600253", CAUSE: "x"}), writer)
    odd.recorded()
    assert odd.answer()[0] == 1_767_225_600_253  # exactly what the JVM handed over
    clock.jump(1)
    writer.complete, writer.unsaved = WALL + 10, 2  # a complete flush after the gap row was recorded
    assert book.answer() == (1_767_225_610_000, 2)


def test_a_gap_of_unknown_start_is_passed_on_as_unknown() -> None:
    clock = ManualClock(wall_start=WALL)
    writer = FakeWriter(WALL)
    book = book_of(clock, CarriedGap(None, 0, "exited with status 1"), writer)
    gap = book.gap()
    assert gap is not None and gap.start is None and gap.end == WALL
    book.recorded()
    assert book.answer() == (0, 0)


def test_the_writer_is_complete_up_to_its_last_fully_committed_flush(tmp_path: Path) -> None:
    clock = ManualClock(wall_start=WALL)
    writer = HistoryWriter(tmp_path, flush_interval_s=60, commit_attempts=1, clock=clock)
    writer.open()
    assert writer.complete_until() == WALL and writer.unsaved_rows() == 0
    row = event_row("app-1", ExecutorEvent(EventKind.REGISTERED, "1", "h", "i", WALL + 1))
    clock.jump(1)
    writer.append(EXECUTOR_EVENTS.name, row)
    assert writer.unsaved_rows() == 1
    clock.jump(1)
    writer.flush()
    assert writer.complete_until() == WALL + 2 and writer.unsaved_rows() == 0
    # A commit that fails leaves the rows buffered and the history complete only up to before them.
    clock.jump(1)
    writer.append(EXECUTOR_EVENTS.name, row)
    log_dir = tmp_path / EXECUTOR_EVENTS.name / "_delta_log"
    moved = log_dir.rename(tmp_path / "log-away")
    log_dir.mkdir()
    (log_dir / "00000000000000000000.json").write_text("{broken")
    clock.jump(1)
    writer.flush()
    assert writer.complete_until() == WALL + 2 and writer.unsaved_rows() == 1
    for f in log_dir.iterdir():
        f.unlink()
    log_dir.rmdir()
    moved.rename(log_dir)
    clock.jump(1)
    writer.flush()
    assert writer.complete_until() == WALL + 5 and writer.unsaved_rows() == 0


class Loop:
    """A fake RM loop: callbacks wait until ``turn``; a wedged loop never turns."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], None]] = []

    def when_serving(self, callback: Callable[[], None]) -> None:
        self.queued.append(callback)

    def turn(self) -> None:
        queued, self.queued = self.queued, []
        for callback in queued:
            callback()


def test_pulses_are_answered_from_the_rm_loop_with_at_most_one_answer_pending() -> None:
    loop, sent = Loop(), []
    figures = iter([(1, 2), (3, 4)])
    answers = PulseAnswers(loop.when_serving, lambda: next(figures), lambda a, b: sent.append((a, b)))
    for _ in range(50):  # the loop is wedged: pulses keep coming, one answer waits
        answers()
    assert len(loop.queued) == 1 and sent == []
    loop.turn()
    assert sent == [(1, 2)]
    answers()
    loop.turn()
    assert sent == [(1, 2), (3, 4)]


def test_readers_show_the_gap_and_keep_it_out_of_the_executors(tmp_path: Path) -> None:
    clock = ManualClock(wall_start=WALL + 9)
    writer = HistoryWriter(tmp_path, flush_interval_s=60, clock=clock)
    writer.open()
    writer.append(
        EXECUTOR_EVENTS.name, event_row("app-1", ExecutorEvent(EventKind.REGISTERED, "1", "h", "i", WALL))
    )
    book = GapBook(
        clock, CarriedGap(WALL + 1, 12, "hung: no answer"), writer.complete_until, writer.unsaved_rows
    )
    record_gap(book, writer, "app-1", "127.0.0.1", "epoch-2")
    writer.flush()
    history = load_history(tmp_path, "app-1")
    assert history.monitoring_gaps == [MonitoringGap(WALL + 1, WALL + 9, "hung: no answer", 12)]
    assert [e.executor_id for e in history.executors] == ["1"]
    (gap_row,) = [e for e in history.events if e["event"] == "MONITORING_GAP"]
    assert (
        gap_row["ts"] == dt.datetime.fromtimestamp(WALL + 1, dt.UTC) and gap_row["instance_id"] == "epoch-2"
    )
    assert format_event(gap_row) == (
        "2026-01-01T00:00:01.000+00:00 app-1 MONITORING_GAP (every executor): no history from "
        "2026-01-01T00:00:01.000Z to 2026-01-01T00:00:09.000Z (8.0 s): hung: no answer; "
        "12 rows lost in flight (at least)"
    )
    assert writer.stats()[HEARTBEATS.name]["buffered"] == 0
    from spark_plugin.tools.report import render

    pytest.importorskip("matplotlib")
    page = render(history)
    assert "Monitoring gaps" in page and "2026-01-01 00:00:01.000Z" in page and "hung: no answer" in page
