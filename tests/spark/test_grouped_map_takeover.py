"""``spark.arrowbeat.shuffle.groupedMap`` on real Spark: an application's unchanged
``groupBy().applyInPandas`` / ``cogroup().applyInArrow`` run on arrowbeat's shuffle when the key is
on (toggled per query with ``spark.conf.set``), return Spark's rows, and say so in the plan the
user sees (``explain()``) and in the shuffle's task reports; with the key off the plan is Spark's;
forms arrowbeat does not take over stay Spark's with one log line.

The run's shared ``shuffle_cluster`` (two executors). The hook is in this process from start-up,
as in a user's: the checkout's editable install carries the wheel's ``arrowbeat.pth``
(``tests/test_dev_install.py``; ``tests/spark/test_dev_install_takeover.py`` runs such a job from a
script of its own).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import UnsupportedOperationException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_plugin.compat import grouped_map_hook as hook
from spark_plugin.shuffle import shuffle_of
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(shuffle_cluster: ShuffleCluster) -> Iterator[SparkSession]:
    """The shared session, PySpark's grouped-map methods wrapped since start-up; the key off between
    tests, as the shared application was made (``harness.session.build_session``): unset, it would
    fall back to ``auto`` and take over later modules' Spark baselines."""
    import pyspark.sql.classic.dataframe as frames
    import pyspark.sql.pandas.group_ops as ops

    methods = (
        frames.DataFrame.groupBy,
        ops.PandasGroupedOpsMixin.applyInPandas,
        ops.PandasCogroupedOps.applyInArrow,
    )
    assert all(hook.is_wrapped(m) for m in methods), "no arrowbeat.pth in this venv: rerun make setup"
    try:
        yield shuffle_cluster.spark
    finally:
        shuffle_cluster.spark.conf.set(hook.KEY, "off")


@pytest.fixture
def mode(spark: SparkSession) -> Iterator[Any]:
    def set_mode(value: str) -> None:
        spark.conf.set(hook.KEY, value)

    try:
        yield set_mode
    finally:
        spark.conf.set(hook.KEY, "off")


def source(spark: SparkSession, rows: int = 2_000) -> DataFrame:
    return spark.range(0, rows, numPartitions=3).selectExpr(
        "CASE WHEN id % 13 = 0 THEN NULL ELSE cast(pmod(id, 7) AS int) END AS k", "cast(id AS double) AS v"
    )


def stats(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)], "total": [float(pdf["v"].sum())]})


STATS = "k int, n long, total double"


def plan_of(df: DataFrame, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    df.explain()
    return capsys.readouterr().out


def rows(df: DataFrame) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in df.collect())


def test_an_unchanged_apply_in_pandas_runs_on_arrowbeats_shuffle_when_on(
    spark: SparkSession, mode: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    df = source(spark)
    mode("off")
    sparks = df.groupBy("k").applyInPandas(stats, STATS)
    spark_plan = plan_of(sparks, capsys)
    assert "FlatMapGroupsInPandas" in spark_plan and "arrowbeat" not in spark_plan
    mode("on")
    ours = df.groupBy("k").applyInPandas(stats, STATS)  # the same line, unchanged
    our_plan = plan_of(ours, capsys)
    assert "FlatMapGroupsInPandas" not in our_plan
    assert "arrowbeat_shuffle_write" in our_plan and "arrowbeat_shuffle_read" in our_plan, our_plan
    want = rows(sparks)
    assert rows(ours) == want and len(want) == 8  # keys 0-6 and null
    handle = shuffle_of(ours)
    sides = Counter(r["side"] for r in handle.reports())
    assert sides["write"] == 3 and sides["read"] >= 1, sides
    assert sum(r["rows"] for r in handle.reports() if r["side"] == "read") == 2_000
    handle.release()


def test_a_cogroup_in_arrow_with_column_objects_is_taken_over(
    spark: SparkSession, mode: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    left = source(spark, 900)
    right = source(spark, 500).withColumnRenamed("k", "key")

    def merge(key: tuple[Any, ...], l: pa.Table, r: pa.Table) -> pa.Table:  # noqa: E741
        total = (pc.sum(l["v"]).as_py() or 0.0) + (pc.sum(r["v"]).as_py() or 0.0)
        return pa.table(
            {"k": pa.array([key[0].as_py()], pa.int32()), "n": [l.num_rows + r.num_rows], "total": [total]}
        )

    def run() -> DataFrame:
        return left.groupBy(F.col("k")).cogroup(right.groupBy(right.key)).applyInArrow(merge, STATS)

    sparks = run()
    mode("on")
    ours = run()
    assert "arrowbeat_shuffle_read" in plan_of(ours, capsys)
    assert rows(ours) == rows(sparks)
    shuffle_of(ours).release()


def test_auto_leaves_a_tiny_input_to_spark_and_takes_a_large_one(
    spark: SparkSession, mode: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """By the optimizer's size of the input (``route``): planned only, never run (the large input
    is a ``range`` of 50 M rows, sized without reading it; no adaptive map job at planning)."""
    mode("auto")
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        tiny = source(spark).groupBy("k").applyInPandas(stats, STATS)
    (line,) = [r.message for r in caplog.records]
    assert "groupedMap=auto chose Spark's exchange" in line, line
    assert "FlatMapGroupsInPandas" in plan_of(tiny, capsys)
    spark.conf.set("spark.arrowbeat.shuffle.adaptive", "false")
    try:
        large = spark.range(0, 50_000_000).selectExpr("id % 7 AS k", "cast(id AS double) AS v")
        taken = large.groupBy("k").applyInPandas(stats, "k long, n long, total double")
    finally:
        spark.conf.unset("spark.arrowbeat.shuffle.adaptive")
    assert "arrowbeat_shuffle_read" in plan_of(taken, capsys)
    shuffle_of(taken).release()


def test_forms_arrowbeat_does_not_take_stay_sparks_with_one_log_line(
    spark: SparkSession, mode: Any, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    mode("on")
    df = source(spark)
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        by_expression = df.groupBy((F.col("k") % 2).alias("k")).applyInPandas(stats, STATS)
    (line,) = [r.message for r in caplog.records]
    assert "grouping by an expression" in line and "applyInPandas(stats)" in line, line
    assert "FlatMapGroupsInPandas" in plan_of(by_expression, capsys)

    def count(key: Any, frames: Any, state: Any) -> Any:
        yield pd.DataFrame({"k": [key[0]], "n": [sum(len(f) for f in frames)]})

    caplog.clear()
    with caplog.at_level(logging.INFO, logger=hook.__name__):
        stateful = df.groupBy("k").applyInPandasWithState(
            count, "k int, n long", "n long", "Update", "NoTimeout"
        )
    (line,) = [r.message for r in caplog.records]
    assert "applyInPandasWithState" in line and "state store" in line, line
    # Spark's own method made it: Spark's analyzer answers a batch query as it does without arrowbeat.
    with pytest.raises(UnsupportedOperationException, match="applyInPandasWithState is unsupported in batch"):
        plan_of(stateful, capsys)
