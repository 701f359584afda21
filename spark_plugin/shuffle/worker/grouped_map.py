"""Spark's grouped-map function forms, run by a reduce task on the groups it found in Arrow.

What Spark decides, this module decides the same way, so a function written for
``applyInPandas`` / ``applyInArrow`` / ``cogroup(...).applyIn*`` runs here unchanged:

- **key or not**: the number of positional parameters (``inspect.getfullargspec(func).args``):
  1 or 2 for a grouped function (``func(data)`` / ``func(key, data)``), 2 or 3 for a cogrouped one
  (``func(left, right)`` / ``func(key, left, right)``); anything else is refused when called.
- **iterator or whole group**: type hints. ``Iterator[pa.RecordBatch] -> Iterator[pa.RecordBatch]``
  (Arrow) or ``Iterator[pd.DataFrame] -> Iterator[pd.DataFrame]`` (pandas) on the data parameter
  and the return, every parameter annotated: the function gets the group as an iterator of
  batches of at most ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (Spark 4.1+'s form);
  otherwise the whole group as one ``pa.Table`` / ``pd.DataFrame``.
- **the key**: Arrow functions get a tuple of ``pa.Scalar`` (the first row's key values); pandas
  functions the first row's values of the key columns of the converted frame (numpy scalars,
  ``NaN``/``None`` for a null key), as ``Series.iloc[0]`` gives them. In a cogroup the key comes
  from the left side, or from the right when the left has no rows for it.
- **the result**: a ``pa.Table`` (``pa.RecordBatch`` per item for the iterator form) whose
  columns are matched by name (by position when
  ``spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName`` is false) and whose types
  must equal the declared ones; a ``pd.DataFrame`` converted as Spark converts it
  (``compat.pandas_udf``). An empty result with no columns is no rows. Anything else fails the
  task with ``SchemaMismatchError`` naming the key group, the expected and the received columns.

The consumers returned here have the ``consume(reducer, batches)`` shape of ``tasks``; pure
functions of their inputs, tested without Spark.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arrow_shuffle.errors import SchemaMismatchError, ShuffleConfigError
from spark_plugin.compat.pandas_udf import PandasConversion, to_arrow, to_pandas
from spark_plugin.shuffle.worker.grouping import Rows, iter_cogroups, iter_groups
from spark_plugin.shuffle.worker.reduce_spill import bucket_rows, partition_rows
from spark_plugin.shuffle.worker.row_buckets import Side

API = ("pandas", "arrow")


@dataclass(frozen=True)
class FunctionForm:
    """How a user function is called, decided from its signature as Spark decides it."""

    api: str
    """``pandas`` or ``arrow``."""
    takes_key: bool
    """The key tuple is the first argument."""
    iterator: bool = False
    """The group arrives as an iterator of batches/frames and the result is one."""


@dataclass(frozen=True)
class GroupedCall:
    """Everything a reduce task needs to run a grouped-map function (pickled into the task)."""

    func: Callable[..., Any]
    form: FunctionForm
    out_schema: Any
    """The declared result schema, a pyspark ``StructType`` (pandas results are converted to it)."""
    out_arrow: pa.Schema
    """``out_schema`` in Arrow, as Spark's Arrow UDFs carry it (timestamps in UTC)."""
    conversion: PandasConversion
    max_records_per_batch: int = 10_000
    """``spark.sql.execution.arrow.maxRecordsPerBatch``: the iterator form's batch size."""
    emit_rows: int = 65_536
    """Results are gathered into batches of about this many rows before they leave the task."""


def form_of(func: Callable[..., Any], api: str, cogroup: bool = False) -> FunctionForm:
    """The form Spark would call ``func`` in; ``ShuffleConfigError`` for a parameter count it refuses."""
    if api not in API:
        raise ShuffleConfigError(f"api={api!r}: expected one of {', '.join(API)}")
    if not callable(func):
        raise ShuffleConfigError(f"func must be callable, not {type(func).__name__}")
    count = len(inspect.getfullargspec(func).args)
    allowed = (2, 3) if cogroup else (1, 2)
    if count not in allowed:
        shapes = "func(left, right) or func(key, left, right)" if cogroup else "func(data) or func(key, data)"
        raise ShuffleConfigError(
            f"a {'cogrouped' if cogroup else 'grouped'}-map {api} function takes {allowed[0]} or "
            f"{allowed[1]} positional arguments ({shapes}); {getattr(func, '__name__', func)!r} takes {count}"
        )
    takes_key = count == allowed[1]
    iterator = not cogroup and _iterator_hinted(func, api, count)
    return FunctionForm(api, takes_key, iterator)


