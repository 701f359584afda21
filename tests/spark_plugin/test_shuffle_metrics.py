"""The ``shuffle_metrics`` table as the user's driver writes it: where (the same declarations the
RM reads), when (the injected clock's wall time), and what (one row per task report)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from arrowbeat_base.clock import ManualClock
from spark_plugin.history import shuffle_metrics
from spark_plugin.history.shuffle_metrics import append_batches, append_rows, rows_of, tables_root_of
from spark_plugin.history.tables import open_table
from spark_plugin.settings.config import ConfigError


class FakeConf:
    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = entries

    def getAll(self) -> list[tuple[str, str]]:
        return list(self._entries.items())


class FakeSpark:
    """Just what ``tables_root_of`` reads: ``spark.sparkContext.getConf().getAll()``."""

    def __init__(self, entries: dict[str, str]) -> None:
        conf = FakeConf(entries)
        self.sparkContext = type("Context", (), {"getConf": staticmethod(lambda: conf)})()


def report(side: str, partition: int, **extra: Any) -> dict[str, Any]:
    return {
        "side": side,
        "partition": partition,
        "attempt": 7,
        "executor": 1,
        "bytes": 100,
        "batches": 2,
        "rows": 10,
        "spill_bytes": 0,
        "blocked_s": 0.5,
        "seconds": 1.25,
        "recomputed": False,
        "recomputed_maps": [],
        **extra,
    }


def test_the_tables_root_is_the_configured_path_or_under_the_warehouse(tmp_path: Path) -> None:
    configured = FakeSpark({"spark.arrowbeat.tables.path": f"file:{tmp_path}/t", "spark.app.id": "a"})
    assert tables_root_of(configured) == tmp_path / "t"
    default = FakeSpark({"spark.sql.warehouse.dir": f"file:{tmp_path}/wh"})
    assert tables_root_of(default) == tmp_path / "wh" / "arrowbeat"


def test_a_malformed_setting_is_named_not_skipped(tmp_path: Path) -> None:
    spark = FakeSpark({"spark.arrowbeat.tables.path": str(tmp_path), "spark.arrowbeat.tables.retention": "1"})
    with pytest.raises(ConfigError, match=r"spark\.arrowbeat\.tables\.retention"):
        tables_root_of(spark)


def test_rows_are_stamped_with_the_clocks_wall_time() -> None:
    clock = ManualClock(start=5.0, wall_start=1_800_000_000.0)
    clock.jump(2.5)
    table = rows_of("app-1", 42, [report("write", 0), report("read", 3, recomputed_maps=[(1, "9")])], clock)
    rows = table.to_pylist()
    assert [r["ts"] for r in rows] == [dt.datetime.fromtimestamp(1_800_000_002.5, tz=dt.UTC)] * 2
    assert [(r["side"], r["partition"], r["attempt"], r["executor_id"]) for r in rows] == [
        ("write", 0, "7", "1"),
        ("read", 3, "7", "1"),
    ]
    assert rows[0]["detail"] is None and rows[1]["detail"] == '{"recomputed_maps": [1]}'
    assert rows[1]["blocked_on_credit_s"] == 0.5


def test_append_rows_creates_the_table_and_appends_one_commit(tmp_path: Path) -> None:
    clock = ManualClock()
    append_rows(tmp_path, "app-1", 1, [report("write", 0), report("write", 1)], clock)
    append_rows(tmp_path, "app-1", 2, [report("read", 0)], clock)
    table = DeltaTable(str(tmp_path / "shuffle_metrics"))
    assert sorted(table.to_pyarrow_table()["shuffle_id"].to_pylist()) == [1, 1, 2]
    assert table.version() == 2  # created, then one commit per call


def test_appends_keep_the_configured_retention_and_open_the_table_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spark.arrowbeat.tables.retention`` reaches the table the driver appends to (issue 36's
    leftover: it was always the default hour), and the table is opened (its snapshot loaded, its
    schema checked) once per process and retention, not before every append."""
    opened: list[float] = []

    def counting_open(location: Any, spec: Any, retention_s: float) -> str:
        opened.append(retention_s)
        return open_table(location, spec, retention_s)

    monkeypatch.setattr(shuffle_metrics, "_opened", {})
    monkeypatch.setattr(shuffle_metrics, "open_table", counting_open)
    for shuffle_id in range(3):
        append_batches(tmp_path, [("app-1", shuffle_id, [report("write", 0)])], retention_s=7200.0)
    table = DeltaTable(str(tmp_path / "shuffle_metrics"))
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 7200 seconds"
    assert opened == [7200.0]
    assert table.version() == 3  # created, then one commit per append

    append_batches(tmp_path, [("app-2", 9, [report("read", 0)])], retention_s=86400.0)  # another setting
    table = DeltaTable(str(tmp_path / "shuffle_metrics"))
    assert opened == [7200.0, 86400.0]
    assert table.metadata().configuration["delta.deletedFileRetentionDuration"] == "interval 86400 seconds"
    assert sorted(table.to_pyarrow_table()["shuffle_id"].to_pylist()) == [0, 1, 2, 9]


def test_a_table_removed_while_the_application_runs_comes_back_with_its_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table is opened once per process; removed meanwhile (an operator cleaning up), the
    next append creates it again, with the application's retention, not delta-rs's defaults."""
    monkeypatch.setattr(shuffle_metrics, "_opened", {})
    append_batches(tmp_path, [("app-1", 1, [report("write", 0)])], retention_s=7200.0)
    shutil.rmtree(tmp_path / "shuffle_metrics")
    append_batches(tmp_path, [("app-1", 2, [report("write", 0)])], retention_s=7200.0)
    table = DeltaTable(str(tmp_path / "shuffle_metrics"))
    assert table.to_pyarrow_table()["shuffle_id"].to_pylist() == [2]
    assert table.metadata().configuration["delta.logRetentionDuration"] == "interval 7200 seconds"
