"""Every key type Spark groups by, through arrowbeat's shuffle, against Spark's own ``groupBy``.

One ``local[2]`` session for the module (the driver's executor has an agent, which is all the
shuffle needs). The data is built as an Arrow table and handed to Spark as it is
(``createDataFrame`` of a ``pyarrow.Table`` keeps NaN payloads and the order of map entries), so
the keys hold what Spark's own grouping must reconcile: NaN with several payloads and signs,
-0.0 and 0.0, nulls, a null struct and a struct of nulls, unicode that differs only by
composition, decimals of several precisions, timestamps with and without a time zone, maps
with their entries in different orders.

For each key: ``group_apply`` with a per-group count and sum equals ``df.groupBy(key).agg(count,
sum)``, compared as multisets of rows (NaN made comparable, maps as sets of entries). Then
``repartition`` keeps each key in one partition, and a variant key (which Spark refuses to
group by) is refused by every arrowbeat call before any data moves.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import math
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from arrow_shuffle import ShuffleConfigError
from spark_plugin.shuffle import group_apply, partition_apply, repartition, shuffle_of

pytestmark = pytest.mark.spark
ROWS = 2400
D = decimal.Decimal
UTC = dt.UTC
NANS64 = [
    float(x)
    for x in np.array(
        [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF00000DEADBEEF], dtype=np.uint64
    ).view(np.float64)
]
NANS32 = [float(x) for x in np.array([0x7FC00000, 0xFFC00000, 0x7FC00001], dtype=np.uint32).view(np.float32)]
SIGNED = [0.0, -0.0, 1.5, -1.5, math.inf, -math.inf]
TIMES = [
    dt.datetime(2024, 2, 29, 12, 0, 0, 1),
    dt.datetime(1969, 12, 31, 23, 59, 59),
    dt.datetime(2024, 1, 1),
]
UNICODE = ["", "a", "A", "é", "é", "日本語", "🙂", "ß", "SS", "a\x00"]  # é composed and decomposed
PAIR = T.StructType([T.StructField("a", T.IntegerType()), T.StructField("b", T.StringType())])
INNER = T.StructType([T.StructField("x", T.DoubleType()), T.StructField("d", T.DateType())])
NESTED = T.StructType([T.StructField("s", INNER), T.StructField("m", T.DecimalType(20, 4))])

# key column -> (Spark type, Arrow type of the data handed to Spark, values; None added to each)
KEYS: dict[str, tuple[T.DataType, pa.DataType, list[Any]]] = {
    "byte": (T.ByteType(), pa.int8(), [-128, 127, 0, -1]),
    "short": (T.ShortType(), pa.int16(), [-32768, 32767, 0, 7]),
    "int": (T.IntegerType(), pa.int32(), [-(2**31), 2**31 - 1, 0, 42]),
    "long": (T.LongType(), pa.int64(), [-(2**63), 2**63 - 1, 0, 2**40]),
    "float": (T.FloatType(), pa.float32(), NANS32 + SIGNED),
    "double": (T.DoubleType(), pa.float64(), NANS64 + SIGNED + [1e-300]),
    "dec5_2": (T.DecimalType(5, 2), pa.decimal128(5, 2), [D("999.99"), D("-999.99"), D("0.10"), D("0")]),
    "dec18_4": (T.DecimalType(18, 4), pa.decimal128(18, 4), [D("12345678901234.5678"), D("-0.0001"), D("1")]),
    "dec38_10": (
        T.DecimalType(38, 10),
        pa.decimal128(38, 10),
        [D("9" * 28 + ".0123456789"), D("-1.5"), D("0")],
    ),
    "dec38_0": (
        T.DecimalType(38, 0),
        pa.decimal128(38, 0),
        [D(10**38 - 1), D(-(10**38) + 1), D(2**64), D(0)],
    ),
    "string": (T.StringType(), pa.string(), UNICODE),
    "binary": (T.BinaryType(), pa.binary(), [b"", b"\x00", b"\xff\xfe", "é".encode()]),
    "bool": (T.BooleanType(), pa.bool_(), [True, False]),
    "date": (T.DateType(), pa.date32(), [dt.date(2024, 2, 29), dt.date(1969, 12, 31), dt.date(1, 1, 1)]),
    "timestamp": (T.TimestampType(), pa.timestamp("us", "UTC"), [t.replace(tzinfo=UTC) for t in TIMES]),
    "timestamp_ntz": (T.TimestampNTZType(), pa.timestamp("us"), TIMES),
    "interval": (
        T.DayTimeIntervalType(),
        pa.duration("us"),
        [dt.timedelta(days=1), dt.timedelta(hours=24, microseconds=1), dt.timedelta(0)],
    ),
    "pair": (
        PAIR,
        pa.struct([("a", pa.int32()), ("b", pa.string())]),
        [{"a": 1, "b": "x"}, {"a": None, "b": None}, {"a": 1, "b": None}, {"a": None, "b": "x"}],
    ),
    "nested": (
        NESTED,
        pa.struct([("s", pa.struct([("x", pa.float64()), ("d", pa.date32())])), ("m", pa.decimal128(20, 4))]),
        [
            {"s": {"x": -0.0, "d": dt.date(2024, 1, 1)}, "m": D("1.5")},
            {"s": {"x": 0.0, "d": dt.date(2024, 1, 1)}, "m": D("1.5")},
            {"s": {"x": NANS64[0], "d": None}, "m": None},
            {"s": {"x": NANS64[3], "d": None}, "m": None},
            {"s": None, "m": D(0)},
            {"s": {"x": None, "d": None}, "m": D(0)},
        ],
    ),
    "array": (
        T.ArrayType(T.DoubleType()),
        pa.list_(pa.float64()),
        [[], [None], [NANS64[0], -0.0], [NANS64[1], 0.0], [0.0, NANS64[0]], [1.5, 2.5]],
    ),
    "map": (
        T.MapType(T.StringType(), T.IntegerType()),
        pa.map_(pa.string(), pa.int32()),
        [[], [("a", 1), ("b", 2)], [("b", 2), ("a", 1)], [("a", 2), ("b", 1)], [("a", None)], [("é", 1)]],
    ),
}


@pytest.fixture(scope="module")
def keyed(spark_local: SparkSession) -> DataFrame:
    """``ROWS`` rows: ``v`` (0..ROWS-1) and one column per key type, values drawn with repeats."""
    rng = random.Random(14)
    columns: dict[str, pa.Array] = {"v": pa.array(range(ROWS), pa.int64())}
    fields = [T.StructField("v", T.LongType(), False)]
    for name, (spark_type, arrow_type, pool) in KEYS.items():
        values = [*pool, None]
        drawn = values + [rng.choice(values) for _ in range(ROWS - len(values))]
        rng.shuffle(drawn)
        columns[name] = pa.array(drawn, arrow_type)
        fields.append(T.StructField(name, spark_type))
    return spark_local.createDataFrame(pa.table(columns), schema=T.StructType(fields))


def comparable(value: Any) -> Any:
    """A collected value as something hashable where Spark's equal keys compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, tuple):  # Row (structs and result rows)
        return tuple(comparable(v) for v in value)
    if isinstance(value, list):
        return ("list", tuple(comparable(v) for v in value))
    if isinstance(value, dict):
        return ("map", frozenset((comparable(k), comparable(v)) for k, v in value.items()))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def count_and_sum(key: str, group: pa.Table) -> pa.Table:
    """One row per group: its key (as the first row has it), row count and sum of ``v``."""
    return pa.table(
        {
            key: group.column(key).slice(0, 1),
            "n": pa.array([group.num_rows], pa.int64()),
            "s": pa.array([pc.sum(group.column("v")).as_py()], pa.int64()),
        }
    )


