"""A shuffle over Parquet files whose map tasks read the files themselves equals Spark's result.

The run's shared ``shuffle_cluster`` (two executors). Files are written by pyarrow with every
column type the direct read takes (nulls, NaN, unicode, decimals, dates, UTC timestamps), in
several row groups, one file empty and one with its columns in another order. For each call the
rows must equal Spark's own ``groupBy`` over the same files, and the plan must show which scan
ran: a ``Range`` of split numbers (the map tasks read the files) or Spark's ``FileScan``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_plugin.shuffle import group_apply, group_by, map_in_arrow, release
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark
ROWS = 6_000
DIRECT_KEY = "spark.arrowbeat.shuffle.directScan"


def _table(rows: int, offset: int) -> pa.Table:
    ids = list(range(offset, offset + rows))
    return pa.table(
        {
            "k": pa.array([None if i % 17 == 0 else i % 23 for i in ids], pa.int32()),
            "name": pa.array([None if i % 13 == 0 else ["a", "é", "日本", ""][i % 4] for i in ids]),
            "x": pa.array([math.nan if i % 19 == 0 else (i % 7) / 4 for i in ids], pa.float64()),
            "small": pa.array([i % 100 - 50 for i in ids], pa.int8()),
            "flag": pa.array([None if i % 11 == 0 else i % 2 == 0 for i in ids]),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i % 40) for i in ids]),
            "at": pa.array(
                [dt.datetime(2024, 3, 10, tzinfo=dt.UTC) + dt.timedelta(minutes=i) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
            "amount": pa.array([decimal.Decimal(i % 1000) / 100 for i in ids], pa.decimal128(12, 2)),
            "raw": pa.array([bytes([i % 256]) for i in ids], pa.binary()),
        }
    )


@pytest.fixture(scope="module")
def files(shuffle_cluster: ShuffleCluster, scratch: Path) -> Path:
    """Three data files (two of several row groups, one empty, one with its columns reversed)
    and a ``_metadata`` summary of the first."""
    folder = scratch / "direct-scan" / "input"
    folder.mkdir(parents=True)
    half = ROWS // 2
    pq.write_table(_table(half, 0), folder / "a.parquet", row_group_size=700)
    pq.write_table(_table(30, 0).slice(0, 0), folder / "b.parquet")
    first = _table(half, half)
    pq.write_table(first.select(first.column_names[::-1]), folder / "c.parquet", row_group_size=1_000)
    # A summary file (Dask and pyarrow write them) is listed by Spark but never scanned.
    metadata = pq.read_metadata(folder / "a.parquet")
    metadata.set_file_path("a.parquet")
    metadata.write_metadata_file(str(folder / "_metadata"))
    return folder


@pytest.fixture()
def spark(shuffle_cluster: ShuffleCluster) -> Iterator[SparkSession]:
    session = shuffle_cluster.spark
    yield session
    session.conf.unset(DIRECT_KEY)


def _scan_of(out: DataFrame) -> str:
    """Which map side ran: ``direct`` (split numbers, the tasks read the files) or ``spark``."""
    plan = str(out._jdf.queryExecution().analyzed().toString())
    direct, spark_scan = "Range (" in plan, "Relation [" in plan or "FileScan" in plan
    assert direct != spark_scan, plan
    return "direct" if direct else "spark"


def _rows(df: DataFrame) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in row) for row in df.collect()
    )


def _per_key(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": [pdf["k"].iloc[0]],
            "n": [len(pdf)],
            "names": [",".join(sorted(str(v) for v in pdf["name"]))],
            "x_sum": [float(pdf["x"].fillna(0).sum())],
            "small_sum": [int(pdf["small"].sum())],
            "days": [int(pdf["day"].nunique())],
            "last_at": [pdf["at"].max()],
            "amount_sum": [sum(pdf["amount"], decimal.Decimal(0))],
            "raw_len": [int(sum(len(v) for v in pdf["raw"]))],
            "flags": [int(pdf["flag"].fillna(False).sum())],
        }
    )


SCHEMA = (
    "k int, n long, names string, x_sum double, small_sum long, days long, last_at timestamp, "
    "amount_sum decimal(22,2), raw_len long, flags long"
)


def test_group_by_over_parquet_files_reads_them_in_the_map_tasks_and_equals_spark(
    spark: SparkSession, files: Path
) -> None:
    df = spark.read.parquet(str(files))
    want = _rows(df.groupBy("k").applyInPandas(_per_key, SCHEMA))
    out = group_by(spark.read.parquet(str(files)), "k").applyInPandas(_per_key, SCHEMA)
    try:
        assert _scan_of(out) == "direct"
        assert _rows(out) == want
    finally:
        release(out)
    spark.conf.set(DIRECT_KEY, "false")  # the key turns it off: Spark's scan, the same rows
    off = group_by(spark.read.parquet(str(files)), "k").applyInPandas(_per_key, SCHEMA)
    try:
        assert _scan_of(off) == "spark"
        assert _rows(off) == want
    finally:
        release(off)


def _count(table: pa.Table) -> pa.Table:
    return pa.table({"k": table.column("k").slice(0, 1), "n": pa.array([table.num_rows], pa.int64())})


def test_a_selection_and_a_chained_map_read_directly_only_their_columns(
    spark: SparkSession, files: Path
) -> None:
    picked = spark.read.parquet(str(files)).select("name", "k")
    want = _rows(picked.groupBy("k").count())
    out = group_apply(picked, ["k"], _count, "k int, n long")
    try:
        assert _scan_of(out) == "direct"
        assert _rows(out) == want
    finally:
        release(out)

    def doubled(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows > 1_000:  # Spark hands a mapInArrow function maxRecordsPerBatch rows
                raise ValueError(f"a batch of {batch.num_rows} rows")
            yield pa.record_batch([batch.column("k"), batch.column("small")], names=["k", "small"])
            yield pa.record_batch([batch.column("k"), batch.column("small")], names=["k", "small"])

    counted = spark.read.parquet(str(files)).groupBy("k").count().collect()
    want_chained = Counter((key, 2 * n) for key, n in counted)  # every row twice
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        # Only the columns it reads: read directly. Over a timestamp column, which Spark would hand
        # the function labelled with the session's zone: Spark's scan.
        for frame, scan in [
            (spark.read.parquet(str(files)).select("k", "small"), "direct"),
            (spark.read.parquet(str(files)), "spark"),
        ]:
            out = group_apply(
                map_in_arrow(frame, doubled, "k int, small byte"), ["k"], _count, "k int, n long"
            )
            try:
                assert _scan_of(out) == scan
                assert _rows(out) == want_chained
            finally:
                release(out)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")


def test_frames_the_direct_read_cannot_vouch_for_keep_sparks_scan(
    spark: SparkSession, files: Path, scratch: Path
) -> None:
    filtered = spark.read.parquet(str(files)).filter("small > 0")
    spark_written = scratch / "direct-scan" / "spark-written"
    # Spark writes timestamps as INT96, which pyarrow reads at another unit: Spark's scan reads them.
    spark.read.parquet(str(files)).write.parquet(str(spark_written))
    for frame in (
        filtered,
        spark.read.parquet(str(spark_written)),
        spark.read.parquet(str(files)).withColumn("y", F.col("x") * 2),
    ):
        want = _rows(frame.groupBy("k").count())
        out = group_apply(frame, ["k"], _count, "k int, n long")
        try:
            assert _scan_of(out) == "spark"
            assert _rows(out) == want
        finally:
            release(out)
    # Spark's own writer with timestamps stored as microseconds: read directly.
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    try:
        micros = scratch / "direct-scan" / "spark-written-micros"
        spark.read.parquet(str(files)).write.parquet(str(micros))
    finally:
        spark.conf.unset("spark.sql.parquet.outputTimestampType")
    frame = spark.read.parquet(str(micros))
    want = _rows(frame.groupBy("k").applyInPandas(_per_key, SCHEMA))
    out = group_by(frame, "k").applyInPandas(_per_key, SCHEMA)
    try:
        assert _scan_of(out) == "direct"
        assert _rows(out) == want
    finally:
        release(out)


def test_a_file_changed_after_planning_fails_its_task_naming_the_file(
    spark: SparkSession, scratch: Path
) -> None:
    folder = scratch / "direct-scan" / "changing"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"k": pa.array([1, 2, 3], pa.int64())}), folder / "part.parquet")
    spark.conf.set("spark.arrowbeat.shuffle.adaptive", "false")  # nothing runs until collect
    out = group_apply(spark.read.parquet(str(folder)), ["k"], _count, "k long, n long")
    try:
        assert _scan_of(out) == "direct"
        pq.write_table(pa.table({"k": pa.array(["x"])}), folder / "part.parquet")
        with pytest.raises(PythonException, match=r"part\.parquet changed since the query was planned"):
            out.collect()
    finally:
        spark.conf.unset("spark.arrowbeat.shuffle.adaptive")
        release(out)
