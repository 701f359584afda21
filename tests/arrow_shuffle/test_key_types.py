"""Every key type Spark groups by: hashing (routing) and grouping follow Spark's key equality.

The reference is written here in plain Python, driven by the Arrow type and reading values one
scalar at a time (no offsets, no flattening, none of the code under test): NaN equals NaN
whatever its payload, -0.0 equals 0.0, null equals null of the same column, a null struct differs
from a struct of nulls, [] from null and from [null], and a map is the set of its entries.

For each type the tests check, on columns with many repeats and the edge values:
- the hash is equal *exactly* when the reference says the keys are equal (so equal keys always
  meet in one partition, and the hash is not a constant),
- it is the same for the values chunked, sliced, dictionary-encoded, and in another process,
- ``iter_groups`` puts every row in exactly one group, of rows equal to each other, one group per
  distinct key.
"""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import math
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrow_shuffle.errors import ShuffleConfigError
from arrow_shuffle.partitioner import hash_column, hash_rows, key_type_problem
from spark_plugin.shuffle.map_output import check_keys, route
from spark_plugin.shuffle.worker.grouping import (
    _components,
    _dense_codes,
    _narrow_codes,
    _sorted_runs,
    iter_groups,
)

D = decimal.Decimal
NULL = ("<null>",)
NAN = ("<nan>",)


def _bits64(*patterns: int) -> list[float]:
    return [float(x) for x in np.array(patterns, dtype=np.uint64).view(np.float64)]


# quiet NaN, negative NaN, NaN with payloads, signalling NaN; then the zeros and the infinities
NANS64 = _bits64(0x7FF8000000000000, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF00000DEADBEEF)
NANS32 = np.array([0x7FC00000, 0xFFC00000, 0x7FC00001, 0x7F800001], dtype=np.uint32).view(np.float32)
FLOATS = [0.0, -0.0, 1.5, -1.5, math.inf, -math.inf, 1e-300, 2.0**53]


UTC = dt.UTC
TIMES = [
    dt.datetime(2024, 2, 29, 12, 0, 0, 1),
    dt.datetime(1969, 12, 31, 23, 59, 59),
    dt.datetime(2024, 1, 1),
]
UNICODE = ["", "a", "A", "é", "é", "日本語", "🙂", "\x00", "a\x00", "ß", "SS"]  # composed vs decomposed é
STRUCT_AB = pa.struct([("a", pa.int32()), ("b", pa.string())])
NESTED = pa.struct(
    [
        ("s", pa.struct([("x", pa.float64()), ("d", pa.date32())])),
        ("m", pa.decimal128(20, 4)),
        ("t", pa.timestamp("us", "UTC")),
    ]
)

