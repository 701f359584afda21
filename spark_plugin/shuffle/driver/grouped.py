"""Spark's grouped-map API on the Arrow shuffle: ``group_by(df, *cols)`` and what it returns.

Spark::

    df.groupBy("k").applyInPandas(func, schema)
    df.groupBy("k").applyInArrow(func, schema)
    df1.groupBy("k").cogroup(df2.groupBy("k")).applyInPandas(func, schema)   # or applyInArrow

arrowbeat::

    group_by(df, "k").applyInPandas(func, schema)
    group_by(df, "k").applyInArrow(func, schema)
    group_by(df1, "k").cogroup(group_by(df2, "k")).applyInPandas(func, schema)

Same methods, same arguments, same function forms (``func(data)``, ``func(key, data)``, the
iterator form, ``func(left, right)``, ``func(key, left, right)``: ``grouped_map``), same result.
The rows cross one arrowbeat shuffle (``dataframe``: map tasks write Arrow, reduce tasks group in
Arrow) instead of Spark's exchange and sort. Grouping columns are names of ``df``'s columns
(Spark also takes expressions: add them as columns first).

A cogroup is one shuffle of both inputs: both map sides write under one shuffle id (the right
side's map partitions numbered from ``reduce_task.RIGHT_MAPS``), and each reduce task reads both
sides of its partitions. The n-th grouping column must have the same type on both sides (equal
keys of different types would hash apart); only ``mode="materialized"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.compat.plan_stats import PlanSize
from spark_plugin.shuffle.driver.handle import ShuffleHandle
from spark_plugin.shuffle.driver.planning import _build, _partitions, _struct, map_side, reduce_side
from spark_plugin.shuffle.driver.session import arrow_batch_rows, pandas_conversion
from spark_plugin.shuffle.driver.shuffle_settings import check_mode
from spark_plugin.shuffle.map_output import check_keys
from spark_plugin.shuffle.worker.grouped_map import GroupedCall, cogrouped_consumer, form_of, grouped_consumer
from spark_plugin.shuffle.worker.reduce_task import RIGHT_MAPS, cogroup_reduce_function


def group_by(
    df: DataFrame, *cols: str | Sequence[str], num_partitions: int | None = None, mode: str = "materialized"
) -> GroupedData:
    """``df.groupBy(*cols)`` for arrowbeat's shuffle: column names, or one list of them.

    ``num_partitions`` (default: Spark's ``spark.sql.shuffle.partitions``) is an upper bound,
    coalesced by real sizes as AQE coalesces a ``groupBy``'s (``spark.arrowbeat.shuffle.adaptive``);
    ``mode`` as for ``group_apply``."""
    names: list[str] = []
    for col in cols:
        if isinstance(col, str):
            names.append(col)
        elif isinstance(col, Sequence) and all(isinstance(c, str) for c in col):
            names.extend(col)
        else:
            raise ShuffleConfigError(f"group_by takes column names, not {type(col).__name__}")
    if not names:
        raise ShuffleConfigError("group_by needs at least one grouping column")
    return GroupedData(df, tuple(names), num_partitions, check_mode(mode))


class GroupedData:
    """A DataFrame grouped for arrowbeat's shuffle (``group_by``); Spark's ``GroupedData`` methods
    for grouped maps."""

    def __init__(self, df: DataFrame, keys: tuple[str, ...], num_partitions: int | None, mode: str) -> None:
        self.df = df
        self.keys = keys
        self.num_partitions = num_partitions
        self.mode = mode
        self.input_size: PlanSize | None = None
        """The optimizer's size of the input, when a caller read it already (``groupedMap=auto``'s
        route): planning the shuffle then does not read it again (4-8 ms)."""

    def applyInPandas(self, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
        """``GroupedData.applyInPandas``: ``func(pdf)``, ``func(key, pdf)`` or the iterator form."""
        return self._apply(func, schema, "pandas")

    def applyInArrow(self, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
        """``GroupedData.applyInArrow``: ``func(table)``, ``func(key, table)`` or the iterator form."""
        return self._apply(func, schema, "arrow")

    def cogroup(self, other: GroupedData) -> CoGroupedData:
        """``GroupedData.cogroup``: both DataFrames by their grouping columns, one shuffle."""
        if not isinstance(other, GroupedData):
            raise ShuffleConfigError(
                f"cogroup takes another arrowbeat group_by(...), not {type(other).__name__}"
            )
        if len(other.keys) != len(self.keys):
            raise ShuffleConfigError(
                "cogroup needs as many grouping columns on both sides: "
                f"{list(self.keys)} and {list(other.keys)}"
            )
        return CoGroupedData(self, other)

    def _apply(self, func: Callable[..., Any], schema: StructType | str, api: str) -> DataFrame:
        form = form_of(func, api)
        session, plan, adaptive = _partitions(
            self.df, self.num_partitions, list(self.keys), self.mode, exact=False, size=self.input_size
        )
        plan = replace(plan, hot_key_last=True)
        call = _call(func, form, session, schema)
        consume = grouped_consumer(
            call, plan.key_columns, plan.schema, plan.reduce_memory_bytes, partitions=plan.num_partitions
        )
        return _build(self.df, session, plan, self.mode, consume, call.out_schema, adaptive)


class CoGroupedData:
    """Two grouped DataFrames (``GroupedData.cogroup``); Spark's ``PandasCogroupedOps`` methods."""

    def __init__(self, left: GroupedData, right: GroupedData) -> None:
        self.left = left
        self.right = right
        self.input_size: PlanSize | None = None
        """Both inputs' size together, when a caller read it already (as ``GroupedData``'s)."""

    def applyInPandas(self, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
        """``PandasCogroupedOps.applyInPandas``: ``func(left, right)`` or ``func(key, left, right)``."""
        return self._apply(func, schema, "pandas")

    def applyInArrow(self, func: Callable[..., Any], schema: StructType | str) -> DataFrame:
        """``PandasCogroupedOps.applyInArrow``: ``func(left, right)`` or ``func(key, left, right)``."""
        return self._apply(func, schema, "arrow")

    def _apply(self, func: Callable[..., Any], schema: StructType | str, api: str) -> DataFrame:
        form = form_of(func, api, cogroup=True)
        left, right = self.left, self.right
        if "pipelined" in (left.mode, right.mode):
            raise ShuffleConfigError("a cogroup runs in mode='materialized' only")
        bound = left.num_partitions if right.num_partitions is None else right.num_partitions
        if left.num_partitions is not None and right.num_partitions is not None:
            bound = max(left.num_partitions, right.num_partitions)
        session, left_plan, adaptive = _partitions(
            left.df,
            bound,
            list(left.keys),
            "materialized",
            exact=False,
            size=self.input_size,
            others=[right.df],
        )
        left_plan = replace(left_plan, hot_key_last=True)
        right_schema = to_arrow_schema(right.df.schema)
        check_keys(right_schema, list(right.keys))
        for lk, rk in zip(left.keys, right.keys, strict=True):
            lt, rt = left_plan.schema.field(lk).type, right_schema.field(rk).type
            if lt != rt:
                raise ShuffleConfigError(
                    f"cogroup key {lk!r} is {lt} on the left but {rk!r} is {rt} on the right: equal keys of "
                    "different types would not meet; cast one side first"
                )
        right_plan = replace(
            left_plan, key_columns=tuple(right.keys), schema_ipc=right_schema.serialize().to_pybytes()
        )
        call = _call(func, form, session, schema)
        consume = cogrouped_consumer(
            call,
            left_plan.key_columns,
            left_plan.schema,
            right_plan.key_columns,
            right_schema,
            left_plan.reduce_memory_bytes,
            partitions=left_plan.num_partitions,
        )
        handle = ShuffleHandle(session, left_plan, "materialized")
        report = handle.reporter()
        statuses = map_side(left.df, left_plan, report, session=session).unionByName(
            map_side(right.df, right_plan, report, map_offset=RIGHT_MAPS, session=session)
        )
        reduce_fn = cogroup_reduce_function(left_plan, right_plan, report, consume)
        return reduce_side(session, left_plan, handle, statuses, reduce_fn, call.out_schema, adaptive)


def _call(func: Callable[..., Any], form: Any, session: Any, schema: StructType | str) -> GroupedCall:
    out_schema = _struct(session, schema)
    return GroupedCall(
        func=func,
        form=form,
        out_schema=out_schema,
        out_arrow=to_arrow_schema(out_schema),
        conversion=pandas_conversion(session),
        max_records_per_batch=arrow_batch_rows(session),
    )


__all__ = ["CoGroupedData", "GroupedData", "group_by"]
