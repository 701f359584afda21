"""Whole-group pandas functions (``applyInPandas``'s ``func(pdf)`` / ``func(key, pdf)``) at one
conversion per run of groups instead of two per group.

Why: PySpark's Arrow <-> pandas conversions cost about a millisecond per call whatever the row
count (a Series per column, checks, casts), so with tens of thousands of small groups the
conversions, not the function, fill the reduce task: measured here on 100-row groups, 1.2 ms to
pandas and 1.5 ms back per group against 1.3 ms for a seven-statistic function. Spark pays the
same per group; Dask pays neither (its partitions are pandas already and ``groupby`` slices them).

So consecutive groups of the key-sorted table are converted together, up to ``CHUNK_ROWS`` rows,
and each group gets a copied row slice of that frame (index ``0..n-1``, as Spark's). The results of
such a run go back to Arrow in one conversion when they are alike (same unique column labels,
same dtypes, no ``object`` column unless declared a string); otherwise, or when that conversion
fails, one by one as before, so an error still names its group.

Both give the frames and batches per-group conversion gives, because PySpark converts value by
value for a given dtype. The one dtype that depends on the rows is an integer or boolean
column's: with a null it becomes float64 / object, where a group without nulls gets int64 / bool.
A run holding such a column with a null is converted group by group.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from spark_plugin.compat.pandas_udf import PandasConversion, to_pandas
from spark_plugin.shuffle.worker.grouping import Rows, group_bounds

CHUNK_ROWS = 65_536
"""Rows converted to pandas at once (a group larger than this is converted alone)."""

Conform = Callable[[object, Any, str], pa.RecordBatch | None]
"""``grouped_map.conform_pandas``: a result frame as the declared Arrow, None for no rows, or the
error naming the group (passed in: ``grouped_map`` imports this module)."""


def chunks(bounds: np.ndarray, chunk_rows: int) -> Iterator[tuple[int, int]]:
    """Runs ``[lo, hi)`` of consecutive groups (``bounds`` as ``group_bounds`` gives them) of at
    most ``chunk_rows`` rows together, or one group alone when it is larger."""
    groups = len(bounds) - 1
    lo = 0
    while lo < groups:
        hi = lo + 1
        while hi < groups and bounds[hi + 1] - bounds[lo] <= chunk_rows:
            hi += 1
        yield lo, hi
        lo = hi


def _row_dependent_dtypes(table: pa.Table) -> bool:
    """Has an integer or boolean column a null (its pandas dtype then depends on the rows)?"""
    return any(
        (pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)) and c.null_count
        for f, c in zip(table.schema, table.columns, strict=True)
    )


def group_frames(
    ordered: pa.Table, bounds: np.ndarray, conversion: PandasConversion, chunk_rows: int = CHUNK_ROWS
) -> Iterator[tuple[pa.Table, Any]]:
    """Each group of ``ordered`` as its Arrow slice and the pandas frame ``applyInPandas`` gives it."""
    import pandas as pd

    for lo, hi in chunks(bounds, chunk_rows):
        start = int(bounds[lo])
        run = ordered.slice(start, int(bounds[hi]) - start)
        slices = [ordered.slice(int(a), int(b - a)) for a, b in itertools.pairwise(bounds[lo : hi + 1])]
        if hi - lo == 1 or _row_dependent_dtypes(run):
            for group in slices:
                yield group, to_pandas(group, conversion)
            continue
        frame = to_pandas(run, conversion)
        for group, first in zip(slices, bounds[lo:hi], strict=True):
            at = int(first) - start
            part = frame.iloc[at : at + group.num_rows].copy()  # a user may write to it
            part.index = pd.RangeIndex(group.num_rows)
            yield group, part


def _alike(frames: Sequence[object], call: Any) -> bool:
    """Can these results be converted as one frame (``pd.concat``) with the same outcome?"""
    import pandas as pd

    first = frames[0]
    if not isinstance(first, pd.DataFrame) or len(first.columns) == 0 or not first.columns.is_unique:
        return False
    columns, dtypes = first.columns, list(first.dtypes)
    labels = [(type(c), c) for c in columns]  # 1 and 1.0 are equal labels, but not by name
    for frame in frames[1:]:
        if not isinstance(frame, pd.DataFrame) or [(type(c), c) for c in frame.columns] != labels:
            return False
        if list(frame.dtypes) != dtypes:
            return False
    by_name = call.conversion.assign_cols_by_name and any(isinstance(c, str) for c in columns)
    want = call.out_arrow
    for position, (label, dtype) in enumerate(zip(columns, dtypes, strict=True)):
        if dtype.kind != "O":
            continue
        index = want.get_field_index(str(label)) if by_name else position
        if index < 0 or index >= len(want):
            return False
        kind = want.field(index).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            return False
    return True


def _converted(
    results: list[tuple[object, str]], call: Any, conform_pandas: Conform
) -> Iterator[pa.RecordBatch]:
    """The results of a run of groups as Arrow: in one conversion when alike, else one by one."""
    import pandas as pd

    frames = [out for out, _ in results]
    if len(frames) > 1 and _alike(frames, call):
        try:
            batch = conform_pandas(pd.concat(frames, ignore_index=True), call, results[0][1])
        except Exception:  # redone one by one below, which names the group at fault
            pass
        else:
            if batch is not None:
                yield batch
            return
    for out, where in results:
        batch = conform_pandas(out, call, where)
        if batch is not None:
            yield batch


def pandas_group_results(
    call: Any,
    rows: pa.Table | Rows,
    key_columns: Sequence[str],
    conform: Conform,
    where: Callable[[pa.Table], str],
    chunk_rows: int = CHUNK_ROWS,
) -> Iterator[pa.RecordBatch]:
    """``call``'s (a ``grouped_map.GroupedCall``) whole-group pandas function on every key group of
    ``rows``, its results in Arrow; ``where(group)`` names a group in errors."""
    ordered, bounds = group_bounds(rows, key_columns)
    positions = [ordered.schema.get_field_index(k) for k in key_columns]
    pending: list[tuple[object, str]] = []
    pending_rows = 0
    for group, frame in group_frames(ordered, bounds, call.conversion, chunk_rows):
        # The key as Spark passes it to func(key, pdf): the first row's values of the key columns.
        args = (tuple(frame.iloc[:, p].iloc[0] for p in positions),) if call.form.takes_key else ()
        pending.append((call.func(*args, frame), where(group)))
        pending_rows += group.num_rows
        if pending_rows >= chunk_rows:
            yield from _converted(pending, call, conform)
            pending, pending_rows = [], 0
    if pending:
        yield from _converted(pending, call, conform)


__all__ = ["CHUNK_ROWS", "chunks", "group_frames", "pandas_group_results"]