# name -> (type, pool of Python values; None is added to every pool)
POOLS: dict[str, tuple[pa.DataType, list[Any]]] = {
    "int8": (pa.int8(), [0, 1, -1, 127, -128]),
    "int16": (pa.int16(), [0, 1, -1, 32767, -32768]),
    "int32": (pa.int32(), [0, 1, -1, 2**31 - 1, -(2**31)]),
    "int64": (pa.int64(), [0, 1, -1, 2**63 - 1, -(2**63), 2**40]),
    "uint8": (pa.uint8(), [0, 1, 255]),
    "uint64": (pa.uint64(), [0, 1, 2**63, 2**64 - 1]),
    "bool": (pa.bool_(), [True, False]),
    "float64": (pa.float64(), NANS64 + FLOATS),
    "float32": (pa.float32(), [float(x) for x in np.concatenate([NANS32, np.array(FLOATS, np.float32)])]),
    "float16": (pa.float16(), list(np.array([0.0, -0.0, 1.5, np.nan, -np.nan, np.inf], dtype=np.float16))),
    "decimal(1,0)": (pa.decimal128(1, 0), [D(0), D(9), D(-9)]),
    "decimal(9,2)": (pa.decimal128(9, 2), [D("0.00"), D("1.50"), D("-1.50"), D("9999999.99")]),
    "decimal(18,4)": (pa.decimal128(18, 4), [D("0"), D("12345678901234.5678"), D("-0.0001")]),
    "decimal(38,10)": (
        pa.decimal128(38, 10),
        [D("1234567890123456789012345678.0123456789"), D("-1"), D("0")],
    ),
    "decimal(38,0)": (pa.decimal128(38, 0), [D(10**38 - 1), D(-(10**38) + 1), D(2**64), D(-(2**64)), D(0)]),
    "decimal256(76,20)": (pa.decimal256(76, 20), [D(10**55) + D("0.5"), D(-(10**55)), D("0"), D(2**128)]),
    "string": (pa.string(), UNICODE),
    "large_string": (pa.large_string(), UNICODE),
    "binary": (pa.binary(), [b"", b"\x00", b"\xff\xfe", b"abc", "é".encode()]),
    "large_binary": (pa.large_binary(), [b"", b"\x00", b"\xff\xfe", b"abc"]),
    "fixed_size_binary": (pa.binary(3), [b"abc", b"\x00\x00\x00", b"ab\x00"]),
    "date32": (
        pa.date32(),
        [dt.date(2024, 2, 29), dt.date(1969, 12, 31), dt.date(1, 1, 1), dt.date(9999, 12, 31)],
    ),
    "date64": (pa.date64(), [dt.date(2024, 2, 29), dt.date(1969, 12, 31)]),
    "timestamp[s]": (pa.timestamp("s"), [t.replace(microsecond=0) for t in TIMES]),
    "timestamp[ms,UTC]": (pa.timestamp("ms", "UTC"), [t.replace(microsecond=0, tzinfo=UTC) for t in TIMES]),
    "timestamp[us]": (pa.timestamp("us"), TIMES),
    "timestamp[us,UTC]": (pa.timestamp("us", "UTC"), [t.replace(tzinfo=UTC) for t in TIMES]),
    "timestamp[us,Asia/Kolkata]": (
        pa.timestamp("us", "Asia/Kolkata"),
        [t.replace(tzinfo=UTC) for t in TIMES],
    ),
    "timestamp[ns]": (pa.timestamp("ns"), TIMES),
    "time32[s]": (pa.time32("s"), [dt.time(0, 0), dt.time(23, 59, 59)]),
    "time64[us]": (pa.time64("us"), [dt.time(0, 0), dt.time(12, 0, 0, 5)]),
    "duration[us]": (
        pa.duration("us"),
        [dt.timedelta(days=1), dt.timedelta(hours=24, microseconds=1), dt.timedelta(0)],
    ),
    "null": (pa.null(), []),
    "struct": (
        STRUCT_AB,
        [{"a": 1, "b": "x"}, {"a": None, "b": None}, {"a": 1, "b": None}, {"a": None, "b": "x"}],
    ),
    "nested_struct": (
        NESTED,
        [
            {"s": {"x": -0.0, "d": dt.date(2024, 1, 1)}, "m": D("1.5"), "t": TIMES[0].replace(tzinfo=UTC)},
            {"s": {"x": 0.0, "d": dt.date(2024, 1, 1)}, "m": D("1.5000"), "t": TIMES[0].replace(tzinfo=UTC)},
            {"s": {"x": NANS64[2], "d": None}, "m": None, "t": None},
            {"s": {"x": NANS64[1], "d": None}, "m": None, "t": None},
            {"s": None, "m": D(0), "t": None},
            {"s": {"x": None, "d": None}, "m": D(0), "t": None},
        ],
    ),
    "list<double>": (
        pa.list_(pa.float64()),
        [[], [None], [NANS64[0], -0.0], [NANS64[3], 0.0], [0.0, NANS64[0]], [1.5]],
    ),
    "large_list<string>": (
        pa.large_list(pa.string()),
        [[], ["a"], ["a", "b"], ["b", "a"], ["a", None], [None]],
    ),
    "fixed_size_list<int32,2>": (pa.list_(pa.int32(), 2), [[1, 2], [2, 1], [None, 1], [None, None]]),
    "list<struct>": (pa.list_(STRUCT_AB), [[], [None], [{"a": None, "b": None}], [{"a": 1, "b": "x"}, None]]),
    "list<list<int64>>": (
        pa.list_(pa.list_(pa.int64())),
        [[], [[]], [None], [[1], [2]], [[1, 2]], [[2], [1]]],
    ),
    "map<string,double>": (
        pa.map_(pa.string(), pa.float64()),
        [
            [],
            [("a", 1.0), ("b", NANS64[0])],
            [("b", NANS64[1]), ("a", 1.0)],
            [("a", -0.0)],
            [("a", 0.0)],
            [("a", None)],
        ],
    ),
    "map<int32,list<int64>>": (
        pa.map_(pa.int32(), pa.list_(pa.int64())),
        [[(1, [1, 2]), (2, [])], [(2, []), (1, [1, 2])], [(1, [2, 1])], [(1, None)]],
    ),
}
if hasattr(pa, "decimal32"):  # the 32- and 64-bit decimals arrived in pyarrow 18 (the floor is 16)
    POOLS["decimal32(7,2)"] = (pa.decimal32(7, 2), [D("1.25"), D("-3.50"), D("0")])
    POOLS["decimal64(18,3)"] = (pa.decimal64(18, 3), [D("1.250"), D("-999999999999999.999"), D("0")])