@pytest.mark.parametrize("key", list(KEYS))
def test_group_apply_equals_spark_group_by(keyed: DataFrame, key: str) -> None:
    schema = T.StructType(
        [keyed.schema[key], T.StructField("n", T.LongType()), T.StructField("s", T.LongType())]
    )
    out = group_apply(keyed, [key], functools.partial(count_and_sum, key), schema, num_partitions=3)
    with shuffle_of(out):
        got = Counter(comparable(row) for row in out.collect())
    spark_rows = keyed.groupBy(key).agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("s")).collect()
    want = Counter(comparable(row) for row in spark_rows)
    assert got == want
    assert sum(n for (_, n, _), times in got.items() for _ in range(times)) == ROWS
    assert len(want) >= 3 and None in {k for k, _, _ in want}  # nulls form a group of their own


def placement(df: DataFrame, keys: list[str]) -> tuple[int, dict[tuple[Any, ...], set[int]]]:
    """Rows, and the partitions each key (made comparable) was found in."""
    rows = df.select(F.spark_partition_id().alias("_p"), *keys).collect()
    where: dict[tuple[Any, ...], set[int]] = {}
    for row in rows:
        where.setdefault(comparable(tuple(row[1:])), set()).add(row[0])
    return len(rows), where


@pytest.mark.parametrize("keys", [["double"], ["float", "nested"], ["map", "array", "dec38_0"], list(KEYS)])
def test_repartition_keeps_each_key_in_one_partition(keyed: DataFrame, keys: list[str]) -> None:
    """Equal keys (all NaN payloads, both zeros, maps in any entry order) never split."""
    out = repartition(keyed, 5, *keys)
    with shuffle_of(out):
        rows, where = placement(out, keys)
    assert rows == ROWS
    assert all(len(parts) == 1 for parts in where.values()), {k: p for k, p in where.items() if len(p) > 1}
    assert len({p for parts in where.values() for p in parts}) > 1  # spread, not all in one partition
    assert len(where) == keyed.groupBy(*keys).count().count()  # Spark's count of distinct keys


def _identity(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def test_a_variant_key_is_refused_at_call_time_naming_column_and_type(keyed: DataFrame) -> None:
    """Spark cannot group by a variant (GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE), nor can arrowbeat."""
    df = keyed.selectExpr(
        "v",
        "parse_json(CAST(v % 3 AS STRING)) AS var",
        "named_struct('x', v, 'w', parse_json('1')) AS holder",
    )
    with pytest.raises(AnalysisException, match="GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE"):
        df.groupBy("var").count().collect()
    calls = [
        lambda key: group_apply(df, [key], functools.partial(count_and_sum, key), "n bigint"),
        lambda key: repartition(df, 3, key),
        lambda key: partition_apply(df, 3, [key], _identity, df.schema),
    ]
    for key, type_text in [("var", "struct<value: binary"), ("holder", "struct<x: int64")]:
        for call in calls:
            with pytest.raises(ShuffleConfigError, match="cannot group") as caught:
                call(key)
            message = str(caught.value)
            assert f"key column {key!r} has type {type_text}" in message and "variant" in message
