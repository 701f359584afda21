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

from spark_plugin.shuffle.grouping import Rows, group_bounds, iter_groups
from spark_plugin.shuffle.reduce_spill import partition_rows

ROOT = Path(__file__).resolve().parents[3]

PEAK_SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np
    import pyarrow as pa
    from spark_plugin.shuffle.grouping import Rows, group_bounds

    pool = pa.default_memory_pool()
    rows, columns = 400_000, 10
    rng = np.random.default_rng(7)

    def batches():
        out = []
        for start in range(0, rows, 10_000):
            keys = np.where(rng.random(10_000) < 0.6, 0, rng.integers(1, 50, 10_000))
            values = [rng.random(10_000) for _ in range(columns)]
            names = ["k", *map(str, range(columns))]
            fresh = pa.record_batch([pa.array(keys), *map(pa.array, values)], names=names)
            out.append(fresh.take(pa.array(np.arange(10_000))))  # in Arrow's pool, as IPC reads are
        return out

    def extra_at_peak(handed):
        data = batches()
        start, schema = pool.bytes_allocated(), data[0].schema
        if handed:  # nothing here keeps the rows: they are the grouping's
            ordered, bounds = group_bounds(Rows.of_batches(data, schema), ["k"])
        else:  # the caller keeps its table while it is grouped
            table = pa.Table.from_batches(data, schema=schema)
            data.clear()
            ordered, bounds = group_bounds(table, ["k"])
        assert len(bounds) == 51 and ordered.column("k")[0].as_py() == 0
        return start, pool.max_memory() - start

    source, handed_extra = extra_at_peak(True)
    _, held_extra = extra_at_peak(False)
    print(json.dumps({"source": source, "handed": handed_extra, "held": held_extra}))
    """
)


def test_grouping_handed_rows_holds_them_about_once_at_its_peak() -> None:
    """Handed over as ``Rows``, the sort's peak is the rows plus one column's copy and the sort
    order; a table its caller still holds is copied whole beside itself. A fresh process, so the
    pool's peak is this grouping's."""
    script = [sys.executable, "-c", PEAK_SCRIPT]
    done = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    source = measured["source"]
    assert source > 30 << 20, measured  # 400 k rows x 11 eight-byte columns
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