def canon(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """Spark's key equality as Python equality: a hashable value per row, read scalar by scalar."""
    if isinstance(column, pa.ChunkedArray):
        return [v for chunk in column.chunks for v in canon(chunk)]
    kind = column.type
    if pa.types.is_dictionary(kind):
        return canon(column.dictionary_decode())
    out: list[Any] = []
    for i in range(len(column)):
        scalar = column[i]
        if not scalar.is_valid:
            out.append(NULL)
        elif pa.types.is_floating(kind):
            x = float(scalar.as_py())
            out.append(NAN if math.isnan(x) else x + 0.0)  # -0.0 + 0.0 is 0.0
        elif pa.types.is_struct(kind):
            out.append(
                ("struct", tuple(canon(column.field(j).slice(i, 1))[0] for j in range(kind.num_fields)))
            )
        elif pa.types.is_map(kind):
            entries = scalar.values
            pairs = zip(canon(entries.field(0)), canon(entries.field(1)), strict=True)
            out.append(("map", frozenset(Counter(pairs).items())))
        elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            out.append(("list", tuple(canon(scalar.values))))
        elif pa.types.is_timestamp(kind) or pa.types.is_duration(kind) or pa.types.is_time(kind):
            out.append(
                (
                    "int",
                    column.slice(i, 1).view(pa.int64() if kind.bit_width == 64 else pa.int32())[0].as_py(),
                )
            )
        else:
            out.append(("v", scalar.as_py()))
    return out


def column_of(name: str, rows: int = 240, seed: int = 0) -> pa.Array:
    """``rows`` values drawn with repeats from the pool, every pool value and a null at least once."""
    kind, pool = POOLS[name]
    values = [*pool, None]
    rng = random.Random(f"{name}-{seed}")
    drawn = values + [rng.choice(values) for _ in range(rows - len(values))]
    rng.shuffle(drawn)
    return pa.array(drawn, kind)


def assert_hash_matches_equality(hashes: np.ndarray, keys: list[Any]) -> None:
    by_key: dict[Any, set[int]] = {}
    by_hash: dict[int, set[Any]] = {}
    for h, k in zip(hashes.tolist(), keys, strict=True):
        by_key.setdefault(k, set()).add(h)
        by_hash.setdefault(h, set()).add(k)
    split = {k: v for k, v in by_key.items() if len(v) > 1}
    merged = {h: v for h, v in by_hash.items() if len(v) > 1}
    assert not split, f"equal keys with different hashes: {split}"
    assert not merged, f"different keys with one hash: {merged}"


def assert_groups_match_equality(table: pa.Table, keys: list[str]) -> int:
    """Every row in exactly one group; a group's rows equal; no two groups equal. Returns #groups."""
    seen: list[int] = []
    group_keys = []
    for group in iter_groups(table, keys):
        rows = list(zip(*(canon(group.column(k)) for k in keys), strict=True))
        assert len(set(rows)) == 1, f"a group holds different keys: {set(rows)}"
        group_keys.append(rows[0])
        seen += group.column("row").to_pylist()
    assert sorted(seen) == sorted(table.column("row").to_pylist())
    assert len(set(group_keys)) == len(group_keys), "one key in two groups"
    return len(group_keys)


@pytest.mark.parametrize("name", list(POOLS))
def test_hash_is_equal_exactly_when_spark_calls_the_keys_equal(name: str) -> None:
    column = column_of(name)
    keys = canon(column)
    hashes = hash_column(column)
    assert_hash_matches_equality(hashes, keys)
    assert len(set(keys)) > 1 or name == "null"
    assert key_type_problem(pa.field("k", column.type)) is None


@pytest.mark.parametrize("name", list(POOLS))
def test_hash_is_the_same_in_chunks_slices_and_dictionaries(name: str) -> None:
    column = column_of(name)
    whole = hash_column(column)
    chunked = pa.chunked_array(
        [column.slice(0, 7), column.slice(7, 0), column.slice(7, 100), column.slice(107)]
    )
    assert np.array_equal(hash_column(chunked), whole)
    assert np.array_equal(hash_column(pa.chunked_array([], column.type)), np.zeros(0, np.uint64))
    for start, length in [(1, 50), (63, 64), (200, 40)]:  # offsets that cut validity bytes anywhere
        assert np.array_equal(hash_column(column.slice(start, length)), whole[start : start + length])
    # a different batch, same values (the struct/list/map arrays rebuilt from Python)
    again = pa.array(column.to_pylist(), column.type) if not pa.types.is_floating(column.type) else column
    assert np.array_equal(hash_column(again), whole)
    encoded = _dictionary_encoded(column)
    if encoded is not None:
        assert np.array_equal(hash_column(encoded), whole)
        # two chunks with different dictionaries
        two = pa.chunked_array(
            [_dictionary_encoded(column.slice(0, 120)), _dictionary_encoded(column.slice(120))]
        )
        assert np.array_equal(hash_column(two), whole)


def _dictionary_encoded(column: pa.Array) -> pa.Array | None:
    """``column`` with its leaves dictionary-encoded where Arrow can encode them."""
    kind = column.type
    if pa.types.is_struct(kind):
        children = [_dictionary_encoded(c) for c in column.flatten()]
        if any(c is None for c in children):
            return None
        mask = column.is_null() if column.null_count else None
        return pa.StructArray.from_arrays(children, names=[f.name for f in kind], mask=mask)
    try:
        return pc.dictionary_encode(column)
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


@pytest.mark.parametrize("name", list(POOLS))
def test_groups_hold_exactly_the_rows_spark_calls_equal(name: str) -> None:
    column = column_of(name)
    table = pa.table({"k": column, "row": pa.array(range(len(column)))})
    groups = assert_groups_match_equality(table, ["k"])
    assert groups == len(set(canon(column)))
    # Over chunks (as a reducer gets batches) and dictionary-encoded: the same grouping
    chunked = pa.table({"k": pa.chunked_array([column.slice(0, 99), column.slice(99)]), "row": table["row"]})
    assert assert_groups_match_equality(chunked, ["k"]) == groups
    part = table.slice(37, 150)  # a slice: offsets into every buffer, nested ones too
    assert assert_groups_match_equality(part, ["k"]) == len(set(canon(part.column("k"))))
    encoded = _dictionary_encoded(column)
    if encoded is not None:
        assert assert_groups_match_equality(pa.table({"k": encoded, "row": table["row"]}), ["k"]) == groups


@pytest.mark.parametrize(
    "kind, low, span",
    [
        (pa.int8(), -128, 255),  # the whole type
        (pa.int16(), -32_768, 65_534),  # from the least value
        (pa.int16(), -32_767, 65_534),  # to the largest
        (pa.int32(), -(2**31), 65_534),
        (pa.int64(), -(2**63), 65_534),
        (pa.int64(), 2**63 - 65_535, 65_534),
        (pa.uint8(), 0, 255),
        (pa.uint16(), 1, 65_534),
        (pa.uint32(), 2**32 - 65_535, 65_534),
        (pa.uint64(), 2**64 - 65_535, 65_534),
    ],
)
def test_integer_keys_of_a_narrow_span_sort_as_arrow_sorts_them(
    kind: pa.DataType, low: int, span: int
) -> None:
    """Keys spanning fewer than 65,535 values are sorted as two-byte codes (numpy's radix sort):
    the same order as Arrow's stable sort, nulls last, at each end of every integer type, sliced
    too; one value more is Arrow's sort."""
    rng = np.random.default_rng(7)
    values = [None if rng.random() < 0.05 else low + int(rng.integers(0, span + 1)) for _ in range(5_000)]
    values[:2] = [low, low + span]  # both ends of the span present
    for column in (pa.array(values, kind), pa.array(values, kind).slice(1, 3_000)):
        assert _narrow_codes(column) is not None
        order, starts = _sorted_runs([column], len(column))
        expected = pc.sort_indices(pa.table({"c": column}), sort_keys=[("c", "ascending")]).to_numpy()
        assert np.array_equal(order, expected)
        in_order = column.take(pa.array(order)).to_pylist()
        assert starts.tolist() == [i == 0 or in_order[i] != in_order[i - 1] for i in range(len(in_order))]
        table = pa.table({"k": column, "row": pa.array(range(len(column)))})
        assert_groups_match_equality(table, ["k"])  # through group_bounds, as a reducer groups
    if kind.bit_width >= 16:  # 65,535 apart: Arrow's sort
        wide = [-32_768, 32_767] if kind == pa.int16() else [0, 65_535]
        assert _narrow_codes(pa.array(wide, kind)) is None


@pytest.mark.parametrize("name", list(POOLS))
def test_key_codes_of_a_sliced_column_follow_spark_equality(name: str) -> None:
    """``iter_groups`` combines chunks (which rebases offsets); the codes must not need that."""
    part = column_of(name).slice(37, 150)
    codes = _dense_codes(_components(part), len(part))
    assert_hash_matches_equality(codes.astype(np.uint64), canon(part))


@pytest.mark.parametrize(
    "first, second", [("float64", "struct"), ("nested_struct", "string"), ("map<string,double>", "date32")]
)
def test_several_key_columns_group_and_hash_together(first: str, second: str) -> None:
    a, b = column_of(first, seed=1), column_of(second, seed=2)
    table = pa.table({"a": a, "b": b, "row": pa.array(range(len(a)))})
    keys = list(zip(canon(a), canon(b), strict=True))
    assert_hash_matches_equality(hash_rows(table, ["a", "b"]), keys)
    assert assert_groups_match_equality(table, ["a", "b"]) == len(set(keys))


def test_float16_dictionaries_in_several_chunks_hash_like_their_values() -> None:
    """Chunks of ``dictionary<halffloat>`` with different dictionaries, alone and inside a struct:
    the hash equals the plain values' (pyarrow 26 unifies such dictionaries into wrong numbers)."""
    values = np.array([0.0, -0.0, 1.5, np.nan, np.inf, 1.5, 0.0], dtype=np.float16)
    plain = pa.array(values, pa.float16())
    first = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2], pa.int32()), pa.array(values[:3]))
    second = pa.DictionaryArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()), pa.array(values[3:]))
    chunked = pa.chunked_array([first, second])
    assert np.array_equal(hash_column(chunked), hash_column(plain))
    in_struct = pa.chunked_array([pa.StructArray.from_arrays([c], names=["f"]) for c in (first, second)])
    assert np.array_equal(hash_column(in_struct), hash_column(pa.StructArray.from_arrays([plain], ["f"])))


