"""Arrow shuffle for PySpark DataFrames: ``repartition``, ``group_apply``, ``partition_apply``,
``map_in_arrow``.

The driver side's public calls. Each builds one lazy plan (``planning``) and returns a DataFrame::

    df.mapInArrow(map_fn, STATUS)              map stage: rows -> map-output files in the agents
      .repartition(R, "rk")                    Spark shuffles only the tiny status rows
      .mapInArrow(reduce_fn, schema)           reduce stage: Arrow straight from the files/agents

so the data goes Python -> Arrow IPC -> Python with no JVM rows in between, while Spark's own
scheduler tracks map outputs (one status per map partition), runs the stages and recomputes lost
map partitions (``worker.reduce_task``). That is ``mode="materialized"`` (the default: map outputs
materialized as files, what Flink calls a BLOCKING result; ``"blocking"`` is a deprecated alias).
``mode="pipelined"`` runs map and reduce tasks in one stage, streaming under credits
(``worker.pipelined``). A DataFrame made by ``map_in_arrow`` is *chained*: its function runs inside
the map task, so generated batches never become JVM rows at all.

Each call first decides its exchange (``route``: arrowbeat's or Spark's own); ``shuffle_of(out)``
(``handle``) is the shuffle's handle, whose ``release()`` deletes its map outputs and writes its
``shuffle_metrics`` rows. A bad setting raises ``ConfigError`` naming the key and the expected form;
a bad call argument (unknown column, ``num_partitions=0``, unknown mode) raises the engine's
``ShuffleConfigError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.shuffle.driver.handle import ShuffleHandle, release, shuffle_of
from spark_plugin.shuffle.driver.planning import _build, _partitions, _routed_out, _size, _struct
from spark_plugin.shuffle.driver.route import (
    routed,
    spark_group_apply,
    spark_partition_apply,
    spark_repartition,
)
from spark_plugin.shuffle.driver.session import SessionView
from spark_plugin.shuffle.driver.shuffle_settings import check_mode
from spark_plugin.shuffle.worker.reduce_task import (
    group_consumer,
    partition_consumer,
    passthrough,
)

log = logging.getLogger("arrowbeat.shuffle")


def map_in_arrow(
    df: DataFrame,
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
) -> DataFrame:
    """``df.mapInArrow(func, schema)`` that an arrowbeat shuffle after it *chains*.

    The result is an ordinary DataFrame. When it is the input of ``repartition``,
    ``group_apply`` or ``partition_apply``, the map task runs ``func`` and the shuffle write in
    one Python worker (Flink's operator chaining), so its batches never become JVM rows."""
    out = df.mapInArrow(func, schema)
    out._arrowbeat_chain = (df, func)  # type: ignore[attr-defined]
    return out


def map_in_pandas(
    df: DataFrame,
    func: Callable[[Iterator[Any]], Iterator[Any]],
    schema: StructType | str,
) -> DataFrame:
    """``df.mapInPandas(func, schema)`` that an arrowbeat shuffle after it *chains*, as
    ``map_in_arrow``: inside the map task, its frames are converted as Spark converts them
    (``compat.pandas_udf``) and go to the shuffle without becoming JVM rows."""
    from spark_plugin.shuffle.driver.session import pandas_conversion
    from spark_plugin.shuffle.worker.grouped_map import pandas_batches

    out = df.mapInPandas(func, schema)
    declared = out.schema
    out._arrowbeat_chain = (  # type: ignore[attr-defined]
        df,
        pandas_batches(func, declared, to_arrow_schema(declared), pandas_conversion(df.sparkSession)),
    )
    return out


def repartition(
    df: DataFrame,
    num_partitions: int | None,
    *key_columns: str,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.repartition(num_partitions, *key_columns)``: same rows, each key in one partition.

    ``num_partitions=None`` is ``df.repartition(*key_columns)``: Spark's partition count as the
    upper bound, coalesced by size once the map side has run (``spark.arrowbeat.shuffle.adaptive``);
    an explicit count is kept exactly, as Spark keeps it. ``path``: ``auto``, ``arrowbeat`` or
    ``spark`` (None: ``spark.arrowbeat.shuffle.path``, arrowbeat's when unset; see ``route``)."""
    mode = check_mode(mode)
    view = SessionView.of(df.sparkSession)  # resolved once, passed down
    route = routed(df, "partition", path, num_partitions is not None, session=view)
    if route is not None and route.path == "spark":
        return _routed_out(spark_repartition(df, num_partitions, key_columns), route)
    session, plan, adaptive = _partitions(
        df, num_partitions, key_columns, mode, exact=True, size=_size(route), session=view
    )
    return _routed_out(_build(df, session, plan, mode, passthrough, df.schema, adaptive), route)


def partition_apply(
    df: DataFrame,
    num_partitions: int | None,
    key_columns: Sequence[str],
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.repartition(n, *keys).mapInArrow(func, schema)`` without Arrow -> JVM -> Arrow between.

    ``func`` runs once per reduce task, on every row of its partitions; partition counts as for
    ``repartition`` (``path`` too)."""
    mode = check_mode(mode)
    view = SessionView.of(df.sparkSession)  # resolved once, passed down
    route = routed(df, "partition", path, num_partitions is not None, session=view)
    if route is not None and route.path == "spark":
        out = spark_partition_apply(df, num_partitions, list(key_columns), func, schema)
        return _routed_out(out, route)
    session, plan, adaptive = _partitions(
        df, num_partitions, list(key_columns), mode, exact=True, size=_size(route), session=view
    )
    out_schema = _struct(session, schema)
    consume = partition_consumer(func, to_arrow_schema(out_schema))
    return _routed_out(_build(df, session, plan, mode, consume, out_schema, adaptive), route)


def group_apply(
    df: DataFrame,
    key_columns: Sequence[str],
    func: Callable[[pa.Table], pa.Table],
    schema: StructType | str,
    num_partitions: int | None = None,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.groupBy(*keys).applyInArrow(func, schema)``: ``func`` once per key group.

    Groups are found in Arrow in the reduce task (``grouping.iter_groups``), not by a JVM sort.
    ``num_partitions`` (default: Spark's) is an upper bound: with ``spark.arrowbeat.shuffle.adaptive``
    on (by default when AQE is) the map side runs when this is called and contiguous reduce
    partitions are packed into tasks by their real sizes, as AQE packs a ``groupBy``'s. ``path``:
    ``auto`` (Spark's ``applyInArrow`` for inputs measured faster there), ``arrowbeat`` or ``spark``
    (None: ``spark.arrowbeat.shuffle.path``, arrowbeat's when unset; see ``route``)."""
    mode = check_mode(mode)
    view = SessionView.of(df.sparkSession)  # resolved once, passed down
    route = routed(df, "group", path, num_partitions is not None, session=view)
    if route is not None and route.path == "spark":
        out = spark_group_apply(df, list(key_columns), func, schema, num_partitions)
        return _routed_out(out, route)
    session, plan, adaptive = _partitions(
        df, num_partitions, list(key_columns), mode, exact=False, size=_size(route), session=view
    )
    plan = replace(plan, hot_key_last=True)
    out_schema = _struct(session, schema)
    out_arrow = to_arrow_schema(out_schema)
    consume = group_consumer(
        func,
        plan.key_columns,
        plan.schema,
        out_arrow,
        memory_bytes=plan.reduce_memory_bytes,
        partitions=plan.num_partitions,
    )
    return _routed_out(_build(df, session, plan, mode, consume, out_schema, adaptive), route)


__all__ = [
    "ShuffleHandle",
    "group_apply",
    "map_in_arrow",
    "map_in_pandas",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]
