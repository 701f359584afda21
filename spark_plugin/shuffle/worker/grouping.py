"""Key groups of an Arrow table, found in Arrow: one multi-key sort, then run boundaries.

Equal keys are adjacent after ``sort_indices``; a group starts wherever any key differs from the
row before. "Equal" is Spark's ``groupBy`` equality, which Arrow's comparisons do not give as they
are, so each key column is first turned into flat *components* that do:

- a float becomes an int64 of its bits with -0.0 made 0.0 and every NaN one NaN (the bits of a
  float ordered as signed integers keep its order, so groups still come out in value order);
- a struct becomes its validity and its children's components (the children carry the struct's
  nulls): a null struct and a struct of nulls are two groups, as in Spark;
- a list becomes one binary per list of its elements' dense codes (elements numbered by a sort of
  their own components), a map the same of its (key, value) codes sorted by key, since Spark
  groups maps whatever the order of their entries;
- other types (integers, booleans, decimals, strings, binaries, dates, times, timestamps) are
  compared as they are, nulls equal to nulls.

``arrow_shuffle.partitioner.key_type_problem`` names the types this covers; ``hash_column`` hashes
them with the same equalities, so equal keys meet in one reduce task and here in one group.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrow_shuffle.errors import ShuffleConfigError

RELEASE_TO_OS_BYTES = 64 << 20
"""Rows over this size hand freed memory back to the OS as they are sorted (below it, the
allocator's call would cost more than the memory is worth)."""
_NAN_BITS = np.int64(np.array(np.nan).view(np.int64))
_MAGNITUDE = np.int64(0x7FFFFFFFFFFFFFFF)


def _differs(column: pa.Array) -> np.ndarray:
    """For rows 1..n-1: does the value differ from the previous row's (a null equals a null)?"""
    n = len(column)
    a, b = column.slice(1), column.slice(0, n - 1)
    diff = pc.fill_null(pc.not_equal(a, b), False)
    if column.null_count:
        diff = pc.or_(diff, pc.not_equal(pc.is_null(a), pc.is_null(b)))
    result: np.ndarray = diff.to_numpy(zero_copy_only=False)
    return result


def _float_component(column: pa.Array) -> pa.Array:
    """The float's bits as an int64, equal exactly when Spark's grouping calls the floats equal."""
    floats = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    bits = np.where(floats == 0.0, 0.0, floats).view(np.int64)  # -0.0 == 0.0
    bits = np.where(np.isnan(floats), _NAN_BITS, bits)  # every NaN payload, either sign
    ordered = np.where(bits < 0, bits ^ _MAGNITUDE, bits)  # negative floats: larger magnitude first
    mask = None if column.null_count == 0 else column.is_null().to_numpy(zero_copy_only=False)
    return pa.array(ordered, pa.int64(), mask=mask)


def _dense_codes(components: Sequence[pa.Array], n: int) -> np.ndarray:
    """For ``n`` rows, an int64 per row: equal codes exactly when all ``components`` are equal."""
    if not components or n == 0:
        return np.zeros(n, dtype=np.int64)
    order, starts = _sorted_runs(components, n)
    codes = np.empty(n, dtype=np.int64)
    codes[order] = np.cumsum(starts) - 1
    return codes


def _sorted_runs(components: Sequence[pa.Array], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The order that makes equal rows adjacent, and where (in that order) each run starts."""
    if not components:  # keys of the null type only: one group
        starts = np.zeros(n, dtype=bool)
        starts[:1] = True
        return np.arange(n, dtype=np.int64), starts
    codes = _narrow_codes(components[0]) if len(components) == 1 and n > 1 else None
    if codes is not None:
        order = np.argsort(codes, kind="stable")
        ordered = codes[order]
        starts = np.empty(n, dtype=bool)
        starts[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
        return order, starts
    table = pa.table({f"c{i}": c for i, c in enumerate(components)})
    order = pc.sort_indices(table, sort_keys=[(name, "ascending") for name in table.column_names])
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    if n > 1:
        for component in components:
            starts[1:] |= _differs(component.take(order))
    return order.to_numpy(zero_copy_only=False), starts


def _one_value(component: pa.Array) -> bool:
    """Does every row of ``component`` hold one value (nulls all, or none and min == max)?"""
    if component.null_count:
        return bool(component.null_count == len(component))
    if not (pa.types.is_integer(component.type) or pa.types.is_boolean(component.type)):
        return False  # strings, decimals, binaries: sorted as they are
    bounds = pc.min_max(component)
    return bool(bounds["min"].as_py() == bounds["max"].as_py())


_NARROW = 0xFFFF
"""Integer keys spanning fewer values than this (nulls one more) are sorted as two-byte codes."""


def _narrow_codes(component: pa.Array) -> np.ndarray | None:
    """An integer component whose values span fewer than ``_NARROW`` as uint16 codes (the value
    less the least, nulls one past the largest: last, as Arrow sorts them), else ``None``.

    Why: a stable sort of two-byte codes is numpy's radix sort, linear; Arrow sorts these keys by
    comparison (measured: 2.2 M int32 keys of 5,003 values, 37 ms against 193 ms; 140 k keys of a
    bucket, 1.8 ms against 5.6 ms). The order is the same, ties in arrival order both ways."""
    kind = component.type
    if not pa.types.is_integer(kind) or component.null_count == len(component):
        return None
    bounds = pc.min_max(component)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if high - low >= _NARROW:
        return None
    wide = np.uint64 if pa.types.is_unsigned_integer(kind) else np.int64  # no overflow below
    values = pc.fill_null(component, low).to_numpy(zero_copy_only=False).astype(wide)
    codes: np.ndarray = (values - wide(low)).astype(np.uint16)
    if component.null_count:
        codes[component.is_null().to_numpy(zero_copy_only=False)] = high - low + 1
    return codes


def _codes_binary(codes: np.ndarray, offsets: np.ndarray, per_item: int, column: pa.Array) -> pa.Array:
    """One large_binary per slot of ``column``: the int64 ``codes`` of its items, nulls kept."""
    data = pa.py_buffer(np.ascontiguousarray(codes, dtype="<i8").tobytes())
    byte_offsets = pa.py_buffer((offsets * (8 * per_item)).astype(np.int64).tobytes())
    binary = pa.Array.from_buffers(pa.large_binary(), len(column), [None, byte_offsets, data])
    if column.null_count:
        binary = pc.if_else(column.is_valid(), binary, pa.scalar(None, pa.large_binary()))
    return binary


def _rebased(offsets: np.ndarray) -> tuple[np.ndarray, int, int]:
    first, last = int(offsets[0]), int(offsets[-1])
    return offsets - first, first, last - first


def _list_component(column: pa.Array) -> pa.Array:
    if pa.types.is_fixed_size_list(column.type):
        size = column.type.list_size
        offsets = (np.arange(len(column) + 1, dtype=np.int64) + column.offset) * size
    else:
        offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    offsets, first, count = _rebased(offsets)
    values = column.values.slice(first, count)
    codes = _dense_codes(_components(values), count)
    return _codes_binary(codes, offsets, 1, column)


def _map_component(column: pa.Array) -> pa.Array:
    offsets, first, count = _rebased(column.offsets.to_numpy(zero_copy_only=False).astype(np.int64))
    keys = _dense_codes(_components(column.keys.slice(first, count)), count)
    items = _dense_codes(_components(column.items.slice(first, count)), count)
    owner = np.repeat(np.arange(len(column)), np.diff(offsets))
    order = np.lexsort((items, keys, owner))  # each map's entries by key (then value), in place
    pairs = np.stack([keys[order], items[order]], axis=1).reshape(-1)
    return _codes_binary(pairs, offsets, 2, column)


def _components(column: pa.Array) -> list[pa.Array]:
    """Flat, sortable arrays whose row-wise equality (null == null) is Spark's key equality."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        return _components(column.dictionary_decode())
    if pa.types.is_null(kind):
        return []
    if pa.types.is_floating(kind):
        return [_float_component(column)]
    if pa.types.is_struct(kind):
        valid = column.is_valid() if column.null_count else pa.array(np.ones(len(column), dtype=bool))
        return [valid, *(c for child in column.flatten() for c in _components(child))]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_list_component(column)]
    if pa.types.is_map(kind):
        return [_map_component(column)]
    if pa.types.is_decimal(kind) and kind.byte_width < 16:  # decimal32/64 have no sort kernel
        return [column.cast(pa.decimal128(kind.precision, kind.scale))]
    if (
        pa.types.is_boolean(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or pa.types.is_date(kind)
        or pa.types.is_time(kind)
        or pa.types.is_timestamp(kind)
        or pa.types.is_duration(kind)
    ):
        return [column]
    raise ShuffleConfigError(f"cannot group by a column of type {kind}")


class Rows:
    """A table handed from the partition's reader to its grouping, whose only holder the grouping
    becomes (``release``): it can then drop each source column as soon as that column's key-sorted
    copy exists, so a bucket is held about once at its peak, not twice.

    Why: a reducer of a skewed key holds most of the partition in one bucket, and a plain table is
    kept alive by every generator frame it passed through. Measured on the 20 M-row matrix's hot
    ``group`` cell: that reducer's Python worker peaked at 1,354 MiB (the rows as they arrived, their
    sorted copy and pyarrow's concatenation of the string column for the take) against 484 MiB for
    Spark's worker holding the same group; handed over (and the in-memory buckets owning their
    rows), its largest worker peaked at 878 MiB, and the cell's peak went from 0.88 of Spark's to
    0.76."""

    __slots__ = ("_table", "num_rows", "schema")

    def __init__(self, table: pa.Table) -> None:
        self._table: pa.Table | None = table
        self.num_rows = table.num_rows
        self.schema = table.schema

    @classmethod
    def of_batches(cls, batches: list[pa.RecordBatch], schema: pa.Schema) -> Rows:
        """``batches`` as one table; the list is emptied, so the rows' only holder is the result."""
        rows = cls(pa.Table.from_batches(batches, schema=schema))
        batches.clear()
        return rows

    def release(self) -> pa.Table:
        """The table, no longer held here (a second call is a bug: the rows were handed on)."""
        table, self._table = self._table, None
        if table is None:
            raise RuntimeError("these rows were already released to their grouping")
        return table


def group_bounds(rows: pa.Table | Rows, key_columns: Sequence[str]) -> tuple[pa.Table, np.ndarray]:
    """``rows`` sorted by ``key_columns`` and where its groups start (plus its row count last):
    group i is rows ``bounds[i]:bounds[i + 1]`` of the sorted table.

    Given ``Rows``, each source column is dropped once its sorted copy is made, so the peak is the
    rows plus one column, not twice the rows (a ``pa.Table`` the caller still holds stays whole)."""
    table = rows.release() if isinstance(rows, Rows) else rows
    n = table.num_rows
    if n == 0:
        return table, np.zeros(1, dtype=np.int64)
    components = [c for name in key_columns for c in _components(table.column(name).combine_chunks())]
    if all(map(_one_value, components)):  # one group (a hot key's bucket): no sort, no copy
        return table, np.array([0, n], dtype=np.int64)
    order, starts = _sorted_runs(components, n)
    del components
    bounds = np.append(np.flatnonzero(starts), n)
    if len(bounds) == 2:  # one group: the (stable) sort keeps its rows in place, so no copy
        return table, bounds
    # Freed source chunks stay with the allocator (mimalloc keeps them a while) unless handed back
    # before the next column's copies are allocated: measured on a 12 M-row hot bucket, the
    # worker's peak RSS was 1,056 MiB without and 845 with (the Arrow pool's peak: 656 either way).
    hand_back = table.nbytes > RELEASE_TO_OS_BYTES
    schema = table.schema
    columns: list[pa.ChunkedArray | None] = list(table.columns)
    del table  # from here ``columns`` holds the source, released one column at a time below
    indices = pa.array(order)
    ordered: list[pa.Array] = []
    for i in range(len(columns)):  # not enumerate(): its reused result tuple would keep ``source``
        source, columns[i] = columns[i], None  # the last reference is ``source`` now
        assert source is not None
        # One array to take from: a var-width take would concatenate the chunks anyway.
        combined = source.chunk(0) if source.num_chunks == 1 else source.combine_chunks()
        del source
        if hand_back:
            pa.default_memory_pool().release_unused()
        ordered.append(combined.take(indices))
        del combined
    return pa.Table.from_arrays(ordered, schema=schema), bounds


def iter_groups(rows: pa.Table | Rows, key_columns: Sequence[str]) -> Iterator[pa.Table]:
    """Each group of rows with equal ``key_columns``, as a slice of the key-sorted table."""
    ordered, bounds = group_bounds(rows, key_columns)
    for start, end in itertools.pairwise(bounds):
        yield ordered.slice(int(start), int(end - start))


def iter_cogroups(
    left: pa.Table, left_keys: Sequence[str], right: pa.Table, right_keys: Sequence[str]
) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Each key present on either side: that key's rows of ``left`` and of ``right`` (one of the two
    empty, with its columns, when the key is on one side only, as Spark's cogroup passes it).

    One sort over both sides' keys together, so the two sides meet with the same equality as one
    side's rows (the n-th key of each side must have the same type)."""
    n_left, n = left.num_rows, left.num_rows + right.num_rows
    if n == 0:
        return
    components = []
    for lk, rk in zip(left_keys, right_keys, strict=True):
        both = pa.concat_arrays([left.column(lk).combine_chunks(), right.column(rk).combine_chunks()])
        components += _components(both)
    order, starts = _sorted_runs(components, n)
    bounds = np.append(np.flatnonzero(starts), n)
    for start, end in itertools.pairwise(bounds):
        rows = np.sort(order[int(start) : int(end)])  # each side's rows in their arrival order
        split = int(np.searchsorted(rows, n_left))
        yield left.take(rows[:split]), right.take(rows[split:] - n_left)