def test_float_zeros_and_every_nan_payload_hash_and_group_as_one() -> None:
    doubles = pa.array([0.0, -0.0, *NANS64], pa.float64())
    singles = pa.array(np.array([0.0, -0.0, *NANS32], dtype=np.float32), pa.float32())
    for column in (doubles, singles):
        hashes = hash_column(column)
        assert len(set(hashes[:2].tolist())) == 1 and len(set(hashes[2:].tolist())) == 1
        assert hashes[0] != hashes[2]
        table = pa.table({"k": column, "row": pa.array(range(len(column)))})
        assert [len(g) for g in iter_groups(table, ["k"])] == [2, 4]  # in value order: 0, then NaN
    # Routing agrees with grouping for the float types
    ids = route(pa.record_batch({"k": doubles}), ["k"], 7)
    assert len(set(ids[:2].tolist())) == 1 and len(set(ids[2:].tolist())) == 1


def test_null_struct_and_struct_of_nulls_are_different_keys_like_spark() -> None:
    """Spark 4.0: ``GROUP BY s`` over NULL, (NULL, NULL), (1, 'x') gives three groups."""
    column = pa.array(
        [None, {"a": None, "b": None}, {"a": 1, "b": "x"}, None, {"a": None, "b": None}], STRUCT_AB
    )
    table = pa.table({"k": column, "row": pa.array(range(5))})
    assert sorted(len(g) for g in iter_groups(table, ["k"])) == [1, 2, 2]
    hashes = hash_column(column).tolist()
    assert hashes[0] == hashes[3] and hashes[1] == hashes[4] and len(set(hashes)) == 3
    lists = pa.array([None, [], [None], None, [], [None]], pa.list_(pa.int64()))
    assert len(set(hash_column(lists).tolist())) == 3
    assert sorted(len(g) for g in iter_groups(pa.table({"k": lists, "row": pa.array(range(6))}), ["k"])) == [
        2,
        2,
        2,
    ]


