"""The reduce side's key buckets, which a grouped shuffle's map side knows too: it writes a hot
key's rows last in their partition, so that the reduce side takes them as they were read.

A grouped reduce task holding more than the sort unit (16 MiB) groups its rows a hash bucket at a
time (``worker.memory_buckets``): ``FANOUT`` buckets of the key hash (``bucket_of``, level 0), and
a hot key, one hash held by at least ``HEAVY_SHARE`` of a partition's rows, in a bucket of its
own. Taking each bucket's rows out of the batches it read copied every row: on the 20 M-row
matrix's hot cell, the hot key's 12 M rows, a third of that reduce task's CPU. When the map side
writes each partition's rows with the hot key's last (``hot_key_last_keys``; every other row, and
the hot key's among themselves, in input order), each batch the reduce side reads ends in a run of
the hot key's rows, which it files as a slice: only the other rows are copied.

Only the hot key moves: ordering a partition by all 17 buckets made the map side's ``take`` of
8 partitions 1.8x slower (136 runs of rows to gather instead of 8), which cost more than the
reduce side saved. Nothing depends on the order for its answer: the reduce side checks each batch
and copies as before where the hot key's rows are not its tail (a hot key the map side did not
guess, outputs in input order). Passthrough shuffles (``repartition``-like calls) keep each
partition's rows in input order: ``hot_key_last`` is for grouped calls alone.
"""

from __future__ import annotations

import numpy as np

from arrow_shuffle.partitioner import remix

FANOUT_BITS = 4
FANOUT = 1 << FANOUT_BITS
"""Hash buckets per split: a partition of 16 x the budget fits in one level."""
HEAVY_SHARE = 0.5
"""A key hash held by at least this share of a partition's rows is a hot key's: its rows get a
hash bucket of their own (bucket ``FANOUT``)."""
HEAVY_MIN_ROWS = 64
"""Fewest rows of one key hash a map task's first batch must hold for it to be taken as hot."""


def bucket_of(hashes: np.ndarray, level: int) -> np.ndarray:
    """The bucket (0 to ``FANOUT - 1``) of each key hash at splitting ``level``, as one byte: a
    stable sort of bytes is numpy's radix sort (measured: 1 M rows in 2.8 ms and 4 M in 35 ms,
    against 31 and 165 ms for the same buckets as int64, which numpy sorts by timsort).

    Level 0 is the hash's top bits (a partition is the hash modulo the partition count, which the
    mixed hash's top bits do not follow): one shift, where remixing took five passes over the rows
    (2.5 M rows: 2.5 against 70 ms). A deeper level remixes the hash with a salt of its own, so
    that rows one level put together spread again at the next."""
    if level == 0:
        top: np.ndarray = (hashes >> np.uint64(64 - FANOUT_BITS)).astype(np.uint8)
        return top
    salt = np.uint64(0x9E3779B97F4A7C15 * (level + 1) & 0xFFFFFFFFFFFFFFFF)
    return (remix(hashes, salt) % np.uint64(FANOUT)).astype(np.uint8)


def orders_hot_key_last(num_partitions: int) -> bool:
    """Can a map side of ``num_partitions`` order rows by (partition, hot or not) in a 16-bit key,
    which numpy sorts by radix like the partition ids alone?"""
    return num_partitions * 2 <= 1 << 16


def map_side_heavy(hashes: np.ndarray, partitions: np.ndarray) -> int | None:
    """The key hash holding at least ``HEAVY_SHARE`` of its partition's rows in one batch (a map
    task's first) and ``HEAVY_MIN_ROWS`` of them, or None: the map side's guess at the reduce
    side's hot key (``row_buckets.heavy_hash``)."""
    if len(hashes) < HEAVY_MIN_ROWS:
        return None
    values, counts = np.unique(hashes, return_counts=True)
    top = int(np.argmax(counts))
    if counts[top] < HEAVY_MIN_ROWS:
        return None
    value = values[top]
    same_partition = int(np.count_nonzero(partitions == partitions[np.argmax(hashes == value)]))
    return int(value) if counts[top] >= HEAVY_SHARE * same_partition else None


def hot_key_last_keys(hashes: np.ndarray, partitions: np.ndarray, heavy: int | None) -> np.ndarray:
    """Each row's sort key, partition then whether its hash is ``heavy``, as uint16
    (``orders_hot_key_last``): a stable sort of it puts a partition's hot rows last and keeps
    every other order."""
    keys: np.ndarray = partitions.astype(np.uint16) * np.uint16(2)
    if heavy is not None:
        keys += (hashes == np.uint64(heavy)).astype(np.uint16)
    return keys


def hot_tails(hot: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """Where each batch's run of hot rows begins (its end when it has none), for consecutive
    batches from ``starts`` to ``ends`` whose rows are flagged ``hot``; None when some batch has
    a hot row before a row that is not (not written by ``hot_key_last``)."""
    seen = np.concatenate(([0], np.cumsum(hot, dtype=np.int64)))  # hot rows before each row
    tails: np.ndarray = ends - (seen[ends] - seen[starts])
    if np.any(seen[tails] != seen[starts]):  # a hot row ahead of the tail
        return None
    return tails
