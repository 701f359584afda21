"""A reduce partition larger than its memory: whole key groups, one bucket of them at a time.

A grouped call (``group_apply``, the ``applyInPandas``/``applyInArrow`` take-overs, cogroups)
needs each key group whole, never the whole partition. While a reduce task's rows fit in
``SORT_UNIT_BYTES`` they are grouped in memory as one table. Past that, while they fit in
``spark.arrowbeat.shuffle.reduceMemory``, they are hash-bucketed in memory as they arrive and
grouped a bucket at a time, so grouping's sorted copy is a bucket's (a coalesced reduce task's
buckets are its reduce partitions, whose batches move whole: ``MemoryBuckets``; keys whose hash
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

from spark_plugin.shuffle.key_buckets import FANOUT
from spark_plugin.shuffle.worker.grouping import Rows
from spark_plugin.shuffle.worker.memory_buckets import SORT_UNIT_BYTES, MemoryBuckets
from spark_plugin.shuffle.worker.row_buckets import (
    Side,
    handed_out,
    heavy_hash,
    held_bytes,
    owning_copy,
    split_by_bucket,
    vector_hashed,
)

MAX_DEPTH = 3
"""Levels of splitting (16 ** 3 = 4,096 buckets) before a bucket comes back at whatever size."""

_counter = threading.local()


def spilled_bytes() -> int:
    """Bytes of rows this thread has written to spill files so far, each level of splitting
    counted (a reduce task reads it before and after its function ran: its read report's
    ``spill_bytes``)."""
    return int(getattr(_counter, "bytes", 0))


def _count_spilled(n: int) -> None:
    _counter.bytes = spilled_bytes() + n


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
    (``MemoryBuckets``)."""
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
    partitions, a batch moved whole where all its rows share one (``MemoryBuckets``).

    One side's rows held as one table past ``sort_unit_bytes`` (keys not bucketed in memory) are
    held as copies of their own: a decoded batch's columns all view its frame's memory, which no
    column of it frees alone, so without the copy the grouping could not drop a column as it
    sorts (a cogroup takes each key's rows from whole tables: no copy for it)."""
    if partitions is not None and partitions < 1:
        raise ValueError(f"cannot bucket rows by {partitions} partitions")
    held: list[list[pa.RecordBatch]] = [[] for _ in sides]
    bucketed = all(map(vector_hashed, sides))  # past the sort unit, in memory buckets
    copied = len(sides) == 1 and not bucketed  # past the sort unit, one table of copies
    in_memory: MemoryBuckets | None = None
    size = 0
    iterators = [iter(side.batches) for side in sides]
    for index, batches in enumerate(iterators):
        for batch in batches:
            size += held_bytes(batch)
            if in_memory is None:
                held[index].append(owning_copy(batch) if copied and size > sort_unit_bytes else batch)
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
                in_memory = MemoryBuckets(sides, partitions, sort_unit_bytes, heavy)
                for i, side_held in enumerate(held):
                    in_memory.write_all(i, side_held)  # emptied as they are bucketed
        batch = None  # held or bucketed now: this frame must not keep the last one's frame alive
    if in_memory is not None:
        yield from in_memory.buckets()
        return
    yield [Rows.of_batches(h, s.schema) for h, s in zip(held, sides, strict=True)]


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
            for batch in handed_out(side_held):
                writers.write(i, batch)
        for i in range(reading, len(sides)):
            for batch in iterators[i]:
                writers.write(i, batch)
        yield from _read_back(writers.close(), sides, memory_bytes, level=0)


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