def test_maps_are_equal_whatever_the_order_of_their_entries() -> None:
    """Spark 4.0 groups ``map(1, 2, 3, 4)`` with ``map(3, 4, 1, 2)``, apart from ``map(1, 2)``."""
    kind = pa.map_(pa.int32(), pa.int32())
    column = pa.array([[(1, 2), (3, 4)], [(3, 4), (1, 2)], [(1, 2)], [(1, 4), (3, 2)]], kind)
    hashes = hash_column(column).tolist()
    assert hashes[0] == hashes[1] and len(set(hashes)) == 3
    table = pa.table({"k": column, "row": pa.array(range(4))})
    assert sorted(len(g) for g in iter_groups(table, ["k"])) == [1, 1, 2]


def test_date_and_decimal_keys_route_without_error() -> None:
    """The crash of issue 14: a date32 key could not be cast to int64 in the map task."""
    batch = pa.record_batch(
        {
            "d": pa.array([dt.date(2024, 1, 1), None, dt.date(2024, 1, 1)], pa.date32()),
            "m": pa.array([D("1.10"), D("2.00"), D("1.10")], pa.decimal128(38, 2)),
        }
    )
    ids = route(batch, ["d", "m"], 16)
    assert ids[0] == ids[2] and ((ids >= 0) & (ids < 16)).all()


