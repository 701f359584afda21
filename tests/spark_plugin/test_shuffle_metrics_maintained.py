"""``shuffle_metrics`` stays small however many shuffles a streaming query releases: the
application's driver appends one commit (one file) per released shuffle, and the RM's history
writer, which maintains its own tables every compaction interval, maintains that one too
(compacted, checkpointed, vacuumed as retention allows), so each append loads a table of about a
compaction interval's files, not one file per shuffle ever released."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from arrowbeat_base.clock import ManualClock
from spark_plugin.history.shuffle_metrics import append_rows
from spark_plugin.history.writer import HistoryWriter


def _report(partition: int) -> dict[str, Any]:
    return {
        "side": "write",
        "partition": partition,
        "attempt": "3.7.0",
        "executor": "1",
        "bytes": 100,
        "batches": 1,
        "rows": 10,
        "spill_bytes": 0,
        "blocked_s": 0.0,
        "seconds": 0.1,
        "recomputed": False,
        "recomputed_maps": [],
    }


def test_released_shuffles_leave_a_compaction_intervals_files_not_one_per_shuffle(tmp_path: Path) -> None:
    clock = ManualClock()
    writer = HistoryWriter(tmp_path, flush_interval_s=2.0, compact_interval_s=30.0, clock=clock)
    writer.open()
    writer.maintain()  # before the first shuffle: no shuffle_metrics yet, nothing to do, nothing raised
    assert not (tmp_path / "shuffle_metrics").exists()
    files = []
    for shuffle in range(1, 91):  # one shuffle a second, as a streaming query releases them
        append_rows(tmp_path, "app-1", shuffle, [_report(0), _report(1)], clock)
        clock.jump(1.0)
        writer.run_due()
        files.append(len(DeltaTable(str(tmp_path / "shuffle_metrics")).file_uris()))
    table = DeltaTable(str(tmp_path / "shuffle_metrics"))
    assert table.to_pyarrow_table().num_rows == 180  # every row kept
    assert max(files) <= 31  # at most the shuffles of one compaction interval (and one compacted file)
    assert files[-1] <= 2  # maintained at 90 s: the 90 appends are one or two files
    assert files[29] <= 2 and files[59] <= 2  # and at 30 s and 60 s


def test_a_writer_may_be_told_to_maintain_only_its_own_tables(tmp_path: Path) -> None:
    writer = HistoryWriter(tmp_path, flush_interval_s=2.0, maintained=())
    writer.open()
    for shuffle in range(1, 4):
        append_rows(tmp_path, "app-1", shuffle, [_report(0)])
    writer.maintain()
    assert len(DeltaTable(str(tmp_path / "shuffle_metrics")).file_uris()) == 3
