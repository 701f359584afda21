"""What a reduce task of a grouped call holds at its peak, in Arrow's memory pool; no JVM.

A reducer holding a skewed key's bucket must not hold it twice: ``Rows`` hands the rows to
``group_bounds``, which drops each source column once its key-sorted copy exists, and the in-memory
buckets own their rows, so a bucket's memory goes once its groups are done."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from spark_plugin.shuffle.worker import grouping
from spark_plugin.shuffle.worker.grouping import Rows, group_bounds, iter_groups
from spark_plugin.shuffle.worker.reduce_spill import partition_rows

ROOT = Path(__file__).resolve().parents[3]

PEAK_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import pyarrow as pa
    from spark_plugin.shuffle.worker.grouping import group_bounds
    from spark_plugin.shuffle.worker.reduce_spill import partition_rows

    pool = pa.default_memory_pool()
    rows, columns, per_batch = 400_000, 10, 10_000
    names = ["k", *map(str, range(columns))]
    rng = np.random.default_rng(7)

    def frames():
        # Each batch as a reduce task gets it: decoded from a frame of its own, every column a view
        # of that frame's memory. String keys: held as one table, not bucketed in memory.
        out = []
        for _ in range(rows // per_batch):
            keys = np.where(rng.random(per_batch) < 0.6, 0, rng.integers(1, 50, per_batch)).astype(str)
            values = [pa.array(rng.random(per_batch)) for _ in range(columns)]
            batch = pa.record_batch([pa.array(keys), *values], names=names)
            out.append(pa.ipc.read_record_batch(batch.serialize(), batch.schema))
        return out

    def handed_over(batches):
        batches.reverse()
        while batches:
            yield batches.pop()

    def extra_at_peak(handed):
        data = frames()
        start, schema = pool.bytes_allocated(), data[0].schema
        if handed:  # through the reduce side's reader: nothing else keeps the rows
            [rows_] = partition_rows(handed_over(data), schema, ["k"], None, sort_unit_bytes=1 << 20)
            ordered, bounds = group_bounds(rows_, ["k"])
        else:  # the caller keeps its table while it is grouped
            table = pa.Table.from_batches(data, schema=schema)
            data.clear()
            ordered, bounds = group_bounds(table, ["k"])
        assert len(bounds) == 51 and ordered.column("k")[0].as_py() == "0"
        return start, pool.max_memory() - start

    source, handed_extra = extra_at_peak(True)
    _, held_extra = extra_at_peak(False)
    print(json.dumps({"source": source, "handed": handed_extra, "held": held_extra}))
    """
)


def test_grouping_handed_rows_holds_them_about_once_at_its_peak() -> None:
    """Rows that reach the grouping through the reduce side's reader (decoded frames, held as
    one table past the sort unit) are sorted at a peak of the rows plus one column's copy and
    the sort order; a table its caller still holds is copied whole beside itself. A fresh
    process, so the pool's peak is this grouping's."""
    script = [sys.executable, "-c", PEAK_SCRIPT]
    done = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    source = measured["source"]
    assert source > 30 << 20, measured  # 400 k rows of 10 doubles and a string key
    assert measured["handed"] < 0.5 * source, measured
    assert measured["held"] > 0.95 * source, measured  # the measurement can tell the two apart


def test_each_memory_bucket_owns_its_rows_so_its_memory_goes_with_it(tmp_path: Path) -> None:
    """Past the sort unit the rows are bucketed in memory as they arrive; once a bucket's groups
    are done its rows are freed, not kept until the last bucket by copies shared between buckets."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.float64())])
    rng = np.random.default_rng(3)
    data = [
        pa.record_batch([pa.array(rng.integers(0, 997, 20_000)), pa.array(rng.random(20_000))], schema=schema)
        for _ in range(40)
    ]
    size = sum(b.nbytes for b in data)
    buckets = partition_rows(iter(data), schema, ["k"], memory_bytes=None, sort_unit_bytes=size // 8)
    first = next(buckets)
    all_bucketed = pa.total_allocated_bytes()
    groups = sum(1 for _ in iter_groups(first, ["k"]))
    del first
    remaining = list(buckets)
    assert len(remaining) >= 8
    for rows in remaining[:-1]:
        groups += sum(1 for _ in iter_groups(rows, ["k"]))
    del rows
    assert all_bucketed - pa.total_allocated_bytes() > 0.6 * size  # all but the last bucket gone
    groups += sum(1 for _ in iter_groups(remaining[-1], ["k"]))
    assert groups == 997


def test_rows_are_released_once() -> None:
    rows = Rows(pa.table({"k": [1, 2, 1]}))
    assert rows.num_rows == 3 and rows.schema.names == ["k"]
    ordered, bounds = group_bounds(rows, ["k"])
    assert ordered.column("k").to_pylist() == [1, 1, 2] and bounds.tolist() == [0, 2, 3]
    with pytest.raises(RuntimeError, match="already released"):
        rows.release()


@pytest.mark.parametrize(
    "keys",
    [
        pa.array([7] * 3000, pa.int32()),
        pa.array([None] * 3000, pa.int64()),
        pa.array([0.0, -0.0] * 1500, pa.float64()),  # one group in Spark: -0.0 == 0.0
        pa.array([float("nan"), -float("nan")] * 1500, pa.float32()),  # every NaN one group
    ],
)
def test_a_table_of_one_key_value_is_one_group_handed_on_as_it_is(
    keys: pa.Array, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot key's bucket holds one key: ``group_bounds`` hands its rows on without sorting or
    copying them (12 M rows of the hot matrix cell took 0.43 s to sort and copy)."""

    def no_sort(*args: object) -> None:
        raise AssertionError("one key value needs no sort")

    monkeypatch.setattr(grouping, "_sorted_runs", no_sort)
    table = pa.Table.from_batches(
        pa.table({"k": keys, "v": pa.array(np.arange(3000))}).to_batches(max_chunksize=700)
    )
    ordered, bounds = group_bounds(table, ["k"])
    assert ordered is table and bounds.tolist() == [0, 3000]


def test_one_value_and_nulls_are_two_groups_and_are_sorted() -> None:
    keys = pa.array([5, None, 5, None, 5], pa.int64())
    ordered, bounds = group_bounds(pa.table({"k": keys, "v": pa.array(range(5))}), ["k"])
    assert bounds.tolist() == [0, 3, 5]
    assert ordered["k"].to_pylist() == [5, 5, 5, None, None]
    assert ordered["v"].to_pylist() == [0, 2, 4, 1, 3]


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"k": pa.array([True, None, True, True])}),
        pa.table({"k": pa.array([{"a": 1, "b": 2}, {"a": 1, "b": 3}, {"a": 1, "b": 2}])}),
        pa.table({"k": pa.array([1, 1, 1, 1]), "j": pa.array(["x", "y", "x", "x"])}),
        pa.table({"k": pa.chunked_array([[4, 4], [4, 5]])}),
        pa.table({"k": pa.array([9, 4, 4, 4]).slice(1)}),
    ],
)
def test_one_value_is_found_only_where_there_is_one_group(table: pa.Table) -> None:
    """``group_bounds``' one-value shortcut never takes two keys for one: as many groups as
    distinct keys (Spark's equality: nulls equal), whatever the key's type, shape or slice."""
    keys = table.column_names
    _, bounds = group_bounds(table, keys)
    distinct = {tuple(str(table.column(k)[i]) for k in keys) for i in range(table.num_rows)}
    assert len(bounds) - 1 == len(distinct)
