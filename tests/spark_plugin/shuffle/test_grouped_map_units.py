"""The grouped-map function forms without Spark: which form a function is called in (Spark's
rules: positional parameter count, iterator type hints), the key each form gets, result checks,
cogroups of keys on one side only, and the pandas <-> Arrow conversion (PySpark's own)."""

from __future__ import annotations

import datetime
import decimal
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from arrow_shuffle.errors import SchemaMismatchError, ShuffleConfigError
from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.compat.pandas_udf import PandasConversion, to_arrow, to_pandas
from spark_plugin.shuffle.worker.grouped_map import (
    FunctionForm,
    GroupedCall,
    cogrouped_consumer,
    form_of,
    grouped_consumer,
    pandas_batches,
)
from spark_plugin.shuffle.worker.grouping import iter_cogroups
from spark_plugin.shuffle.worker.reduce_spill import spilled_bytes
from tests.spark_plugin.shuffle.reduce_inputs import read_as_reducer


# -- which form ----------------------------------------------------------------------------------
def one(pdf):
    return pdf


def two(key, pdf):
    return pdf


def arrow_iter(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def arrow_iter_keyed(
    key: tuple[pa.Scalar, ...], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    yield from batches


def pandas_iter(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    yield from frames


def table_hinted(table: pa.Table) -> pa.Table:
    return table


def half_hinted(batches: Iterator[pa.RecordBatch]):
    yield from batches


def test_the_parameter_count_says_whether_the_key_comes_first() -> None:
    assert form_of(one, "pandas") == FunctionForm("pandas", takes_key=False)
    assert form_of(two, "arrow") == FunctionForm("arrow", takes_key=True)
    assert form_of(lambda pdf, extra=1: pdf, "pandas").takes_key  # Spark counts defaults too
    assert form_of(lambda left, right: left, "arrow", cogroup=True) == FunctionForm("arrow", False)
    assert form_of(lambda key, left, right: left, "pandas", cogroup=True).takes_key
    assert not form_of(functools.partial(two, None), "pandas").takes_key  # bound: one left


@pytest.mark.parametrize(
    ("func", "cogroup"),
    [(lambda: None, False), (lambda a, b, c: None, False), (lambda a: a, True), (lambda *a: a, False)],
)
def test_a_parameter_count_spark_refuses_is_refused_when_called(func: Any, cogroup: bool) -> None:
    with pytest.raises(ShuffleConfigError, match="positional arguments"):
        form_of(func, "pandas", cogroup=cogroup)


def test_iterator_hints_choose_the_iterator_form_as_in_spark() -> None:
    assert form_of(arrow_iter, "arrow") == FunctionForm("arrow", False, iterator=True)
    assert form_of(arrow_iter_keyed, "arrow") == FunctionForm("arrow", True, iterator=True)
    assert form_of(pandas_iter, "pandas") == FunctionForm("pandas", False, iterator=True)
    assert not form_of(table_hinted, "arrow").iterator
    assert not form_of(half_hinted, "arrow").iterator  # no return hint: the whole group
    assert not form_of(arrow_iter, "pandas").iterator  # batches are not frames
    assert not form_of(lambda left, right: left, "arrow", cogroup=True).iterator


# -- the reduce side over a fake partition -------------------------------------------------------
IN = pa.schema([("k", pa.int32()), ("s", pa.string()), ("x", pa.float64())])
ROWS = pa.table(
    {
        "k": pa.array([1, None, 1, 2, None, 1], pa.int32()),
        "s": ["a", "b", None, "a", "b", None],
        "x": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    },
    schema=IN,
)


def call_of(func: Any, api: str, schema: StructType, cogroup: bool = False, **kw: Any) -> GroupedCall:
    return GroupedCall(
        func, form_of(func, api, cogroup), schema, to_arrow_schema(schema), PandasConversion(**kw), 2
    )


def run(call: GroupedCall, keys: list[str], table: pa.Table = ROWS) -> list[dict[str, Any]]:
    out = list(grouped_consumer(call, keys, table.schema)(0, iter(table.to_batches(max_chunksize=2))))
    return sorted(pa.Table.from_batches(out, schema=call.out_arrow).to_pylist(), key=repr) if out else []


KEYED = StructType([StructField("key", StringType()), StructField("n", LongType())])


def test_arrow_keys_are_scalars_and_pandas_keys_numpy_values_nulls_included() -> None:
    def arrow_keyed(key: tuple[Any, ...], table: pa.Table) -> pa.Table:
        assert all(isinstance(v, pa.Scalar) for v in key)
        return pa.table(
            {"key": [repr(tuple(v.as_py() for v in key))], "n": pa.array([table.num_rows], pa.int64())}
        )

    def pandas_keyed(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
        # A null key is pandas' missing value of its column (NaN, None: which depends on pandas).
        names = tuple("null" if pd.isna(v) else type(v).__name__ for v in key)
        return pd.DataFrame({"key": [repr(names)], "n": [len(pdf)]})

    assert run(call_of(arrow_keyed, "arrow", KEYED), ["k"]) == [
        {"key": "(1,)", "n": 3},
        {"key": "(2,)", "n": 1},
        {"key": "(None,)", "n": 2},
    ]
    # Each group is converted on its own, as Spark converts it: an int key reaches pandas as a
    # numpy int32 (the column is float64 only in a group with nulls).
    assert run(call_of(pandas_keyed, "pandas", KEYED), ["k", "s"]) == [
        {"key": "('int32', 'null')", "n": 2},
        {"key": "('int32', 'str')", "n": 1},
        {"key": "('int32', 'str')", "n": 1},
        {"key": "('null', 'str')", "n": 2},
    ]


def test_the_iterator_form_gets_batches_of_at_most_max_records() -> None:
    sizes = StructType([StructField("n", LongType())])

    def sizes_of(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([batch.num_rows], pa.int64())})

    assert [r["n"] for r in run(call_of(sizes_of, "arrow", sizes), ["s"])] == [2, 2, 2]  # a, b, null
    assert sorted(r["n"] for r in run(call_of(sizes_of, "arrow", sizes), ["k"])) == [1, 1, 2, 2]  # k=1: 2+1


def test_results_match_by_name_or_position_as_configured() -> None:
    schema = StructType([StructField("n", LongType()), StructField("key", StringType())])

    def swapped(table: pa.Table) -> pa.Table:
        return pa.table({"key": ["x"], "n": pa.array([table.num_rows], pa.int64())})

    assert {r["n"] for r in run(call_of(swapped, "arrow", schema), ["k"])} == {1, 2, 3}
    with pytest.raises(SchemaMismatchError, match=r"column 'n' \(expected int64, actual string\)"):
        run(call_of(swapped, "arrow", schema, assign_cols_by_name=False), ["k"])


def test_bad_results_name_the_group_and_the_columns() -> None:
    def frame(pdf: pd.DataFrame) -> Any:
        return pd.DataFrame({"key": ["x"], "extra": [1]})

    with pytest.raises(
        SchemaMismatchError, match=r"key group \(k=1\) of partition 0.*Missing: n\. Unexpected: extra\."
    ):
        run(call_of(frame, "pandas", KEYED), ["k"])
    with pytest.raises(SchemaMismatchError, match=r"must return a pyarrow\.Table, not DataFrame"):
        run(call_of(lambda t: t.to_pandas(), "arrow", KEYED), ["k"])
    with pytest.raises(SchemaMismatchError, match=r"must return a pandas\.DataFrame, not Table"):
        run(call_of(lambda pdf: pa.table({"a": [1]}), "pandas", KEYED), ["k"])


def test_empty_results_and_empty_partitions_give_no_rows() -> None:
    assert run(call_of(lambda pdf: pd.DataFrame(), "pandas", KEYED), ["k"]) == []
    assert run(call_of(lambda t: pa.table({}), "arrow", KEYED), ["k"]) == []
    assert run(call_of(one, "pandas", KEYED), ["k"], ROWS.slice(0, 0)) == []


# -- cogroups ------------------------------------------------------------------------------------
RIGHT = pa.table({"key": pa.array([2, 3, None], pa.int32()), "y": ["p", "q", "r"]})


def test_a_key_on_one_side_only_meets_an_empty_table_with_its_columns() -> None:
    pairs = {
        (lg["k"][0].as_py() if lg.num_rows else rg["key"][0].as_py()): (
            lg.num_rows,
            rg.num_rows,
            rg.schema.names,
        )
        for lg, rg in iter_cogroups(ROWS, ["k"], RIGHT, ["key"])
    }
    assert pairs == {
        1: (3, 0, ["key", "y"]),
        2: (1, 1, ["key", "y"]),
        3: (0, 1, ["key", "y"]),
        None: (2, 1, ["key", "y"]),
    }


def test_cogroup_keys_come_from_the_left_unless_it_is_empty() -> None:
    schema = StructType([StructField("key", StringType()), StructField("n", LongType())])

    def keyed(key: tuple[Any, ...], left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {"key": [f"{key[0]}:{list(left.columns)}:{list(right.columns)}"], "n": [len(left) + len(right)]}
        )

    consume = cogrouped_consumer(
        call_of(keyed, "pandas", schema, cogroup=True), ["k"], IN, ["key"], RIGHT.schema
    )
    out = pa.Table.from_batches(
        list(consume(0, iter(ROWS.to_batches()), iter(RIGHT.to_batches())))
    ).to_pylist()
    assert sorted(r["key"] for r in out) == [
        "1:['k', 's', 'x']:['key', 'y']",
        "2:['k', 's', 'x']:['key', 'y']",
        "3:['k', 's', 'x']:['key', 'y']",  # from the right: the left has no rows for 3
        "nan:['k', 's', 'x']:['key', 'y']",  # the left's null key (float64 NaN in pandas)
    ]


# -- a partition over shuffle.reduceMemory ------------------------------------------------------
def _many_keys(rows: int, keys: int, name: str = "k") -> pa.Table:
    ids = np.arange(rows, dtype=np.int64)
    return pa.table({name: pa.array((ids * 7919) % keys, pa.int32()), "x": pa.array(ids.astype(np.float64))})


def test_a_spilled_partition_gives_every_form_the_same_groups_as_one_in_memory(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``memory_bytes`` the consumer groups a spilled bucket at a time: the function still
    sees each key group once and whole (the per-key counts and sums are the in-memory ones)."""
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    table = _many_keys(60_000, 1_500)
    schema = StructType([StructField("key", StringType()), StructField("n", LongType())])

    def pandas_func(key: tuple[Any, ...], pdf: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"key": [f"{key[0]}:{pdf['x'].sum():.0f}"], "n": [len(pdf)]})

    def arrow_func(key: tuple[Any, ...], t: pa.Table) -> pa.Table:
        total = sum(t.column("x").to_pylist())
        return pa.table({"key": [f"{key[0].as_py()}:{total:.0f}"], "n": pa.array([t.num_rows], pa.int64())})

    for func, api in ((pandas_func, "pandas"), (arrow_func, "arrow")):
        call = call_of(func, api, schema)
        batches = read_as_reducer(table, 1000)
        whole = list(grouped_consumer(call, ["k"], table.schema)(0, iter(batches)))
        before = spilled_bytes()
        spilled = list(grouped_consumer(call, ["k"], table.schema, table.nbytes // 8)(0, iter(batches)))
        assert spilled_bytes() - before >= table.nbytes, api
        rows = [sorted(pa.Table.from_batches(out).to_pylist(), key=repr) for out in (whole, spilled)]
        assert len(rows[0]) == 1_500 and rows[1] == rows[0], api
    assert not any(tmp_path.iterdir())


def test_a_spilled_cogroup_meets_each_key_of_both_sides_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    left, right = _many_keys(40_000, 900), _many_keys(9_000, 1_200, name="key")
    schema = StructType([StructField("key", StringType()), StructField("n", LongType())])

    def sizes(key: tuple[Any, ...], lt: pa.Table, rt: pa.Table) -> pa.Table:
        return pa.table({"key": [str(key[0].as_py())], "n": pa.array([lt.num_rows * 100_000 + rt.num_rows])})

    call = call_of(sizes, "arrow", schema, cogroup=True)

    def out(memory: int | None) -> list[dict[str, Any]]:
        consume = cogrouped_consumer(call, ["k"], left.schema, ["key"], right.schema, memory)
        got = consume(0, iter(read_as_reducer(left, 700)), iter(read_as_reducer(right, 700)))
        return sorted(pa.Table.from_batches(list(got)).to_pylist(), key=repr)

    whole = out(None)
    before = spilled_bytes()
    spilled = out((left.nbytes + right.nbytes) // 10)
    assert spilled_bytes() - before >= left.nbytes + right.nbytes
    assert len(whole) == 1_200 and spilled == whole
    assert not any(tmp_path.iterdir())


# -- pandas <-> Arrow ----------------------------------------------------------------------------
def test_the_conversion_is_pysparks_with_the_session_zone() -> None:
    ts = pa.array([datetime.datetime(2024, 1, 1, 12), None], pa.timestamp("us", tz="UTC"))
    table = pa.table(
        {
            "i": pa.array([1, None], pa.int32()),
            "ts": ts,
            "d": pa.array([decimal.Decimal("1.50"), None], pa.decimal128(10, 2)),
            "day": pa.array([datetime.date(2024, 1, 1), None], pa.date32()),
        }
    )
    frame = to_pandas(table, PandasConversion(timezone="America/New_York"))
    assert frame["i"].dtype == np.float64 and np.isnan(frame["i"].iloc[1])
    assert frame["ts"].iloc[0] == pd.Timestamp("2024-01-01 07:00:00")  # naive New York time
    assert frame["d"].iloc[0] == decimal.Decimal("1.50") and frame["day"].iloc[0] == datetime.date(2024, 1, 1)
    schema = StructType(
        [
            StructField("day", DateType()),
            StructField("i", IntegerType()),
            StructField("ts", TimestampType()),
            StructField("d", DecimalType(10, 2)),
        ]
    )
    back = to_arrow(frame, schema, PandasConversion(timezone="America/New_York"))
    assert back.schema.names == ["day", "i", "ts", "d"]  # by name, in the declared order
    assert back.column("i").to_pylist() == [1, None]
    assert back.column("ts").cast(pa.timestamp("us", tz="UTC")).equals(ts)  # the same instants


def test_map_in_pandas_functions_run_as_arrow_batches() -> None:
    schema = StructType([StructField("x", DoubleType()), StructField("k", IntegerType())])

    def doubled(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for pdf in frames:
            yield pdf.assign(x=pdf["x"] * 2)[["k", "x"]]

    run_fn = pandas_batches(doubled, schema, to_arrow_schema(schema), PandasConversion())
    out = pa.Table.from_batches(list(run_fn(ROWS.to_batches(max_chunksize=4))))
    assert out.schema == to_arrow_schema(schema)
    assert out.column("x").to_pylist() == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]
    assert out.column("k").to_pylist() == [1, None, 1, 2, None, 1]
