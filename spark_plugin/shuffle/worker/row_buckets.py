"""Rows into hash buckets by their key: the vocabulary the reduce side's in-memory buckets
(``memory_buckets``) and spilled buckets (``reduce_spill``) share.

A bucket is chosen by the map side's key hash (``hash_rows``, which follows Spark's grouping
equality), remixed per splitting level (``bucket_of``) so a bucket's rows spread again although
they all came to one reduce partition by the same hash. A hot key, one hash held by most of a
partition's rows, gets a bucket of its own (``heavy_hash``). Also here: what a held batch costs
in memory (``held_bytes``) and the two ways a batch stops sharing memory it does not need
(``owning_copy``, ``handed_out``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from arrow_shuffle.partitioner import hash_rows
from spark_plugin.shuffle.key_buckets import FANOUT, HEAVY_SHARE, bucket_of


@dataclass(frozen=True)
class Side:
    """One input of a grouped call: its batches, their schema and its key columns."""

    batches: Iterable[pa.RecordBatch]
    schema: pa.Schema
    keys: Sequence[str]


def held_bytes(batch: pa.RecordBatch) -> int:
    """The memory ``batch``'s buffers take (``get_total_buffer_size``: 0.2 µs a batch), counted
    per batch where a reduce task reads and buckets its rows. Not ``nbytes``: it finds the byte
    ranges the arrays reference by building Arrow arrays of them on every call (5.6 µs for a
    1,000-row batch of three columns; five calls per batch took a tenth of a 20 M-row group
    cell's reduce CPU). The two agree on decoded batches, whose buffers are their own; on a slice
    this counts the whole buffers, which is what the slice keeps alive."""
    return int(batch.get_total_buffer_size())


def split_by_bucket(
    batch: pa.RecordBatch,
    keys: Sequence[str],
    level: int,
    own_copies: bool = False,
    hashes: np.ndarray | None = None,
    heavy: int | None = None,
) -> Iterator[tuple[int, pa.RecordBatch, np.ndarray]]:
    """``batch``'s rows by the bucket of their key hash at ``level``: each non-empty bucket, its
    rows and their key hashes (``hashes``: already known, ``hash_rows``'s). The rows are slices of
    one reordered copy, or with ``own_copies`` a copy per bucket (rows kept in memory: a bucket's
    memory then goes with the bucket). Rows whose hash is ``heavy`` go to a bucket of their own,
    ``FANOUT`` (a hot key's: ``MemoryBuckets``)."""
    if batch.num_rows == 0:
        return
    if hashes is None:
        hashes = hash_rows(batch, keys)
    buckets = bucket_of(hashes, level)
    if heavy is not None:
        buckets[hashes == np.uint64(heavy)] = FANOUT
    order = np.argsort(buckets, kind="stable")
    hashes = hashes[order]
    counts = np.bincount(buckets, minlength=FANOUT + 1)
    ordered = None if own_copies else batch.take(pa.array(order))
    start = 0
    for bucket, count in enumerate(counts.tolist()):
        if count:
            end = start + count
            rows = batch.take(pa.array(order[start:end])) if ordered is None else ordered.slice(start, count)
            yield bucket, rows, hashes[start:end]
            start = end


_VECTOR_HASHED = (
    pa.types.is_integer,
    pa.types.is_boolean,
    pa.types.is_floating,
    pa.types.is_date,
    pa.types.is_time,
    pa.types.is_timestamp,
    pa.types.is_duration,
)


def vector_hashed(side: Side) -> bool:
    """Does ``hash_rows`` hash every key of ``side`` with numpy alone? (Strings and binaries take
    a Python call per distinct value: 600 k distinct strings took 0.64-0.76 s to hash, more than the
    sorted copy bucketing saves.)"""
    return all(any(test(side.schema.field(key).type) for test in _VECTOR_HASHED) for key in side.keys)


HEAVY_SAMPLE_ROWS = 1 << 16
"""Rows whose key hash ``heavy_hash`` looks at, spread evenly over what is held (only their keys
are hashed)."""


def heavy_hash(batches: Sequence[tuple[pa.RecordBatch, Sequence[str]]]) -> int | None:
    """The key hash of at least ``HEAVY_SHARE`` of the rows of ``batches`` (each with its key
    columns; up to about ``HEAVY_SAMPLE_ROWS`` of them, spread evenly), or ``None``.

    Why: a hot key shares its hash bucket with other keys, so grouping that bucket sorts and copies
    all of the hot key's rows (12 M rows of the 20 M-row hot matrix cell: 0.43 s). Alone in a
    bucket it is one group, which the grouping hands on as it is (``grouping.group_bounds``).
    Decided when a partition's in-memory hash buckets begin, before any row is in one, so every
    row of that hash goes to the same bucket."""
    step = max(1, sum(batch.num_rows for batch, _ in batches) // HEAVY_SAMPLE_ROWS)
    hashes = [
        hash_rows(batch.select(keys).take(pa.array(np.arange(0, batch.num_rows, step))), keys)
        for batch, keys in batches
        if batch.num_rows
    ]
    if not hashes:
        return None
    sample = np.concatenate(hashes)
    values, counts = np.unique(sample, return_counts=True)
    top = int(np.argmax(counts))
    return int(values[top]) if counts[top] >= HEAVY_SHARE * len(sample) else None


def owning_copy(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column in memory of its own (a memory copy: 4.8 GB/s measured here)."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


def handed_out(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` in order, each removed from the list as it is handed out: once the caller has
    written or bucketed it, nothing here keeps it alive."""
    batches.reverse()
    while batches:
        yield batches.pop()
