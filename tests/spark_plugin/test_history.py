"""The history writer on real Delta tables (delta-rs): batching, bad paths, conflicts, compaction."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from spark_plugin.history import (
    EXECUTOR_EVENTS,
    HEARTBEATS,
    HistoryWriter,
    IncompatibleTableError,
    TablePathError,
    known_executors,
    recover,
)


def event(
    executor_id: str, kind: str, second: int, app_id: str = "app-1", detail: str = ""
) -> dict[str, object]:
    return {
        "app_id": app_id,
        "executor_id": executor_id,
        "host": "127.0.0.1",
        "instance_id": f"i-{executor_id}-{second}",
        "ts": dt.datetime(2026, 11, 22, 5, 0, second, tzinfo=dt.UTC),
        "event": kind,
        "detail": detail,
    }


def heartbeat_row(i: int) -> dict[str, object]:
    row = dict(event(str(i % 2), "", i % 60), rtt_ms=1.5, gap_ms=None, jvm_pulse_age_ms=100)
    row.update(slots_total=1, slots_busy=0, running_tasks=0, rss_bytes=1 << 20)
    del row["event"], row["detail"]
    return row


def count(root: Path, table: str) -> int:
    return int(DeltaTable(str(root / table)).to_pyarrow_table().num_rows)


def test_buffered_rows_land_in_one_commit_per_table_per_flush(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    before = DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).version()
    for i in range(25):
        writer.append(EXECUTOR_EVENTS.name, event(str(i % 3), "REGISTERED", i))
    assert writer.buffered(EXECUTOR_EVENTS.name) == 25
    writer.flush()
    assert DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).version() == before + 1
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 25
    assert writer.buffered(EXECUTOR_EVENTS.name) == 0
    writer.flush()  # nothing buffered: no empty commit
    assert DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).version() == before + 1


def test_an_unwritable_path_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    writer = HistoryWriter(blocker / "tables", flush_interval_s=1)
    with pytest.raises(TablePathError, match=str(blocker)):
        writer.open()


def test_a_non_delta_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / HEARTBEATS.name).mkdir()
    (tmp_path / HEARTBEATS.name / "data.csv").write_text("x\n")
    with pytest.raises(TablePathError, match="not a Delta table"):
        HistoryWriter(tmp_path, flush_interval_s=1).open()


def test_a_table_with_another_schema_is_refused_and_left_alone(tmp_path: Path) -> None:
    other = pa.table({"executor_id": ["1"], "mood": ["fine"]})
    write_deltalake(str(tmp_path / EXECUTOR_EVENTS.name), other)
    with pytest.raises(IncompatibleTableError, match="mood"):
        HistoryWriter(tmp_path, flush_interval_s=1).open()
    assert DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).to_pyarrow_table().num_rows == 1


def test_appends_racing_compaction_lose_and_double_nothing(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    path = str(tmp_path / EXECUTOR_EVENTS.name)
    stop = threading.Event()
    compactions: list[int] = []

    def compact_forever() -> None:
        while not stop.is_set():
            try:
                DeltaTable(path).optimize.compact()
                compactions.append(1)
            except Exception:  # the writer may win the race; that is the point
                pass

    thread = threading.Thread(target=compact_forever)
    thread.start()
    try:
        for batch in range(30):
            for i in range(10):
                writer.append(EXECUTOR_EVENTS.name, event(f"{batch}-{i}", "REGISTERED", i))
            writer.flush()
    finally:
        stop.set()
        thread.join()
    assert compactions, "the race never happened"
    assert writer.stats()[EXECUTOR_EVENTS.name]["buffered"] == 0
    ids = DeltaTable(path).to_pyarrow_table()["executor_id"].to_pylist()
    assert sorted(ids) == sorted(f"{b}-{i}" for b in range(30) for i in range(10))


def test_maintenance_compacts_small_files_without_changing_rows(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    for second in range(12):
        writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", second))
        writer.flush()
    path = str(tmp_path / EXECUTOR_EVENTS.name)
    assert len(DeltaTable(path).file_uris()) == 12
    writer.maintain()
    assert len(DeltaTable(path).file_uris()) == 1
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 12


def files_on_disk(table: Path) -> int:
    return sum(1 for p in table.rglob("*") if p.is_file())


def data_files(table: Path) -> int:
    return sum(1 for p in table.glob("*.parquet") if p.is_file())


def test_retention_bounds_the_files_on_disk_of_a_long_application(tmp_path: Path) -> None:
    """Rounds of many small commits, each followed by maintenance once the retention has passed:
    the files on disk stay at about one round's worth however many rounds run, rows all kept.
    (Delta's vacuum measures retention on the wall clock from the commits' times, so each round
    maintains until vacuum has removed what compaction tombstoned, under a generous deadline; a
    checkpoint taken after the retention has passed, the writes' own included, drops those
    tombstones, and vacuum must remove the files all the same.)"""
    retention_s = 1.0
    writer = HistoryWriter(tmp_path, flush_interval_s=60, retention_s=retention_s)
    writer.open()
    table = tmp_path / EXECUTOR_EVENTS.name
    props = DeltaTable(str(table)).metadata().configuration
    assert props["delta.deletedFileRetentionDuration"] == "interval 1 seconds"
    counts = []
    for round_ in range(4):
        for second in range(25):
            writer.append(EXECUTOR_EVENTS.name, event(str(round_), "REGISTERED", second))
            writer.flush()
        written = files_on_disk(table)  # before maintenance, which may vacuum at once on a slow machine
        writer.maintain()  # compacts this round's files into one, tombstoning them

        def vacuumed() -> bool:
            writer.maintain()  # once they are past retention: vacuumed, old log entries cleaned up
            return data_files(table) == 1  # the compacted file alone, however the log was checkpointed

        assert wait_until(vacuumed, timeout_s=60, interval_s=0.25), "vacuum never removed the round's files"
        assert files_on_disk(table) < written - 20
        counts.append(files_on_disk(table))
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 100
    assert max(counts) <= 20, counts  # 100 commits wrote 100 data files and 100 log entries
    assert counts[-1] <= counts[0] + 2, counts  # flat, not growing with the rounds


def test_files_whose_tombstones_a_checkpoint_dropped_are_still_vacuumed(tmp_path: Path) -> None:
    """A checkpoint written once the retention has passed (here by hand; the writes' automatic
    checkpoints do it too) leaves the expired tombstones out of the log: maintenance must remove
    those compacted-away files all the same, or they stay on disk for the table's whole life."""
    writer = HistoryWriter(tmp_path, flush_interval_s=60, retention_s=1.0)
    writer.open()
    table = tmp_path / EXECUTOR_EVENTS.name
    for second in range(5):
        writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", second))
        writer.flush()
    DeltaTable(str(table)).optimize.compact()
    assert data_files(table) == 6
    # the tombstones have expired once Delta's own vacuum would delete their files
    assert wait_until(lambda: len(DeltaTable(str(table)).vacuum(dry_run=True)) == 5, timeout_s=30)
    DeltaTable(str(table)).create_checkpoint()
    assert DeltaTable(str(table)).vacuum(dry_run=True) == []  # the log no longer knows those files
    writer.maintain()
    assert data_files(table) == 1
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 5