def _iterator_hinted(func: Callable[..., Any], api: str, count: int) -> bool:
    """Spark 4.1+'s rule: every parameter and the return annotated, the data parameter and the
    return ``Iterator[pa.RecordBatch]`` (Arrow) / ``Iterator[pd.DataFrame]`` (pandas)."""
    if not inspect.getfullargspec(func).annotations:
        return False
    try:
        hints = typing.get_type_hints(func)
    except NameError:
        hints = {}
    except Exception as exc:  # an annotation that cannot be evaluated: Spark warns and goes on
        warnings.warn(f"Cannot infer the eval type from type hints: {exc}", UserWarning, stacklevel=3)
        return False
    signature = inspect.signature(func)
    params = [hints.get(p.name, p.annotation) for p in signature.parameters.values()]
    returned = hints.get("return", signature.return_annotation)
    if any(p is inspect.Parameter.empty for p in params) or returned is inspect.Signature.empty:
        return False
    item: type
    if api == "arrow":
        item = pa.RecordBatch
    else:
        import pandas as pd

        item = pd.DataFrame
    return _iterator_of(params[count - 1], item) and _iterator_of(returned, item)


def _iterator_of(annotation: Any, item: type) -> bool:
    return typing.get_origin(annotation) is collections.abc.Iterator and typing.get_args(annotation) == (
        item,
    )


# -- results -------------------------------------------------------------------------------------
def _describe(keys: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in keys.items())


