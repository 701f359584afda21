"""The direct Parquet read's planning and reading, without a JVM: footers checked column by
column, row groups packed into tasks as Spark packs file splits, splits read back as the schema
Spark would hand a worker (``spark_plugin.shuffle.driver.direct_scan``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from arrow_shuffle.errors import ShuffleError
from spark_plugin.shuffle.driver import direct_scan
from spark_plugin.shuffle.driver.direct_scan import DirectScan, scan_function

WANT = pa.schema([("k", pa.int64()), ("s", pa.string())])


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    """What ``_pack`` reads: the SQL conf and the default parallelism."""

    def __init__(self, conf: dict[str, str], parallelism: int) -> None:
        self.conf = _Conf(conf)
        self.sparkContext = type("Context", (), {"defaultParallelism": parallelism})()


def _write(path: Path, rows: int, row_group: int, **extra: pa.Array) -> str:
    table = pa.table({"k": pa.array(range(rows), pa.int64()), "s": [str(i) for i in range(rows)], **extra})
    pq.write_table(table, path, row_group_size=row_group)
    return str(path)


def test_a_footer_whose_columns_read_as_spark_would_hand_them_gives_its_row_groups(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.parquet", 1_000, 300, extra=pa.array([1.5] * 1_000))
    why, groups, size = direct_scan._file_groups(path, WANT)
    assert why == "" and [g for g, _ in groups] == [0, 1, 2, 3] and size == Path(path).stat().st_size
    assert all(weight > 0 for _, weight in groups)


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        (pa.array([1, 2], pa.int32()), "column 'k' reads as int32 here, Spark hands workers int64"),
        (pa.array([[1], [2]]), "column 'k' reads as list<element: int64>"),
        (None, "has no single column 'k'"),
    ],
)
def test_a_footer_with_another_type_or_no_such_column_is_left_to_spark(
    tmp_path: Path, column: pa.Array | None, reason: str
) -> None:
    columns = {"s": ["a", "b"]} if column is None else {"k": column, "s": ["a", "b"]}
    pq.write_table(pa.table(columns), tmp_path / "b.parquet")
    want = WANT if column is None or not pa.types.is_list(column.type) else pa.schema([("k", column.type)])
    why, groups, _ = direct_scan._file_groups(str(tmp_path / "b.parquet"), want)
    assert reason in why and groups == []


def test_files_written_with_sparks_legacy_calendar_and_unreadable_ones_are_left_to_spark(
    tmp_path: Path,
) -> None:
    table = pa.table({"k": pa.array([1], pa.int64()), "s": ["a"]})
    table = table.replace_schema_metadata({"org.apache.spark.legacyDateTime": ""})
    pq.write_table(table, tmp_path / "old.parquet")
    why, _, _ = direct_scan._file_groups(str(tmp_path / "old.parquet"), WANT)
    assert "legacy calendar" in why
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    why, _, _ = direct_scan._file_groups(str(tmp_path / "junk.parquet"), WANT)
    assert "not readable here" in why
    why, _, _ = direct_scan._file_groups(str(tmp_path / "missing.parquet"), WANT)
    assert "not readable here" in why


def _units(files: int, groups: int, weight: int) -> list[tuple[int, str, int]]:
    return [(weight, f"/f{f}", g) for f in range(files) for g in range(groups)]


def test_row_groups_are_packed_like_spark_file_splits_each_once_in_file_order() -> None:
    units = _units(files=8, groups=3, weight=10 << 20)  # 240 MiB of row groups
    file_bytes = 240 << 20
    # Two cores, Spark's defaults: 128 MiB splits at most, fewer bytes each to give both cores work.
    tasks = direct_scan._pack(units, file_bytes, 8, _Session({}, 2))
    assert len(tasks) == 3  # (240 + 8 x 4 open cost) MiB / 128 MiB
    read = Counter((path, group) for task in tasks for path, groups in task for group in groups)
    assert read == Counter((path, group) for _, path, group in units)
    loads = [sum(len(groups) for _, groups in task) for task in tasks]
    assert max(loads) - min(loads) <= 1
    for task in tasks:
        assert [path for path, _ in task] == sorted(path for path, _ in task)
        assert all(list(groups) == sorted(groups) for _, groups in task)
    small = direct_scan._pack(units, file_bytes, 8, _Session({"spark.sql.files.maxPartitionBytes": "32m"}, 2))
    assert len(small) == 9
    wide = direct_scan._pack(units, file_bytes, 8, _Session({"spark.sql.files.minPartitionNum": "24"}, 2))
    assert len(wide) == 24  # never more tasks than row groups
    with pytest.raises(ValueError):
        direct_scan._pack(units, file_bytes, 8, _Session({"spark.sql.files.maxPartitionBytes": "lots"}, 2))


def test_a_task_reads_its_splits_as_sparks_schema_whatever_the_files_column_order(tmp_path: Path) -> None:
    table = pa.table({"s": [str(i) for i in range(50)], "k": pa.array(range(50), pa.int64())})
    pq.write_table(table, tmp_path / "r.parquet", row_group_size=20)
    want = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())])
    splits = (((str(tmp_path / "r.parquet"), (0, 2)),), ((str(tmp_path / "r.parquet"), (1,)),))
    read = scan_function(DirectScan(want.serialize().to_pybytes(), splits, 1, 3))
    first = list(read([pa.record_batch({"id": pa.array([0], pa.int64())})]))
    assert all(batch.schema == want for batch in first)
    assert pa.Table.from_batches(first).column("k").to_pylist() == [*range(20), *range(40, 50)]
    second = list(read([pa.record_batch({"id": pa.array([1], pa.int64())})]))
    assert pa.Table.from_batches(second).column("s").to_pylist() == [str(i) for i in range(20, 40)]


def test_a_file_that_changed_since_planning_fails_the_task_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"k": ["now a string"], "s": ["a"]}), path)
    read = scan_function(DirectScan(WANT.serialize().to_pybytes(), (((str(path), (0,)),),), 1, 1))
    with pytest.raises(ShuffleError, match=r"c\.parquet changed since the query was planned"):
        list(read([pa.record_batch({"id": pa.array([0], pa.int64())})]))


def test_summary_hidden_and_empty_files_are_skipped_as_sparks_scan_skips_them(tmp_path: Path) -> None:
    data = _write(tmp_path / "part-0.parquet", 10, 10)
    for name in ("_metadata", "_common_metadata", ".part-0.parquet.crc"):
        (tmp_path / name).write_bytes(Path(data).read_bytes())
        assert not direct_scan._data_file(str(tmp_path / name))
    (tmp_path / "empty.parquet").write_bytes(b"")
    assert not direct_scan._data_file(str(tmp_path / "empty.parquet"))
    assert direct_scan._data_file(data)
    assert direct_scan._data_file(str(tmp_path / "_k=1"))  # a partition directory's name


def test_footers_spark_would_read_otherwise_are_left_to_spark(tmp_path: Path) -> None:
    """Case-insensitive twins (Spark refuses them), a Spark 2 writer (Julian dates, rebased on
    read), a file no Spark wrote under a rebasing mode; a Spark 3 writer under it reads directly."""
    twins = pa.table({"k": pa.array([1], pa.int64()), "K": pa.array([2], pa.int64()), "s": ["a"]})
    pq.write_table(twins, tmp_path / "twins.parquet")
    assert direct_scan._file_groups(str(tmp_path / "twins.parquet"), WANT, case_sensitive=True)[0] == ""
    why = direct_scan._file_groups(str(tmp_path / "twins.parquet"), WANT, case_sensitive=False)[0]
    assert "differing in case only (['k'])" in why
    base = pa.table({"k": pa.array([1], pa.int64()), "s": ["a"]})
    for version, corrected, readable in [
        ("2.4.8", True, False),
        ("3.5.1", True, True),
        ("3.5.1", False, True),
        (None, False, False),
        (None, True, True),
    ]:
        table = (
            base if version is None else base.replace_schema_metadata({"org.apache.spark.version": version})
        )
        pq.write_table(table, tmp_path / "v.parquet")
        why = direct_scan._file_groups(str(tmp_path / "v.parquet"), WANT, corrected=corrected)[0]
        assert (why == "") == readable, (version, corrected, why)
    assert direct_scan._version(b"2.4.8") == (2, 4, 8) and direct_scan._version(b"4.1.0-SNAPSHOT") == (
        4,
        1,
        0,
    )
    assert direct_scan._version(b"garbage") == (0,)


def test_a_chained_function_reads_directly_only_where_spark_would_hand_it_the_same_labels() -> None:
    plain = _Session({}, 2)
    assert direct_scan._chained_labels(plain, WANT) == ""
    stamped = pa.schema([("k", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    assert "session's zone" in direct_scan._chained_labels(plain, stamped)
    large = _Session({"spark.sql.execution.arrow.useLargeVarTypes": "true"}, 2)
    assert "large strings" in direct_scan._chained_labels(large, WANT)
    assert direct_scan._chained_labels(large, pa.schema([("k", pa.int64())])) == ""