def test_a_restart_with_another_retention_updates_the_tables(tmp_path: Path) -> None:
    HistoryWriter(tmp_path, flush_interval_s=60).open()
    HistoryWriter(tmp_path, flush_interval_s=60, retention_s=120).open()
    props = DeltaTable(str(tmp_path / HEARTBEATS.name)).metadata().configuration
    assert props["delta.logRetentionDuration"] == "interval 120 seconds"


def test_the_buffer_is_bounded_and_counts_what_it_drops(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60, max_buffered_rows=5)
    writer.open()
    for second in range(7):
        writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", second))
    assert writer.stats()[EXECUTOR_EVENTS.name] == {
        "buffered": 5,
        "dropped": 2,
        "rejected": 0,
        "commits": 0,
        "failures": 0,
    }
    writer.flush()
    instances = DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).to_pyarrow_table()["instance_id"].to_pylist()
    assert sorted(instances) == [f"i-1-{s}" for s in range(2, 7)]  # the oldest went first


def test_a_malformed_row_is_rejected_without_losing_its_batch(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", 1))
    writer.append(EXECUTOR_EVENTS.name, {**event("2", "REGISTERED", 2), "ts": "not a timestamp"})
    writer.append(EXECUTOR_EVENTS.name, event("3", "REGISTERED", 3))
    writer.flush()
    assert writer.stats()[EXECUTOR_EVENTS.name]["rejected"] == 1
    ids = DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).to_pyarrow_table()["executor_id"].to_pylist()
    assert sorted(ids) == ["1", "3"]


def test_a_failed_commit_keeps_the_rows_for_the_next_flush(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60, commit_attempts=2)
    writer.open()
    writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", 1))
    log_dir = tmp_path / EXECUTOR_EVENTS.name / "_delta_log"
    moved = log_dir.rename(tmp_path / "log-away")  # the table vanishes: every commit fails
    log_dir.mkdir()
    (log_dir / "00000000000000000000.json").write_text("{broken")
    writer.flush()
    assert writer.buffered(EXECUTOR_EVENTS.name) == 1
    assert writer.stats()[EXECUTOR_EVENTS.name]["failures"] == 1  # history.commitFailures
    for f in log_dir.iterdir():
        f.unlink()
    log_dir.rmdir()
    moved.rename(log_dir)
    writer.flush()
    assert writer.buffered(EXECUTOR_EVENTS.name) == 0
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 1