def conform_arrow(
    out: object, call: GroupedCall, where: str, kind: type = pa.Table
) -> pa.Table | pa.RecordBatch | None:
    """``out`` with the declared columns in the declared order, None for no rows, or an error.

    Spark's checks: the type (``pa.Table``, or ``pa.RecordBatch`` for the iterator form), the
    column names (missing and unexpected ones named), then each column's type."""
    if not isinstance(out, kind):
        raise SchemaMismatchError(
            f"{where}: the function must return a {kind.__module__.split('.')[0]}.{kind.__name__}, "
            f"not {type(out).__name__}"
        )
    assert isinstance(out, pa.Table | pa.RecordBatch)
    if out.num_columns == 0 and out.num_rows == 0:
        return None
    want = call.out_arrow
    if call.conversion.assign_cols_by_name:
        missing = sorted(set(want.names) - set(out.schema.names))
        extra = sorted(set(out.schema.names) - set(want.names))
        if missing or extra:
            raise SchemaMismatchError(
                f"{where}: the result's column names do not match the declared schema "
                f"{want.names}.{_listed(' Missing', missing)}{_listed(' Unexpected', extra)}"
            )
        columns = [out.column(name) for name in want.names]
    else:
        if out.num_columns != len(want):
            raise SchemaMismatchError(
                f"{where}: the result has {out.num_columns} columns, the declared schema {len(want)}"
            )
        columns = list(out.columns)
    wrong = [
        f"column {field.name!r} (expected {field.type}, actual {column.type})"
        for field, column in zip(want, columns, strict=True)
        if column.type != field.type
    ]
    if wrong:
        raise SchemaMismatchError(f"{where}: the result's column types differ: {', '.join(wrong)}")
    if out.num_rows == 0:
        return None
    if isinstance(out, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(columns, schema=want)
    return pa.Table.from_arrays(columns, schema=want)


def conform_pandas(out: object, call: GroupedCall, where: str) -> pa.RecordBatch | None:
    """A pandas result as Spark converts it: a ``pd.DataFrame``, columns by name when any label
    is a string (else by position), values cast to the declared types."""
    import pandas as pd

    if not isinstance(out, pd.DataFrame):
        raise SchemaMismatchError(
            f"{where}: the function must return a pandas.DataFrame, not {type(out).__name__}"
        )
    want = call.out_arrow
    if out.empty and len(out.columns) == 0:
        return None
    labels = list(out.columns)
    if call.conversion.assign_cols_by_name and any(isinstance(c, str) for c in labels):
        missing = sorted(set(want.names) - {str(c) for c in labels})
        extra = sorted({str(c) for c in labels} - set(want.names))
        if missing or extra:
            raise SchemaMismatchError(
                f"{where}: the result's column names do not match the declared schema "
                f"{want.names}.{_listed(' Missing', missing)}{_listed(' Unexpected', extra)}"
            )
    elif len(labels) != len(want):
        raise SchemaMismatchError(
            f"{where}: the result has {len(labels)} columns, the declared schema {len(want)}"
        )
    try:
        batch = to_arrow(out, call.out_schema, call.conversion)
    except Exception as exc:
        raise SchemaMismatchError(
            f"{where}: the result cannot be converted to the declared schema {want}: {exc}"
        ) from exc
    if batch.num_rows == 0:
        return None
    if batch.schema.equals(want):
        return batch
    # Same values, other labels (a timestamp's zone, large vs small strings): the declared types.
    return pa.Table.from_batches([batch]).cast(want).combine_chunks().to_batches()[0]


def _listed(label: str, names: list[str]) -> str:
    return f"{label}: {', '.join(names)}." if names else ""


# -- one group -----------------------------------------------------------------------------------
def _slices(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """The group as record batches of at most ``rows`` rows (Spark's maxRecordsPerBatch)."""
    yield from table.combine_chunks().to_batches(max_chunksize=max(1, rows))


def _arrow_key(table: pa.Table, key_columns: Sequence[str]) -> tuple[pa.Scalar, ...]:
    return tuple(table.column(k)[0] for k in key_columns)


def _pandas_key(frame: Any, positions: Sequence[int]) -> tuple[Any, ...]:
    return tuple(frame.iloc[:, p].iloc[0] for p in positions)


def run_group(
    call: GroupedCall, group: pa.Table, key_columns: Sequence[str], where: str
) -> Iterator[pa.Table | pa.RecordBatch]:
    """The function on one key group; yields its conformed results (non-empty ones)."""
    form, func = call.form, call.func
    if form.api == "arrow":
        args: tuple[Any, ...] = (_arrow_key(group, key_columns),) if form.takes_key else ()
        if form.iterator:
            for item in func(*args, _slices(group, call.max_records_per_batch)):
                out = conform_arrow(item, call, where, pa.RecordBatch)
                if out is not None:
                    yield out
        else:
            out = conform_arrow(func(*args, group), call, where)
            if out is not None:
                yield out
        return
    positions = [group.schema.get_field_index(k) for k in key_columns]
    if form.iterator:
        frames = (
            to_pandas(pa.Table.from_batches([b]), call.conversion)
            for b in _slices(group, call.max_records_per_batch)
        )
        if form.takes_key:
            first = next(frames)
            key = _pandas_key(first, positions)
            results = func(key, _chain(first, frames))
        else:
            results = func(frames)
        for item in results:
            batch = conform_pandas(item, call, where)
            if batch is not None:
                yield batch
        return
    frame = to_pandas(group, call.conversion)
    args = (_pandas_key(frame, positions),) if form.takes_key else ()
    batch = conform_pandas(func(*args, frame), call, where)
    if batch is not None:
        yield batch


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def run_cogroup(
    call: GroupedCall,
    left: pa.Table,
    left_keys: Sequence[str],
    right: pa.Table,
    right_keys: Sequence[str],
    where: str,
) -> Iterator[pa.Table | pa.RecordBatch]:
    """The function on one cogroup (the key's rows of each side, one side possibly empty)."""
    form, func = call.form, call.func
    if form.api == "arrow":
        args: tuple[Any, ...] = ()
        if form.takes_key:
            args = (_arrow_key(left, left_keys) if left.num_rows else _arrow_key(right, right_keys),)
        out = conform_arrow(func(*args, left, right), call, where)
        if out is not None:
            yield out
        return
    left_frame, right_frame = to_pandas(left, call.conversion), to_pandas(right, call.conversion)
    args = ()
    if form.takes_key:
        if left.num_rows:
            args = (_pandas_key(left_frame, [left.schema.get_field_index(k) for k in left_keys]),)
        else:
            args = (_pandas_key(right_frame, [right.schema.get_field_index(k) for k in right_keys]),)
    batch = conform_pandas(func(*args, left_frame, right_frame), call, where)
    if batch is not None:
        yield batch


def _key_text(table: pa.Table, key_columns: Sequence[str]) -> str:
    return _describe({k: table.column(k)[0].as_py() for k in key_columns}) if table.num_rows else ""


# -- the reduce side -----------------------------------------------------------------------------
def grouped_consumer(
    call: GroupedCall,
    key_columns: Sequence[str],
    in_schema: pa.Schema,
    memory_bytes: int | None = None,
    partitions: int | None = None,
) -> Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``consume(reducer, batches)``: the reducer's rows grouped in Arrow, the function per group;
    past ``memory_bytes`` a spilled bucket of whole groups at a time (``reduce_spill``).
    ``partitions``: the shuffle's reduce partitions, which bucket a coalesced task's rows."""

    def consume(reducer: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rows in partition_rows(batches, in_schema, key_columns, memory_bytes, partitions=partitions):
            # Gathered a bucket at a time: results may view their group's rows, and holding them
            # past the bucket would keep its sorted copy alive while the next one is sorted.
            yield from _gathered(_bucket_outputs(rows, reducer), call)

    def _bucket_outputs(rows: Rows, reducer: int) -> Iterator[pa.Table | pa.RecordBatch]:
        if call.form.api == "pandas" and not call.form.iterator:  # conversions per run of groups
            from spark_plugin.shuffle.worker.pandas_groups import pandas_group_results

            def where(group: pa.Table) -> str:
                return f"key group ({_key_text(group, key_columns)}) of partition {reducer}"

            yield from pandas_group_results(call, rows, key_columns, conform_pandas, where)
            return
        for group in iter_groups(rows, key_columns):
            yield from run_group(
                call,
                group,
                key_columns,
                f"key group ({_key_text(group, key_columns)}) of partition {reducer}",
            )

    return consume


def cogrouped_consumer(
    call: GroupedCall,
    left_keys: Sequence[str],
    left_schema: pa.Schema,
    right_keys: Sequence[str],
    right_schema: pa.Schema,
    memory_bytes: int | None = None,
    partitions: int | None = None,
) -> Callable[[int, Iterator[pa.RecordBatch], Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``consume(reducer, left batches, right batches)``: the function once per key on either side;
    past ``memory_bytes`` (both sides together) a spilled bucket of whole keys at a time
    (``partitions``: the shuffle's reduce partitions, which bucket a coalesced task's rows)."""

    def consume(
        reducer: int, left_batches: Iterator[pa.RecordBatch], right_batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        sides = [Side(left_batches, left_schema, left_keys), Side(right_batches, right_schema, right_keys)]
        outputs = (
            out
            for left, right in bucket_rows(sides, memory_bytes, partitions=partitions)
            for lg, rg in iter_cogroups(left.release(), left_keys, right.release(), right_keys)
            for out in run_cogroup(
                call,
                lg,
                left_keys,
                rg,
                right_keys,
                f"cogroup ({_key_text(lg, left_keys) or _key_text(rg, right_keys)}) of partition {reducer}",
            )
        )
        yield from _gathered(outputs, call)

    return consume


def _gathered(outputs: Iterable[pa.Table | pa.RecordBatch], call: GroupedCall) -> Iterator[pa.RecordBatch]:
    """Small per-group results gathered into batches of about ``call.emit_rows`` rows."""
    pending: list[pa.Table] = []
    rows = 0
    for out in outputs:
        pending.append(out if isinstance(out, pa.Table) else pa.Table.from_batches([out]))
        rows += out.num_rows
        if rows >= call.emit_rows:
            yield from pa.concat_tables(pending).combine_chunks().to_batches()
            pending, rows = [], 0
    if pending:
        yield from pa.concat_tables(pending).combine_chunks().to_batches()


def pandas_batches(
    func: Callable[[Iterator[Any]], Iterator[Any]],
    out_schema: Any,
    out_arrow: pa.Schema,
    conversion: PandasConversion,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInPandas`` function as a ``mapInArrow`` one (what a chained ``map_in_pandas`` runs
    inside the map task): batches to frames, the function's frames back to Arrow."""
    call = GroupedCall(func, FunctionForm("pandas", False, True), out_schema, out_arrow, conversion)

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        frames = (to_pandas(pa.Table.from_batches([b]), conversion) for b in batches)
        for item in func(frames):
            batch = conform_pandas(item, call, "the map_in_pandas function")
            if batch is not None:
                yield batch

    return run