def test_hashes_are_the_same_in_another_process(tmp_path: Path) -> None:
    table = pa.table({name: column_of(name) for name in POOLS})
    path = tmp_path / "keys.arrow"
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    here = {name: hash_column(table.column(name)).tolist() for name in POOLS}
    here["*"] = hash_rows(table, list(POOLS)).tolist()
    code = (
        "import json, sys, pyarrow as pa; from arrow_shuffle.partitioner import hash_column, hash_rows;"
        "t = pa.ipc.open_file(sys.argv[1]).read_all();"
        "out = {n: hash_column(t.column(n)).tolist() for n in t.column_names};"
        "out['*'] = hash_rows(t, t.column_names).tolist(); print(json.dumps(out))"
    )
    env = dict(os.environ, PYTHONHASHSEED="4242")
    run = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True
    )
    import json

    assert json.loads(run.stdout) == here


def _spark_schema() -> Any:
    from pyspark.sql import types as T

    fields = {
        "b": T.ByteType(),
        "s": T.ShortType(),
        "i": T.IntegerType(),
        "l": T.LongType(),
        "f": T.FloatType(),
        "d": T.DoubleType(),
        "dec": T.DecimalType(38, 18),
        "dec1": T.DecimalType(1, 0),
        "str": T.StringType(),
        "bin": T.BinaryType(),
        "bool": T.BooleanType(),
        "date": T.DateType(),
        "ts": T.TimestampType(),
        "ntz": T.TimestampNTZType(),
        "dti": T.DayTimeIntervalType(),
        "nul": T.NullType(),
        "st": T.StructType([T.StructField("x", T.DoubleType()), T.StructField("y", T.StructType([]))]),
        "arr": T.ArrayType(T.StructType([T.StructField("d", T.DecimalType(10, 2))])),
        "map": T.MapType(T.StringType(), T.ArrayType(T.DateType())),
        "var": T.VariantType(),
        "st_var": T.StructType([T.StructField("x", T.LongType()), T.StructField("v", T.VariantType())]),
        "arr_var": T.ArrayType(T.VariantType()),
    }
    return T.StructType([T.StructField(k, v) for k, v in fields.items()])


