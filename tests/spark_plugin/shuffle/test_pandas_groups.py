"""Whole-group pandas functions converted per run of groups (``shuffle.pandas_groups``) see the
frames, return the rows and raise the errors that converting group by group gives."""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from arrow_shuffle.errors import SchemaMismatchError
from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.compat.pandas_udf import PandasConversion
from spark_plugin.shuffle.worker.grouped_map import (
    FunctionForm,
    GroupedCall,
    conform_pandas,
    grouped_consumer,
    run_group,
)
from spark_plugin.shuffle.worker.grouping import group_bounds, iter_groups
from spark_plugin.shuffle.worker.pandas_groups import chunks, pandas_group_results

# PySpark's own pandas converters run here, which differ between its minors and pandas 2 and 3:
# every cell of the version matrix runs these (no JVM, a few seconds).
pytestmark = pytest.mark.compat

OUT = StructType([StructField("k", LongType()), StructField("n", LongType()), StructField("s", DoubleType())])
CONV = PandasConversion(timezone="UTC")


def rows(n: int = 400, keys: int = 37, seed: int = 3, nulls: bool = True) -> pa.Table:
    """Groups of uneven sizes, nulls in an int column of some groups only (``nulls``), strings,
    timestamps."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, n)
    k[:150] = 5  # one group larger than the small runs below
    i = pa.array(rng.integers(0, 100, n), mask=(k % 7 == 0) & (rng.random(n) < 0.5) & nulls)
    return pa.table(
        {
            "k": pa.array(k, pa.int64()),
            "i": i,
            "x": rng.normal(size=n),
            "s": pa.array([None if v % 5 == 0 else f"é{v}" for v in k]),
            "t": pa.array(
                [
                    datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=int(v))
                    for v in k
                ],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def call_of(func: Any, takes_key: bool = False, out: StructType = OUT) -> GroupedCall:
    return GroupedCall(func, FunctionForm("pandas", takes_key), out, to_arrow_schema(out), CONV)


def per_group(call: GroupedCall, table: pa.Table) -> pa.Table:
    """The reference: each group converted alone (``run_group``)."""
    out = [b for g in iter_groups(table, ["k"]) for b in run_group(call, g, ["k"], "w")]
    return pa.Table.from_batches(
        [b for t in out for b in (t.to_batches() if isinstance(t, pa.Table) else [t])]
    )


def chunked(call: GroupedCall, table: pa.Table, chunk_rows: int) -> pa.Table:
    def where(group: pa.Table) -> str:
        return f"key group (k={group.column('k')[0].as_py()}) of partition 3"

    batches = pandas_group_results(call, table, ["k"], conform_pandas, where, chunk_rows)
    return pa.Table.from_batches(list(batches), schema=call.out_arrow)


def test_runs_hold_whole_groups_and_a_large_group_stands_alone() -> None:
    bounds = np.array([0, 10, 20, 200, 210, 215])
    assert list(chunks(bounds, 50)) == [(0, 2), (2, 3), (3, 5)]
    assert list(chunks(bounds, 1000)) == [(0, 5)]
    assert list(chunks(np.array([0]), 10)) == []


@pytest.mark.parametrize("chunk_rows", [1, 60, 100_000])
@pytest.mark.parametrize("nulls", [True, False])
def test_the_function_sees_the_frames_per_group_conversion_gives(chunk_rows: int, nulls: bool) -> None:
    table = rows(nulls=nulls)
    seen: dict[str, list[pd.DataFrame]] = {"alone": [], "run": []}

    def record(into: str) -> Any:
        def f(pdf: pd.DataFrame) -> pd.DataFrame:
            seen[into].append(pdf)
            pdf["x"] = 0.0  # writing to its frame must not reach another group's
            return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)], "s": [float(pdf["i"].sum())]})

        return f

    want = per_group(call_of(record("alone")), table)
    got = chunked(call_of(record("run")), table, chunk_rows)
    assert got.equals(want)
    assert len(seen["run"]) == len(seen["alone"]) == len(np.unique(table.column("k")))
    for a, b in zip(seen["run"], seen["alone"], strict=True):
        pd.testing.assert_frame_equal(a, b)  # dtypes too: an int column with a null is float64 only there


def test_results_of_other_dtypes_per_group_convert_as_they_would_alone() -> None:
    def uneven(pdf: pd.DataFrame) -> pd.DataFrame:
        k = int(pdf["k"].iloc[0])
        s: Any = [float(len(pdf))] if k % 2 else [len(pdf)]  # float64 in some groups, int64 in others
        return pd.DataFrame({"n": [len(pdf)], "k": [k], "s": s})  # columns by name, other order

    table = rows()
    assert chunked(call_of(uneven), table, 1000).equals(per_group(call_of(uneven), table))


def test_string_results_and_the_key_form() -> None:
    out = StructType([StructField("k", LongType()), StructField("s", StringType())])

    def keyed(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
        # An object column: a null first value is NaN under pandas 3, and a float column declared
        # string fails pyspark 4.0/4.1's own converter (Spark's applyInPandas alike).
        return pd.DataFrame({"k": [key[0]], "s": pd.Series([pdf["s"].iloc[0]], dtype=object)})

    table = rows()
    call = call_of(keyed, takes_key=True, out=out)
    assert chunked(call, table, 1000).equals(per_group(call, table))


def test_a_bad_result_names_its_group_as_alone() -> None:
    def bad(pdf: pd.DataFrame) -> pd.DataFrame:
        k = int(pdf["k"].iloc[0])
        return pd.DataFrame({"k": [k], "n": [1], "s": ["not a number" if k == 11 else 1.0]})

    with pytest.raises(SchemaMismatchError, match=r"key group \(k=11\) of partition 3"):
        chunked(call_of(bad), rows(nulls=False), 100_000)


def test_the_consumer_takes_this_path_for_whole_group_pandas_functions() -> None:
    def stats(pdf: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)], "s": [pdf["x"].sum()]})

    table = rows()
    consume = grouped_consumer(call_of(stats), ["k"], table.schema)
    got = pa.Table.from_batches(list(consume(0, iter(table.to_batches(max_chunksize=50)))))
    assert got.equals(per_group(call_of(stats), table))
    ordered, bounds = group_bounds(table, ["k"])
    assert got.column("n").to_pylist() == np.diff(bounds).tolist()
    assert ordered.num_rows == table.num_rows
