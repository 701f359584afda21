"""Batches as a reduce task receives them, for tests of what it does with them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest

from spark_plugin.shuffle.worker import memory_buckets, row_buckets


def decoded(slices: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``slices`` as a reduce task receives a stream's batches: decoded from one IPC stream, each
    batch over buffers of its own sized to it, all of them slices of the stream's one buffer.

    A reduce task counts what it holds by its batches' buffers (``row_buckets.held_bytes``), and
    a slice's buffers are its whole table's: slices of one table would count it once per slice."""
    if not slices:
        return []
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, slices[0].schema) as writer:
        for batch in slices:
            writer.write_batch(batch)
    return list(pa.ipc.open_stream(sink.getvalue()))


def read_as_reducer(table: pa.Table, rows: int) -> list[pa.RecordBatch]:
    """``table`` in batches of at most ``rows`` rows, as a reduce task receives them."""
    return decoded(table.to_batches(max_chunksize=rows))


def decoded_apart(slices: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``slices`` as a reduce task reads them from map-output files: each decoded from IPC bytes
    of its own (a segment's), so that keeping one batch keeps no other's memory."""
    return [batch for one in slices for batch in decoded([one])]


def counted_splits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of every batch the in-memory buckets hand ``split_by_bucket`` from now on, in
    order: a split is a copy of the rows."""
    splits: list[int] = []
    split = row_buckets.split_by_bucket

    def counted(batch: pa.RecordBatch, *args: Any, **kwargs: Any) -> Iterator[Any]:
        splits.append(batch.num_rows)
        return split(batch, *args, **kwargs)

    monkeypatch.setattr(memory_buckets, "split_by_bucket", counted)
    return splits


def buffer_addresses(tables: Sequence[pa.Table | pa.RecordBatch]) -> set[int]:
    """Where every buffer of ``tables`` starts: shared addresses mean shared memory, no copy."""
    return {
        b.address
        for t in tables
        for column in t.columns
        for chunk in getattr(column, "chunks", [column])
        for b in chunk.buffers()
        if b is not None
    }


def rows_of(tables: Sequence[pa.Table | pa.RecordBatch]) -> Counter[tuple[object, int]]:
    """Every ``(k, v)`` row of ``tables``, counted: the same multiset means no row lost or doubled."""
    return Counter(
        (k, v) for t in tables for k, v in zip(t["k"].to_pylist(), t["v"].to_pylist(), strict=True)
    )