GROUPABLE = [
    "b",
    "s",
    "i",
    "l",
    "f",
    "d",
    "dec",
    "dec1",
    "str",
    "bin",
    "bool",
    "date",
    "ts",
    "ntz",
    "dti",
    "nul",
]
GROUPABLE += ["st", "arr", "map"]


@pytest.mark.parametrize("large", [False, True])
def test_check_keys_takes_every_type_spark_groups_by_and_names_what_it_refuses(large: bool) -> None:
    """The Arrow schema Spark's own conversion gives (no JVM needed for it): every type Spark can
    group by passes; a variant (Spark: GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE), alone or inside a
    struct or array, is refused with the column and its type."""
    from pyspark.sql.pandas.types import to_arrow_schema

    # pyspark 4.2 replaced ``timestamp_utc=True`` (the default) by a ``timezone`` that a schema
    # with a TimestampType needs; Spark's own Arrow UDF paths pass "UTC"
    zone: dict[str, Any] = (
        {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
    )
    schema = to_arrow_schema(_spark_schema(), prefers_large_types=large, **zone)
    check_keys(schema, GROUPABLE)
    for name in ["var", "st_var", "arr_var"]:
        with pytest.raises(ShuffleConfigError) as caught:
            check_keys(schema, ["i", name])
        message = str(caught.value)
        assert f"'{name}'" in message and "variant" in message and str(schema.field(name).type) in message


@pytest.mark.parametrize(
    "kind",
    [pa.month_day_nano_interval(), pa.list_view(pa.int64()), pa.dense_union([pa.field("a", pa.int8())])],
)
def test_types_spark_never_groups_by_are_refused_naming_column_and_type(kind: pa.DataType) -> None:
    schema = pa.schema([("ok", pa.int64()), ("odd", pa.struct([("inner", kind)]))])
    with pytest.raises(
        ShuffleConfigError, match=r"key column 'odd' has type struct<inner: .*cannot group"
    ) as caught:
        check_keys(schema, ["ok", "odd"])
    assert str(kind) in str(caught.value)
    with pytest.raises(ShuffleConfigError, match="'missing'"):
        check_keys(schema, ["missing"])


# -- properties: nested values with floats, strings, nulls, lists, drawn by hypothesis ----------
PROPERTY_TYPE = pa.struct(
    [
        ("f", pa.float64()),
        ("s", pa.string()),
        ("l", pa.list_(pa.float32())),
        ("m", pa.map_(pa.int8(), pa.bool_())),
    ]
)
floats = st.sampled_from([0.0, -0.0, *NANS64, 1.0]) | st.floats(width=64)
leaf = st.fixed_dictionaries(
    {
        "f": st.none() | floats,
        "s": st.none() | st.sampled_from(["", "a", "é", "🙂"]),
        "l": st.none()
        | st.lists(st.none() | st.floats(width=32) | st.sampled_from([0.0, -0.0, math.nan]), max_size=3),
        "m": st.none()
        | st.dictionaries(st.integers(-2, 2), st.none() | st.booleans(), max_size=3).map(
            lambda d: list(d.items())
        ),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.none() | leaf, min_size=1, max_size=40), st.randoms(use_true_random=False))
def test_property_nested_keys_hash_and_group_by_spark_equality(values: list[Any], rng: random.Random) -> None:
    """Each drawn value repeated in shuffled order, some copies with their map entries reversed."""
    rows = []
    for v in values:
        for _ in range(rng.randint(1, 3)):
            if v is not None and v["m"] is not None and rng.random() < 0.5:
                v = dict(v, m=list(reversed(v["m"])))
            rows.append(v)
    rng.shuffle(rows)
    column = pa.array(rows, PROPERTY_TYPE)
    keys = canon(column)
    assert_hash_matches_equality(hash_column(column), keys)
    table = pa.table({"k": column, "row": pa.array(range(len(column)))})
    assert assert_groups_match_equality(table, ["k"]) == len(set(keys))
