"""A reduce partition over the sort unit, held in memory and grouped a bucket at a time
(``MemoryBuckets``): what ``reduce_spill.bucket_rows`` uses while the rows fit in
``spark.arrowbeat.shuffle.reduceMemory``; past that they go to disk (``reduce_spill``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from arrow_shuffle.partitioner import hash_rows
from spark_plugin.shuffle.key_buckets import FANOUT, hot_tails
from spark_plugin.shuffle.worker.grouping import Rows
from spark_plugin.shuffle.worker.row_buckets import (
    Side,
    handed_out,
    heavy_hash,
    held_bytes,
    owning_copy,
    split_by_bucket,
)

SORT_UNIT_BYTES = 16 << 20
"""Past this, a partition held in memory is hash-bucketed as it arrives and grouped a bucket at a
time: grouping takes a key-sorted copy of its table (and pyarrow concatenates a chunked string
column to take from it), so those copies are a bucket's size, not the partition's."""


SPLIT_BYTES = 4 << 20
"""Rows a side gathers before they are split into buckets at once (``MemoryBuckets``): a reduce
task reads a segment per map output, reduce partition and run, often a thousand rows or fewer,
and splitting each on its own cost a hash, a sort and a ``take`` per bucket of every one of
them (0.6 of a task's 0.9 s of CPU on the 20 M-row matrix cells)."""


class MemoryBuckets:
    """Each side's rows per bucket, in memory: a partition over the sort unit grouped a bucket at a
    time. Arriving batches are gathered up to ``SPLIT_BYTES`` per side and filed together.

    By default the buckets are ``FANOUT`` of the key hash (level 0, the first on-disk level too),
    each holding copies of its own rows, and with a ``heavy`` hash (a hot key's) one more, for its
    rows alone (slices of the batches read, where a grouped shuffle's map side wrote them last:
    ``key_buckets``). With ``partitions`` (the shuffle's reduce partitions) they
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
        self._within: dict[int, MemoryBuckets] = {}
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
        for batch in handed_out(batches):
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
        at once, each bucket's rows a copy of their own; a hot key's rows that end a batch, as a
        grouped shuffle's map side writes them, are filed as a slice of it (``_hot_tails``)."""
        if hashes is None:  # hashed here once, for the hot tails and the split
            hashes = hash_rows(pa.Table.from_batches(batches), self._sides[side].keys)
        batches, hashes = self._hot_tails(side, batches, hashes)
        if not batches:
            return
        if len(batches) > 1:  # one batch of them all (the caller's list keeps the pieces till then)
            batches = pa.Table.from_batches(batches).combine_chunks().to_batches()
        for rows in batches:  # one, combined
            keys = self._sides[side].keys
            split = split_by_bucket(rows, keys, level=0, own_copies=True, hashes=hashes, heavy=self._heavy)
            for bucket, own, _ in split:
                self._rows[side].setdefault(bucket, []).append(own)

    def _hot_tails(
        self, side: int, batches: list[pa.RecordBatch], hashes: np.ndarray
    ) -> tuple[list[pa.RecordBatch], np.ndarray]:
        """File the run of hot-key rows that ends each batch (``key_buckets.hot_key_last``) in the
        hot key's bucket as a slice of the batch, where a copy per bucket copied every one of them
        (the hot matrix cell's 12 M rows, a third of its reduce task's CPU); the rest of the rows,
        and their hashes, to be split by copies. Only where the slice keeps nothing much besides:
        a tail of at least half its batch, of a batch that holds no larger payload (a stream's);
        and not at all when some hot row comes before another row (another order than the map
        side's, or another hot key than it guessed)."""
        if self._heavy is None:
            return batches, hashes
        hot = hashes == np.uint64(self._heavy)
        sizes = np.array([batch.num_rows for batch in batches], dtype=np.int64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        tails = hot_tails(hot, starts, ends)
        if tails is None:
            return batches, hashes
        rest: list[pa.RecordBatch] = []
        rest_hashes: list[np.ndarray] = []
        for batch, start, tail, end in zip(
            batches, starts.tolist(), tails.tolist(), ends.tolist(), strict=True
        ):
            if 2 * (end - tail) >= end - start and not _views_more_memory(batch, held_bytes(batch)):
                self._rows[side].setdefault(FANOUT, []).append(batch.slice(tail - start))
                end = tail
            if end > start:
                rest.append(batch.slice(0, end - start))
                rest_hashes.append(hashes[start:end])
        return rest, np.concatenate(rest_hashes) if rest_hashes else hashes[:0]

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
            batch = owning_copy(batch)
        self._rows[side].setdefault(partition, []).append(batch)
        self._sizes[partition] = self._sizes.get(partition, 0) + size
        if self._sizes[partition] > self._sort_unit_bytes:  # a hot key's, say: by hash from now on
            pieces = [self._rows[i].pop(partition, []) for i in range(len(self._sides))]
            heavy = heavy_hash(
                [(b, s.keys) for s, held in zip(self._sides, pieces, strict=True) for b in held]
            )
            within = self._within[partition] = MemoryBuckets(self._sides, heavy=heavy)
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
        own (the hot key's may be slices of batches as read), so a hot bucket is held once, not
        beside a sorted copy (it is one group: no sort), and a partition bucket's batches are as
        they were read, within the sort unit. A partition bucketed by hash comes back as
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
