"""A reduce partition larger than its memory: whole key groups, one bucket of them at a time.

A grouped call (``group_apply``, the ``applyInPandas``/``applyInArrow`` take-overs, cogroups)
needs each key group whole, never the whole partition. While a reduce task's rows fit in
``SORT_UNIT_BYTES`` they are grouped in memory as one table. Past that, while they fit in
``spark.arrowbeat.shuffle.reduceMemory``, they are hash-bucketed in memory as they arrive and
grouped a bucket at a time, so grouping's sorted copy is a bucket's (a coalesced reduce task's
buckets are its reduce partitions, whose batches move whole: ``_MemoryBuckets``; keys whose hash
needs a Python call per value, strings say, stay one table: hashing them would cost more than the
copy saves). Nothing is written in either case. Past the budget, every row goes to one of ``FANOUT``
bucket files on the executor's local disk by a hash of its key, so all rows of a key share a
bucket, and the buckets come back one at a time as memory-mapped Arrow IPC files: what a bucket
holds is file pages the kernel can drop, not the worker's heap. A bucket still larger than the
budget is split again with another salt, up to ``MAX_DEPTH`` levels; a bucket whose rows all share
one key (one key hash) is never split and comes back whole, as Spark too needs one group at a
time for ``applyInPandas``.

Spark's own path reaches the same bound differently (sorted runs spilled on the JVM side, groups
streamed to Python); hash buckets need no sort of the spilled data. The hash is the map side's
(``hash_rows``), which follows Spark's grouping equality, remixed per level so a bucket's rows
spread although they all came to this partition by the same hash.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from arrow_shuffle.partitioner import hash_rows, remix
from spark_plugin.shuffle.worker.grouping import Rows

FANOUT = 16
"""Buckets per split: a partition of 16 x the budget fits in one level."""
MAX_DEPTH = 3
"""Levels of splitting (16 ** 3 = 4,096 buckets) before a bucket comes back at whatever size."""
SORT_UNIT_BYTES = 16 << 20
"""Past this, a partition held in memory is hash-bucketed as it arrives and grouped a bucket at a
time: grouping takes a key-sorted copy of its table (and pyarrow concatenates a chunked string
column to take from it), so those copies are a bucket's size, not the partition's."""

_counter = threading.local()


def spilled_bytes() -> int:
    """Bytes of rows this thread has written to spill files so far, each level of splitting
    counted (a reduce task reads it before and after its function ran: its read report's
    ``spill_bytes``)."""
    return int(getattr(_counter, "bytes", 0))


def held_bytes(batch: pa.RecordBatch) -> int:
    """The memory ``batch``'s buffers take (``get_total_buffer_size``: 0.2 µs a batch), counted
    per batch where a reduce task reads and buckets its rows. Not ``nbytes``: it finds the byte
    ranges the arrays reference by building Arrow arrays of them on every call (5.6 µs for a
    1,000-row batch of three columns; five calls per batch took a tenth of a 20 M-row group
    cell's reduce CPU). The two agree on decoded batches, whose buffers are their own; on a slice
    this counts the whole buffers, which is what the slice keeps alive."""
    return int(batch.get_total_buffer_size())


def _count_spilled(n: int) -> None:
    _counter.bytes = spilled_bytes() + n


@dataclass(frozen=True)
class Side:
    """One input of a grouped call: its batches, their schema and its key columns."""

    batches: Iterable[pa.RecordBatch]
    schema: pa.Schema
    keys: Sequence[str]


def partition_rows(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    keys: Sequence[str],
    memory_bytes: int | None,
    sort_unit_bytes: int = SORT_UNIT_BYTES,
    partitions: int | None = None,
) -> Generator[Rows, None, None]:
    """The partition's rows in sets of whole key groups: one set while they fit in
    ``sort_unit_bytes``, else one per non-empty bucket (from memory within ``memory_bytes``,
    ``None``: no bound, else from disk). Each is ``Rows``, handed on: nothing here keeps it.
    ``partitions``: the shuffle's reduce partitions, when each batch is likely one's rows
    (``_MemoryBuckets``)."""
    sides = [Side(batches, schema, keys)]
    for rows in bucket_rows(sides, memory_bytes, sort_unit_bytes, partitions):
        yield rows[0]


def bucket_rows(
    sides: Sequence[Side],
    memory_bytes: int | None,
    sort_unit_bytes: int = SORT_UNIT_BYTES,
    partitions: int | None = None,
) -> Generator[list[Rows], None, None]:
    """Every side's rows of one set of keys at a time (one ``Rows`` per side, the same keys on
    each): all of it while the sides fit in ``sort_unit_bytes`` together, bucket by bucket from
    memory while they fit in ``memory_bytes`` (``None``: no bound), else bucket by bucket from
    disk. A bucket with rows on one side only has empty ``Rows`` with its columns on the other.
    With ``partitions`` (the shuffle's reduce partitions) the buckets in memory are those
    partitions, a batch moved whole where all its rows share one (``_MemoryBuckets``).

    One side's rows held as one table past ``sort_unit_bytes`` (keys not bucketed in memory) are
    held as copies of their own: a decoded batch's columns all view its frame's memory, which no
    column of it frees alone, so without the copy the grouping could not drop a column as it
    sorts (a cogroup takes each key's rows from whole tables: no copy for it)."""
    if partitions is not None and partitions < 1:
        raise ValueError(f"cannot bucket rows by {partitions} partitions")
    held: list[list[pa.RecordBatch]] = [[] for _ in sides]
    bucketed = all(map(_vector_hashed, sides))  # past the sort unit, in memory buckets
    copied = len(sides) == 1 and not bucketed  # past the sort unit, one table of copies
    in_memory: _MemoryBuckets | None = None
    size = 0
    iterators = [iter(side.batches) for side in sides]
    for index, batches in enumerate(iterators):
        for batch in batches:
            size += held_bytes(batch)
            if in_memory is None:
                held[index].append(_owning_copy(batch) if copied and size > sort_unit_bytes else batch)
            else:
                in_memory.write(index, batch)
            if memory_bytes is not None and size > memory_bytes:
                if in_memory is not None:
                    held = in_memory.drain()
                yield from _spilled(held, iterators, index, sides, memory_bytes)
                return
            if in_memory is None and size > sort_unit_bytes and bucketed:
                heavy = None  # with partitions, decided per partition that grows past the sort unit
                if partitions is None:
                    heavy = heavy_hash(
                        [(b, side.keys) for side, h in zip(sides, held, strict=True) for b in h]
                    )
                in_memory = _MemoryBuckets(sides, partitions, sort_unit_bytes, heavy)
                for i, side_held in enumerate(held):
                    in_memory.write_all(i, side_held)  # emptied as they are bucketed
        batch = None  # held or bucketed now: this frame must not keep the last one's frame alive
    if in_memory is not None:
        yield from in_memory.buckets()
        return
    yield [Rows.of_batches(h, s.schema) for h, s in zip(held, sides, strict=True)]


def _owning_copy(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with each column in memory of its own (a memory copy: 4.8 GB/s measured here)."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns], schema=batch.schema)


HEAVY_SHARE = 0.5
"""A key hash held by at least this share of a partition's first rows, once they pass the sort
unit, is a hot key's: its rows get a hash bucket of their own (``heavy_hash``)."""
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


def _views_more_memory(batch: pa.RecordBatch, size: int) -> bool:
    """Do ``batch``'s columns view an allocation over twice its ``size``? A stream's payload packs
    the small batches of consecutive segments, several partitions' (``arrow_shuffle.codec``), and
    decodes them in place: one of them kept whole keeps the whole payload (a file read's batch is
    its one-partition segment's). Each column's last buffer, followed to the memory it slices."""
    for column in batch.columns:
        buffers = [b for b in column.buffers() if b is not None]
        if not buffers:
            continue
        memory = buffers[-1]
        while memory.parent is not None:
            memory = memory.parent
        if memory.size > 2 * size:
            return True
    return False


def _spilled(
    held: list[list[pa.RecordBatch]],
    iterators: list[Iterator[pa.RecordBatch]],
    reading: int,
    sides: Sequence[Side],
    memory_bytes: int,
) -> Iterator[list[Rows]]:
    """The rows held so far, then the rest of side ``reading`` and of every side after it, written
    to level-0 buckets and read back (``_read_back``); the held batches are dropped once written."""
    with _spill_folder() as folder:
        writers = _Buckets(folder, sides, level=0)
        for i, side_held in enumerate(held):
            for batch in _handed_out(side_held):
                writers.write(i, batch)
        for i in range(reading, len(sides)):
            for batch in iterators[i]:
                writers.write(i, batch)
        yield from _read_back(writers.close(), sides, memory_bytes, level=0)


def _handed_out(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``batches`` in order, each removed from the list as it is handed out: once the caller has
    written or bucketed it, nothing here keeps it alive."""
    batches.reverse()
    while batches:
        yield batches.pop()


def _read_back(
    buckets: list[_Bucket], sides: Sequence[Side], memory_bytes: int, level: int
) -> Iterator[list[Rows]]:
    """Each bucket's rows, a bucket over budget split again (one level deeper) unless it cannot
    be: the deepest level, or every row of it has one key (one key hash)."""
    for bucket in buckets:
        files = bucket.files
        if all(f is None for f in files):
            continue
        on_disk = sum(f.stat().st_size for f in files if f is not None)
        if on_disk > memory_bytes and level + 1 < MAX_DEPTH and not bucket.one_key:
            folder = Path(tempfile.mkdtemp(prefix=f"level{level + 1}-", dir=_parent(files)))
            try:
                writers = _Buckets(folder, sides, level + 1)
                for i, path in enumerate(files):
                    if path is not None:
                        for batch in _mapped(path).to_batches():
                            writers.write(i, batch)
                        path.unlink()
                yield from _read_back(writers.close(), sides, memory_bytes, level + 1)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            continue
        yield _mapped_rows(files, sides)
        for f in files:
            if f is not None:
                f.unlink()


def _parent(files: list[Path | None]) -> Path:
    return next(f for f in files if f is not None).parent


def _mapped_rows(files: list[Path | None], sides: Sequence[Side]) -> list[Rows]:
    return [
        Rows(side.schema.empty_table() if path is None else _mapped(path))
        for path, side in zip(files, sides, strict=True)
    ]


def _mapped(path: Path) -> pa.Table:
    """A spilled bucket as a table over the file's pages (no copy onto the heap)."""
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def bucket_of(hashes: np.ndarray, level: int) -> np.ndarray:
    """The bucket (0 to ``FANOUT - 1``) of each key hash at splitting ``level``, as one byte: a
    stable sort of bytes is numpy's radix sort (measured: 1 M rows in 2.8 ms and 4 M in 35 ms,
    against 31 and 165 ms for the same buckets as int64, which numpy sorts by timsort)."""
    salt = np.uint64(0x9E3779B97F4A7C15 * (level + 1) & 0xFFFFFFFFFFFFFFFF)
    return (remix(hashes, salt) % np.uint64(FANOUT)).astype(np.uint8)


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
    ``FANOUT`` (a hot key's: ``_MemoryBuckets``)."""
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


def _vector_hashed(side: Side) -> bool:
    """Does ``hash_rows`` hash every key of ``side`` with numpy alone? (Strings and binaries take
    a Python call per distinct value: 600 k distinct strings took 0.64-0.76 s to hash, more than the
    sorted copy bucketing saves.)"""
    return all(any(test(side.schema.field(key).type) for test in _VECTOR_HASHED) for key in side.keys)


SPLIT_BYTES = 4 << 20
"""Rows a side gathers before they are split into buckets at once (``_MemoryBuckets``): a reduce
task reads a segment per map output, reduce partition and run, often a thousand rows or fewer,
and splitting each on its own cost a hash, a sort and a ``take`` per bucket of every one of
them (0.6 of a task's 0.9 s of CPU on the 20 M-row matrix cells)."""


class _MemoryBuckets:
    """Each side's rows per bucket, in memory: a partition over the sort unit grouped a bucket at a
    time. Arriving batches are gathered up to ``SPLIT_BYTES`` per side and filed together.

    By default the buckets are ``FANOUT`` of the key hash (level 0, the first on-disk level too),
    each holding copies of its own rows, and with a ``heavy`` hash (a hot key's) one more, for its
    rows alone. With ``partitions`` (the shuffle's reduce partitions) they
    are those partitions, found as the map side routes rows (``map_output.route``): a coalesced
    reduce task reads a segment per map output, reduce partition and run, so each batch it reads
    is one partition's rows and moves to its bucket whole, where a split copied every row (a take,
    and a concatenation before it, then a grouping's sort copied them again). Each gathered set is
    hashed at once to check that, so a batch of several partitions is split by copies, and rows
    never meet in a bucket but by their key; a batch that views a larger payload (a stream's) is
    copied, so that its bucket's memory goes with the bucket. A partition that grows past
    ``sort_unit_bytes`` (a hot key's) is bucketed by hash from then on, as without ``partitions``,
    the hashes of the rows that reach it after that reused."""

    def __init__(
        self,
        sides: Sequence[Side],
        partitions: int | None = None,
        sort_unit_bytes: int = SORT_UNIT_BYTES,
        heavy: int | None = None,
    ) -> None:
        if partitions is not None and partitions < 1:
            raise ValueError(f"cannot bucket rows by {partitions} partitions")
        self._sides = sides
        self._partitions = partitions
        self._heavy = heavy
        """A key hash whose rows have a hash bucket of their own (``heavy_hash``)."""
        self._sort_unit_bytes = sort_unit_bytes
        self._rows: list[dict[int, list[pa.RecordBatch]]] = [{} for _ in sides]
        self._sizes: dict[int, int] = {}
        """Bytes held per partition bucket, every side's."""
        self._within: dict[int, _MemoryBuckets] = {}
        """Partitions past the sort unit, bucketed by hash (``FANOUT``) within."""
        self._gathered: list[list[tuple[pa.RecordBatch, np.ndarray | None]]] = [[] for _ in sides]
        self._gathered_bytes = [0 for _ in sides]

    def write(self, side: int, batch: pa.RecordBatch, hashes: np.ndarray | None = None) -> None:
        """Bucket ``batch`` (its rows' ``hash_rows``, when known, are ``hashes``)."""
        size = held_bytes(batch)
        if size >= SPLIT_BYTES:  # split alone: joined to the gathered ones, copied once more
            self._split(side)
        self._gathered[side].append((batch, hashes))
        self._gathered_bytes[side] += size
        if self._gathered_bytes[side] >= SPLIT_BYTES:
            self._split(side)

    def write_all(self, side: int, batches: list[pa.RecordBatch]) -> None:
        """Every batch of ``batches``, each removed from the list as it is bucketed (its copy is)."""
        for batch in _handed_out(batches):
            self.write(side, batch)

    def _split(self, side: int) -> None:
        gathered, self._gathered[side], self._gathered_bytes[side] = self._gathered[side], [], 0
        gathered = [(batch, hashes) for batch, hashes in gathered if batch.num_rows]
        if not gathered:
            return
        if self._partitions is not None:
            self._file_by_partition(side, [batch for batch, _ in gathered])
            return
        batches = [batch for batch, _ in gathered]
        known = [hashes for _, hashes in gathered if hashes is not None]
        hashes = np.concatenate(known) if len(known) == len(gathered) else None
        del gathered
        self._split_batches(side, batches, hashes)

    def _split_batches(self, side: int, batches: list[pa.RecordBatch], hashes: np.ndarray | None) -> None:
        """``batches`` (``hashes``: their rows' ``hash_rows``, or None) split into the hash buckets
        at once, each bucket's rows a copy of their own."""
        if len(batches) > 1:  # one batch of them all (the caller's list keeps the pieces till then)
            batches = pa.Table.from_batches(batches).combine_chunks().to_batches()
        for rows in batches:  # one, combined
            keys = self._sides[side].keys
            split = split_by_bucket(rows, keys, level=0, own_copies=True, hashes=hashes, heavy=self._heavy)
            for bucket, own, _ in split:
                self._rows[side].setdefault(bucket, []).append(own)

    def _file_by_partition(self, side: int, gathered: list[pa.RecordBatch]) -> None:
        """Each batch to the bucket of its rows' partition, whole (no copy) when they all have one;
        a batch of several partitions is split, each partition's rows a copy of their own. A set
        whose rows all go to a partition bucketed by hash is split at once (a hot task's)."""
        assert self._partitions is not None
        hashes = hash_rows(pa.Table.from_batches(gathered), self._sides[side].keys)
        ids = hashes % np.uint64(self._partitions)
        starts = np.cumsum([0] + [batch.num_rows for batch in gathered[:-1]])
        lows, highs = np.minimum.reduceat(ids, starts).tolist(), np.maximum.reduceat(ids, starts).tolist()
        within = self._within.get(lows[0]) if min(lows) == max(highs) else None
        if within is not None:
            within._split(side)  # what it gathered before, first
            within._split_batches(side, gathered, hashes)
            return
        for batch, start, low, high in zip(gathered, starts.tolist(), lows, highs, strict=True):
            end = start + batch.num_rows
            if low == high:
                self._file(side, low, batch, hashes[start:end])
                continue
            order = np.argsort(ids[start:end], kind="stable")
            values, counts = np.unique(ids[start:end], return_counts=True)
            taken = 0
            for partition, count in zip(values.tolist(), counts.tolist(), strict=True):
                rows = order[taken : taken + count]
                self._file(side, partition, batch.take(pa.array(rows)), hashes[start:end][rows])
                taken += count

    def _file(self, side: int, partition: int, batch: pa.RecordBatch, hashes: np.ndarray) -> None:
        within = self._within.get(partition)
        if within is not None:  # a copy: a view would keep the whole gathered set's hashes
            within.write(side, batch, hashes.copy())
            return
        size = held_bytes(batch)
        if _views_more_memory(batch, size):
            batch = _owning_copy(batch)
        self._rows[side].setdefault(partition, []).append(batch)
        self._sizes[partition] = self._sizes.get(partition, 0) + size
        if self._sizes[partition] > self._sort_unit_bytes:  # a hot key's, say: by hash from now on
            pieces = [self._rows[i].pop(partition, []) for i in range(len(self._sides))]
            heavy = heavy_hash(
                [(b, s.keys) for s, held in zip(self._sides, pieces, strict=True) for b in held]
            )
            within = self._within[partition] = _MemoryBuckets(self._sides, heavy=heavy)
            for i, held in enumerate(pieces):
                within.write_all(i, held)  # hashed again: a sort unit's

    def drain(self) -> list[list[pa.RecordBatch]]:
        """Every side's rows so far (bucket after bucket, then those not split yet), no longer held here."""
        rows, self._rows = self._rows, [{} for _ in self._sides]
        within, self._within, self._sizes = self._within, {}, {}
        gathered, self._gathered = self._gathered, [[] for _ in self._sides]
        self._gathered_bytes = [0 for _ in self._sides]
        drained = [[piece for bucket in sorted(side) for piece in side[bucket]] for side in rows]
        for inner in within.values():
            for side, pieces in enumerate(inner.drain()):
                drained[side] += pieces
        for side, rest in enumerate(gathered):
            drained[side] += [batch for batch, _ in rest]
        return drained

    def buckets(self) -> Iterator[list[Rows]]:
        """Each non-empty bucket's rows per side, handed on: once its grouping has sorted them and
        its groups are done, nothing here holds them. A hash bucket's columns are copies of their
        own, so a hot bucket is held once, not beside its sorted copy (a partition bucket's batches
        are as they were read, within the sort unit). A partition bucketed by hash comes back as
        its hash buckets; consecutive small partitions come back together, up to ``SPLIT_BYTES``
        (a grouping's cost per bucket, pandas conversions say, is then paid once for them all:
        a pandas job of 100 partitions of 0.6 MB per task ran 2% slower one by one)."""
        for side in range(len(self._sides)):
            self._split(side)
        merged: list[list[pa.RecordBatch]] = [[] for _ in self._sides]
        merged_bytes = 0
        for bucket in sorted(set(self._within).union(*self._rows)):
            within = self._within.pop(bucket, None)
            size = self._sizes.pop(bucket, 0)
            if any(merged) and (
                within is not None or self._partitions is None or merged_bytes + size > SPLIT_BYTES
            ):
                yield self._handed_over(merged)
                merged, merged_bytes = [[] for _ in self._sides], 0
            if within is not None:
                yield from within.buckets()
                continue
            for side in range(len(self._sides)):
                merged[side] += self._rows[side].pop(bucket, [])
            merged_bytes += size
        if any(merged):
            yield self._handed_over(merged)

    def _handed_over(self, pieces: list[list[pa.RecordBatch]]) -> list[Rows]:
        return [Rows.of_batches(p, s.schema) for p, s in zip(pieces, self._sides, strict=True)]


@dataclass(frozen=True)
class _Bucket:
    files: list[Path | None]
    """Each side's file (``None``: no row of that side)."""
    one_key: bool
    """Every row of every side has the same key hash: splitting cannot shrink it."""


class _Buckets:
    """``FANOUT`` Arrow IPC files per side, opened on first use, each row to the bucket of its
    key's hash at ``level``."""

    def __init__(self, folder: Path, sides: Sequence[Side], level: int) -> None:
        self._folder = folder
        self._sides = sides
        self._level = level
        self._writers: dict[tuple[int, int], tuple[Path, pa.NativeFile, pa.ipc.RecordBatchFileWriter]] = {}
        self._first_hash: dict[int, int] = {}
        self._mixed: set[int] = set()

    def write(self, side: int, batch: pa.RecordBatch) -> None:
        for bucket, rows, hashes in split_by_bucket(batch, self._sides[side].keys, self._level):
            self._writer(side, bucket).write_batch(rows)
            self._note_keys(bucket, hashes)
        _count_spilled(held_bytes(batch))  # once per batch: each slice would count a dictionary again

    def _writer(self, side: int, bucket: int) -> pa.ipc.RecordBatchFileWriter:
        entry = self._writers.get((side, bucket))
        if entry is None:
            path = self._folder / f"side{side}-bucket{bucket:02d}.arrow"
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # private from birth
            sink = pa.OSFile(str(path), "wb")
            entry = (path, sink, pa.ipc.new_file(sink, self._sides[side].schema))
            self._writers[(side, bucket)] = entry
        return entry[2]

    def _note_keys(self, bucket: int, hashes: np.ndarray) -> None:
        if bucket in self._mixed:
            return
        first = self._first_hash.setdefault(bucket, int(hashes[0]))
        if int(hashes.min()) != first or int(hashes.max()) != first:
            self._mixed.add(bucket)

    def close(self) -> list[_Bucket]:
        """Every bucket: each side's file and whether all its rows have one key."""
        for _path, sink, writer in self._writers.values():
            writer.close()
            sink.close()
        sides = range(len(self._sides))
        return [
            _Bucket(
                [self._writers[(s, b)][0] if (s, b) in self._writers else None for s in sides],
                b not in self._mixed,
            )
            for b in range(FANOUT)
        ]


def spill_roots() -> list[str]:
    """Where spill files go: the executor's Spark local dirs (``SPARK_LOCAL_DIRS``, which Spark
    sets for its Python workers), else the system's temporary folder."""
    roots = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d and os.path.isdir(d)]
    return roots or [tempfile.gettempdir()]


@contextlib.contextmanager
def _spill_folder() -> Iterator[Path]:
    """A private (0700) folder under one of the spill roots, removed with everything in it."""
    folder = Path(tempfile.mkdtemp(prefix="arrowbeat-reduce-spill-", dir=random.choice(spill_roots())))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
