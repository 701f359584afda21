"""Spark's grouped-map API on arrowbeat's shuffle equals Spark's own, form by form.

One application, the run's shared ``shuffle_cluster`` (two executors). Each test runs the same
function through Spark (``groupBy().applyInPandas`` / ``applyInArrow`` / ``cogroup``) and through
``group_by(...)`` and compares the rows as multisets (NaN made comparable). The input is small
(a few thousand rows, 4 map partitions of which the last is empty) and has null keys, a key
holding a third of the rows, several key types (int, string, double with NaN and -0.0, date) and
a timestamp column, converted to pandas in a non-UTC session zone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import PythonException
from pyspark.sql import DataFrame, SparkSession

from spark_plugin.shuffle import group_by, map_in_pandas, shuffle_of
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark
ROWS = 3_000


@pytest.fixture(scope="module")
def spark(shuffle_cluster: ShuffleCluster) -> Iterator[SparkSession]:
    """The shared cluster, in a session zone that is not UTC (pandas sees local times)."""
    session = shuffle_cluster.spark
    before = session.conf.get("spark.sql.session.timeZone")
    session.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        yield session
    finally:
        session.conf.set("spark.sql.session.timeZone", before or "UTC")


def source(spark: SparkSession, rows: int = ROWS) -> DataFrame:
    """Deterministic rows; map partition 3 of 4 is empty after the filter."""
    return (
        spark.range(0, rows * 4 // 3, numPartitions=4)
        .filter(f"id < {rows}")
        .selectExpr(
            "id",
            "CASE WHEN id % 17 = 0 THEN NULL WHEN id % 3 = 0 THEN 7 ELSE cast(pmod(id, 11) AS int) END AS k",
            "CASE WHEN id % 13 = 0 THEN NULL ELSE concat('s', pmod(id, 3)) END AS s",
            "CASE WHEN id % 19 = 0 THEN double('NaN') WHEN id % 23 = 0 THEN -0.0 WHEN id % 29 = 0 "
            "THEN NULL ELSE double(pmod(id, 2)) END AS d",
            "date_add(DATE'2024-03-09', cast(pmod(id, 3) AS int)) AS dt",
            "timestamp_seconds(1710000000 + id * 3600) AS ts",
            "cast(pmod(id * 7, 1000) AS double) / 8 AS x",
        )
    )


def multiset(df: DataFrame) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in df.collect()
    )


def same(ours: DataFrame, spark_own: DataFrame) -> None:
    got, want = multiset(ours), multiset(spark_own)
    assert want, "the comparison needs rows"
    assert got == want, (got - want, want - got)
    handle = shuffle_of(ours)
    assert handle.plan.hot_key_last  # grouped and cogrouped calls' map sides put a hot key last
    handle.release()


# -- grouped: pandas -----------------------------------------------------------------------------
STATS = "k int, s string, n long, total double, first_ts timestamp, day date"


def pandas_stats(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "k": [pdf["k"].iloc[0]],
            "s": [pdf["s"].iloc[0]],
            "n": [len(pdf)],
            "total": [pdf["x"].sum()],
            "first_ts": [pdf["ts"].min()],
            "day": [pdf["dt"].min()],
        }
    )


def pandas_keyed(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {"k": [key[0]], "s": [key[1]], "d": [key[2]], "n": [len(pdf)], "hour": [pdf["ts"].dt.hour.sum()]}
    )


def pandas_iter(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for pdf in batches:
        yield pdf[pdf["x"] > 60][["id", "k", "x"]]


def pandas_iter_keyed(key: tuple[Any, ...], batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    n = sum(len(pdf) for pdf in batches)
    yield pd.DataFrame({"dt": [key[0]], "n": [n]})


def test_apply_in_pandas_forms_equal_spark(spark: SparkSession) -> None:
    df = source(spark)
    same(
        group_by(df, "k", "s").applyInPandas(pandas_stats, STATS),
        df.groupBy("k", "s").applyInPandas(pandas_stats, STATS),
    )
    keyed = "k int, s string, d double, n long, hour long"
    same(
        group_by(df, ["k", "s", "d"]).applyInPandas(pandas_keyed, keyed),
        df.groupBy("k", "s", "d").applyInPandas(pandas_keyed, keyed),
    )
    same(
        group_by(df, "k").applyInPandas(pandas_iter, "id long, k int, x double"),
        df.groupBy("k").applyInPandas(pandas_iter, "id long, k int, x double"),
    )
    same(
        group_by(df, "dt").applyInPandas(pandas_iter_keyed, "dt date, n long"),
        df.groupBy("dt").applyInPandas(pandas_iter_keyed, "dt date, n long"),
    )


# -- grouped: Arrow ------------------------------------------------------------------------------
def arrow_stats(table: pa.Table) -> pa.Table:
    total = pc.sum(table["x"]).as_py()
    return pa.table({"n": pa.array([table.num_rows], pa.int64()), "total": pa.array([total], pa.float64())})


def arrow_keyed(key: tuple[pa.Scalar, ...], table: pa.Table) -> pa.Table:
    kinds = ",".join(type(v).__name__ for v in key)
    return pa.table(
        {
            "kinds": [kinds],
            "d": pa.array([key[0].as_py()], pa.float64()),
            "n": pa.array([table.num_rows], pa.int64()),
        }
    )


def arrow_iter(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    total = 0.0
    for batch in batches:
        total += pc.sum(batch["x"]).as_py() or 0.0
    yield pa.RecordBatch.from_pydict({"total": [total]}, schema=pa.schema([("total", pa.float64())]))


def arrow_iter_keyed(
    key: tuple[pa.Scalar, ...], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield pa.RecordBatch.from_arrays(
            [pa.array([key[0].as_py()] * batch.num_rows, pa.string()), batch["id"]], names=["s", "id"]
        )


def test_apply_in_arrow_forms_equal_spark(spark: SparkSession) -> None:
    df = source(spark)
    schema = "n long, total double"
    same(
        group_by(df, "k", "dt").applyInArrow(arrow_stats, schema),
        df.groupBy("k", "dt").applyInArrow(arrow_stats, schema),
    )
    keyed = "kinds string, d double, n long"
    same(
        group_by(df, "d", "k").applyInArrow(arrow_keyed, keyed),
        df.groupBy("d", "k").applyInArrow(arrow_keyed, keyed),
    )
    same(
        group_by(df, "s").applyInArrow(arrow_iter, "total double"),
        df.groupBy("s").applyInArrow(arrow_iter, "total double"),
    )
    same(
        group_by(df, "s").applyInArrow(arrow_iter_keyed, "s string, id long"),
        df.groupBy("s").applyInArrow(arrow_iter_keyed, "s string, id long"),
    )


# -- cogroup -------------------------------------------------------------------------------------
def right_side(spark: SparkSession) -> DataFrame:
    """Keys 5..14 and null: some only here, some only on the left."""
    return spark.range(0, 300, numPartitions=3).selectExpr(
        "CASE WHEN id % 31 = 0 THEN NULL ELSE cast(5 + pmod(id, 10) AS int) END AS key",
        "cast(id AS double) AS y",
    )


def cogroup_pandas(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "nl": [len(left)],
            "nr": [len(right)],
            "cols": [",".join(left.columns) + "|" + ",".join(right.columns)],
        }
    )


def cogroup_pandas_keyed(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [key[0]], "sx": [left["x"].sum()], "sy": [right["y"].sum()]})


def cogroup_arrow(left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {"nl": pa.array([left.num_rows], pa.int64()), "nr": pa.array([right.num_rows], pa.int64())}
    )


def cogroup_arrow_keyed(key: tuple[pa.Scalar, ...], left: pa.Table, right: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([key[0].as_py()], pa.int32()),
            "n": pa.array([left.num_rows + right.num_rows], pa.int64()),
        }
    )


def test_cogroup_forms_equal_spark(spark: SparkSession) -> None:
    left, right = source(spark, 600), right_side(spark)
    ours = group_by(left, "k").cogroup(group_by(right, "key"))
    theirs = left.groupBy("k").cogroup(right.groupBy("key"))
    schema = "nl long, nr long, cols string"
    same(ours.applyInPandas(cogroup_pandas, schema), theirs.applyInPandas(cogroup_pandas, schema))
    schema = "k int, sx double, sy double"
    same(ours.applyInPandas(cogroup_pandas_keyed, schema), theirs.applyInPandas(cogroup_pandas_keyed, schema))
    same(
        ours.applyInArrow(cogroup_arrow, "nl long, nr long"),
        theirs.applyInArrow(cogroup_arrow, "nl long, nr long"),
    )
    same(
        ours.applyInArrow(cogroup_arrow_keyed, "k int, n long"),
        theirs.applyInArrow(cogroup_arrow_keyed, "k int, n long"),
    )


# -- the rest ------------------------------------------------------------------------------------
def doubled(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for pdf in frames:
        yield pdf.assign(x=pdf["x"] * 2)[["k", "x", "ts"]]


def test_map_in_pandas_chained_and_empty_input_equal_spark(spark: SparkSession) -> None:
    df = source(spark, 1_000)
    schema = "k int, x double, ts timestamp"
    ours = group_by(map_in_pandas(df, doubled, schema), "k").applyInPandas(
        pandas_max_x, "k int, x double, ts timestamp"
    )
    same(
        ours,
        df.mapInPandas(doubled, schema)
        .groupBy("k")
        .applyInPandas(pandas_max_x, "k int, x double, ts timestamp"),
    )
    empty = df.filter("id < 0")
    got = group_by(empty, "k").applyInPandas(pandas_stats, STATS)
    assert got.collect() == empty.groupBy("k").applyInPandas(pandas_stats, STATS).collect() == []
    shuffle_of(got).release()


def pandas_max_x(pdf: pd.DataFrame) -> pd.DataFrame:
    return pdf.sort_values(["x", "ts"]).tail(1)  # one row whatever order the group came in


def wrong_columns(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [1], "other": [2.0]})


def test_a_bad_result_fails_naming_the_group_and_the_columns(spark: SparkSession) -> None:
    bad = group_by(source(spark, 300), "k").applyInPandas(wrong_columns, "k int, x double")
    with pytest.raises(
        PythonException, match=r"key group \(k=.*\) of partition \d+.*Missing: x\. Unexpected: other\."
    ):
        bad.collect()
    shuffle_of(bad).release()