@pytest.mark.parametrize("lands", [True, False], ids=["commit-landed-then-raised", "commit-failed"])
def test_a_retried_commit_writes_its_rows_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lands: bool
) -> None:
    """A commit call that raises may or may not have committed (a lost reply, a conflict after
    the write): the retry asks the table for the writer's transaction before writing again."""
    import deltalake

    real = deltalake.write_deltalake
    calls: list[int] = []

    def first_call_raises(*args: object, **kwargs: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            if lands:
                real(*args, **kwargs)  # type: ignore[call-overload]
            raise OSError("connection reset after the commit request")
        real(*args, **kwargs)  # type: ignore[call-overload]

    writer = HistoryWriter(tmp_path, flush_interval_s=60, commit_attempts=3)
    writer.open()
    monkeypatch.setattr(deltalake, "write_deltalake", first_call_raises)
    for i in range(4):
        writer.append(EXECUTOR_EVENTS.name, event(str(i), "REGISTERED", i))
    writer.flush()
    monkeypatch.setattr(deltalake, "write_deltalake", real)
    assert len(calls) == (1 if lands else 2)
    assert writer.buffered(EXECUTOR_EVENTS.name) == 0
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 4
    table = DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name))
    assert table.transaction_version(writer.writer_id) == 1
    writer.append(EXECUTOR_EVENTS.name, event("9", "REGISTERED", 9))
    writer.flush()
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 5
    assert DeltaTable(str(tmp_path / EXECUTOR_EVENTS.name)).transaction_version(writer.writer_id) == 2


def versions(root: Path, table: str) -> int:
    return int(DeltaTable(str(root / table)).version())


def test_the_flusher_commits_once_per_interval_on_its_clock(tmp_path: Path) -> None:
    """When a flush is due is decided on the writer's clock: nothing is committed before one
    interval has passed, everything buffered is committed once it has, and a steady stream of
    rows over three intervals makes exactly three commits per table."""
    clock = ManualClock()
    writer = HistoryWriter(tmp_path, flush_interval_s=2.0, compact_interval_s=3600, clock=clock)
    writer.open()
    before = versions(tmp_path, EXECUTOR_EVENTS.name)
    writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", 1))
    assert writer.run_due() == pytest.approx(2.0)
    clock.jump(1.9)
    assert writer.run_due() == pytest.approx(0.1)
    assert writer.buffered(EXECUTOR_EVENTS.name) == 1, "flushed before its interval"
    clock.jump(0.1)
    assert writer.run_due() == pytest.approx(2.0)
    assert count(tmp_path, EXECUTOR_EVENTS.name) == 1
    assert versions(tmp_path, EXECUTOR_EVENTS.name) == before + 1

    heartbeats_before = versions(tmp_path, HEARTBEATS.name)
    for i in range(30):  # ten rows per interval, the flusher asked after every row
        writer.append(HEARTBEATS.name, heartbeat_row(i))
        clock.jump(0.2)
        writer.run_due()
    assert count(tmp_path, HEARTBEATS.name) == 30
    assert versions(tmp_path, HEARTBEATS.name) - heartbeats_before == 3
    assert versions(tmp_path, EXECUTOR_EVENTS.name) == before + 1, "an empty table got a commit"


def test_maintenance_runs_after_a_flush_once_its_interval_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    writer = HistoryWriter(tmp_path, flush_interval_s=1.0, compact_interval_s=5.0, clock=clock)
    writer.open()
    rounds: list[float] = []
    monkeypatch.setattr(writer, "maintain", lambda: rounds.append(clock.monotonic()))
    for _ in range(12):
        clock.jump(1.0)
        writer.run_due()
    assert rounds == [5.0, 10.0]


def test_the_flusher_thread_commits_without_an_explicit_flush(tmp_path: Path) -> None:
    """On the real clock: rows become readable with no call to ``flush`` (the deadline is
    generous on purpose; how soon is the clock-driven test's business), and ``stop`` commits
    what is still buffered."""
    writer = HistoryWriter(tmp_path, flush_interval_s=0.2, compact_interval_s=3600)
    writer.open()
    writer.start()
    try:
        writer.append(EXECUTOR_EVENTS.name, event("1", "REGISTERED", 1))
        assert wait_until(lambda: count(tmp_path, EXECUTOR_EVENTS.name) == 1, timeout_s=60)
        for i in range(30):
            writer.append(HEARTBEATS.name, heartbeat_row(i))
    finally:
        writer.stop()
    assert count(tmp_path, HEARTBEATS.name) == 30
    assert writer.stats()[HEARTBEATS.name]["buffered"] == 0


