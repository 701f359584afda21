"""Key groups of an Arrow table, found in Arrow: one multi-key sort, then run boundaries.

Equal keys are adjacent after ``sort_indices``; a group starts wherever any key column differs
from the row before. Nulls group with nulls and NaN with NaN (as Spark's ``groupBy`` does),
which plain ``not_equal`` would not give.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _differs(column: pa.Array) -> np.ndarray:
    """For rows 1..n-1: does the key differ from the previous row's?"""
    n = len(column)
    a, b = column.slice(1), column.slice(0, n - 1)
    a_null, b_null = pc.is_null(a), pc.is_null(b)
    diff = pc.or_(pc.fill_null(pc.not_equal(a, b), False), pc.not_equal(a_null, b_null))
    if pa.types.is_floating(column.type):
        both_nan = pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False)
        diff = pc.and_(diff, pc.invert(both_nan))
    result: np.ndarray = diff.to_numpy(zero_copy_only=False)
    return result


def iter_groups(table: pa.Table, key_columns: Sequence[str]) -> Iterator[pa.Table]:
    """Each group of rows with equal ``key_columns``, as a slice of the key-sorted table."""
    n = table.num_rows
    if n == 0:
        return
    order = pc.sort_indices(table, sort_keys=[(k, "ascending") for k in key_columns], null_placement="at_end")
    ordered = table.take(order)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for name in key_columns:
        if n > 1:
            starts[1:] |= _differs(ordered.column(name).combine_chunks())
    bounds = np.append(np.flatnonzero(starts), n)
    for start, end in itertools.pairwise(bounds):
        yield ordered.slice(int(start), int(end - start))