def test_a_restarted_rm_recovers_the_executors_it_knew(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    for row in [
        event("1", "REGISTERED", 1),
        event("2", "REGISTERED", 2),
        event("2", "UNREGISTERED", 3),
        event("3", "REGISTERED", 4),
        event("3", "HEARTBEAT_TIMEOUT", 5),
        event("9", "REGISTERED", 6, app_id="another-app"),
        event("4", "REGISTERED", 7),
        event("4", "SPARK_REMOVED", 8),  # idle under dynamic allocation
        event("5", "REGISTERED", 9),
        event("5", "SPARK_LOST", 10),
        event("6", "UNMONITORED", 11),  # no agent ever came: not one to expect back
        event("1", "TASK_STUCK", 12),  # about a task, not the agent
    ]:
        writer.append(EXECUTOR_EVENTS.name, row)
    writer.stop()
    known = {e.executor_id: e.last_event for e in known_executors(tmp_path, "app-1")}
    assert known == {"1": "REGISTERED", "3": "HEARTBEAT_TIMEOUT"}
    assert known_executors(tmp_path / "elsewhere", "app-1") == []
    replayed = recover(tmp_path, "app-1").events  # every event of the application, oldest first
    assert ("REGISTERED", "9") not in replayed  # another application's
    assert replayed[-2:] == [("UNMONITORED", "6"), ("TASK_STUCK", "1")]
    assert [x for _, x in replayed].count("5") == 2 and len(replayed) == 11


def stuck(task_id: int) -> str:
    return (
        f"stage 2.0 partition {task_id} attempt 0 (task {task_id}): no progress for 31.0s (40.0s running); x"
    )


def test_a_restarted_rm_recovers_the_tasks_still_stuck(tmp_path: Path) -> None:
    """Stuck and not resumed, on an executor that did not leave for good: handed to the restarted
    RM's ``TaskEvents.adopt_stuck``. Resumed ones, another application's and those of an executor
    gone since are not."""
    resumed = "stage 2.0 partition 5 attempt 0 (task 5): progressing again (0.1s idle)"
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    for row in [
        event("1", "REGISTERED", 1),
        event("1", "TASK_STUCK", 2, detail=stuck(5)),
        event("1", "TASK_STUCK", 3, detail=stuck(6)),
        event("1", "TASK_RESUMED", 4, detail=resumed),
        event("1", "HEARTBEAT_TIMEOUT", 5),  # the agent's silence ends no task
        event("2", "TASK_STUCK", 6, detail=stuck(9)),
        event("2", "SPARK_LOST", 7),
        event("3", "TASK_STUCK", 8, app_id="another-app", detail=stuck(11)),
        event("4", "TASK_STUCK", 9, detail="a detail of another shape"),
    ]:
        writer.append(EXECUTOR_EVENTS.name, row)
    writer.stop()
    found = recover(tmp_path, "app-1").stuck
    assert {e: [(t.task_id, t.label) for t in tasks] for e, tasks in found.items()} == {
        "1": [("6", "stage 2.0 partition 6 attempt 0 (task 6)")]
    }
    assert recover(tmp_path / "elsewhere", "app-1").stuck == {}


def test_a_restarted_rm_recovers_the_damaged_outputs_it_recorded(tmp_path: Path) -> None:
    """Handed to the restarted RM's ``NoticeEvents.adopt``: agents may still carry those notices."""
    writer = HistoryWriter(tmp_path, flush_interval_s=60)
    writer.open()
    for row in [
        event("1", "REGISTERED", 1),
        event("1", "SHUFFLE_CORRUPT", 2, detail="shuffle 3, map partition 5, executor 1, file /a: bad"),
        event("2", "SHUFFLE_CORRUPT", 3, app_id="another-app", detail="elsewhere"),
        event("1", "SHUFFLE_CORRUPT", 4, detail="shuffle 4, map partition 0, executor 1, file /b: bad"),
    ]:
        writer.append(EXECUTOR_EVENTS.name, row)
    writer.stop()
    assert recover(tmp_path, "app-1").corrupt == [
        ("1", "shuffle 3, map partition 5, executor 1, file /a: bad"),
        ("1", "shuffle 4, map partition 0, executor 1, file /b: bad"),
    ]
    assert recover(tmp_path / "elsewhere", "app-1").corrupt == []
