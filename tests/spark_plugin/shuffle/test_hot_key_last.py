"""A grouped shuffle's map side writes a hot key's rows last in their partition (``key_buckets``),
and the reduce side files them as slices of what it read, not copies; rows in any other order are
bucketed by copies as before, into the same groups. No JVM."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle.partitioner import hash_rows
from spark_plugin.shuffle import key_buckets
from spark_plugin.shuffle.key_buckets import FANOUT, bucket_of, hot_tails, map_side_heavy, orders_hot_key_last
from spark_plugin.shuffle.map_output import MapOutputWriter, read_segments
from spark_plugin.shuffle.worker import memory_buckets
from spark_plugin.shuffle.worker.grouping import iter_groups
from spark_plugin.shuffle.worker.reduce_spill import partition_rows
from tests.spark_plugin.shuffle.reduce_inputs import buffer_addresses, counted_splits, decoded, rows_of

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
PARTITIONS = 4


def table_of(keys: Sequence[int | None]) -> pa.Table:
    """``keys`` with ``v``, each row's input position."""
    return pa.table({"k": pa.array(keys, pa.int64()), "v": pa.array(np.arange(len(keys)))}, schema=SCHEMA)


def hot_keys(rows: int, hot_share: float = 0.7) -> list[int | None]:
    """Key 0 on ``hot_share`` of the rows (spread through them), else one of 997 keys or null."""
    rng = np.random.default_rng(7)
    hot = rng.random(rows) < hot_share
    return [0 if hot[i] else None if i % 101 == 0 else (i * 7919) % 997 for i in range(rows)]


def written(
    folder: Path, name: str, table: pa.Table, hot_key_last: bool, memory_bytes: int = 1 << 16
) -> tuple[str, list[Any]]:
    """``table`` written by a map task (in 1,000-row batches, runs of ``memory_bytes``): its file
    and every partition's segments."""
    folder.mkdir(mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{name}.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], PARTITIONS, memory_bytes, hot_key_last=hot_key_last)
    for batch in table.to_batches(max_chunksize=1000):
        writer.write(batch)
    return path, [output.segments for output in writer.finish()]


def segments_read(path: str, segments: list[Any]) -> Iterator[list[pa.RecordBatch]]:
    """Each segment's batches, read from the file as a reduce task reads them."""
    for segment in segments:
        yield list(read_segments(path, [segment], schema=SCHEMA))


def hot_hash() -> int:
    return int(hash_rows(pa.record_batch({"k": pa.array([0], pa.int64())}), ["k"])[0])


def test_a_grouped_map_side_writes_the_hot_key_last_in_its_partition(tmp_path: Path) -> None:
    """In each segment the hot key's rows (the first batch's guess) are the tail, and both its rows
    and the others keep their input order; every partition holds the same rows as in input
    order (several runs: each is ordered alike)."""
    table = table_of(hot_keys(30_000))
    first = hash_rows(table.slice(0, 1000), ["k"])
    assert map_side_heavy(first, first % np.uint64(PARTITIONS)) == hot_hash()
    path, ordered = written(tmp_path / "out", "ordered", table, hot_key_last=True)
    plain_path, plain = written(tmp_path / "out", "plain", table, hot_key_last=False)
    runs = tails = 0
    for partition in range(PARTITIONS):
        assert len(ordered[partition]) == len(plain[partition]) > 1  # written in runs
        runs += len(ordered[partition])
        for batches in segments_read(path, ordered[partition]):
            segment = pa.Table.from_batches(batches)
            hot = hash_rows(segment, ["k"]) == np.uint64(hot_hash())
            assert np.all(np.diff(hot.astype(np.int8)) >= 0), partition  # hot rows last
            tails += int(hot.any() and not hot.all())
            values = np.asarray(segment["v"])
            assert np.all(np.diff(values[hot]) > 0) and np.all(np.diff(values[~hot]) > 0)
        got = rows_of([b for bs in segments_read(path, ordered[partition]) for b in bs])
        want = rows_of([b for bs in segments_read(plain_path, plain[partition]) for b in bs])
        assert got == want
    assert runs > PARTITIONS and tails > 1  # the hot partition's segments end in the hot key


def test_a_passthrough_map_side_keeps_each_partition_in_input_order(tmp_path: Path) -> None:
    table = table_of(hot_keys(10_000))
    path, plain = written(tmp_path / "out", "plain", table, hot_key_last=False, memory_bytes=1 << 30)
    for partition in range(PARTITIONS):
        values = [v for bs in segments_read(path, plain[partition]) for b in bs for v in b["v"].to_pylist()]
        assert values == sorted(values) and values


def test_the_map_sides_hot_key_guess() -> None:
    """A hash held by at least half its partition's rows (and 64 of them) in the first batch."""
    hashes = np.array([5] * 64 + [6] * 60 + [7] * 10, dtype=np.uint64)
    partitions = np.array([0] * 64 + [0] * 60 + [1] * 10, dtype=np.uint64)
    assert map_side_heavy(hashes, partitions) == 5  # 64 of partition 0's 124
    assert map_side_heavy(hashes[:63], partitions[:63]) is None  # too few rows
    partitions = np.array([0] * 64 + [0] * 60 + [0] * 10, dtype=np.uint64)
    assert map_side_heavy(hashes, partitions) is None  # 64 of 134: under half
    assert orders_hot_key_last(32768) and not orders_hot_key_last(32769)  # the 16-bit (partition, hot) key


def reduce_input(tmp_path: Path, table: pa.Table, hot_key_last: bool, partition: int) -> list[pa.RecordBatch]:
    """What one reduce task of ``partition`` reads: its segments of two map outputs."""
    half = table.num_rows // 2
    read: list[pa.RecordBatch] = []
    for index, piece in enumerate((table.slice(0, half), table.slice(half))):
        path, segments = written(tmp_path / "maps", f"m{index}-{hot_key_last}", piece, hot_key_last)
        read += [b for bs in segments_read(path, segments[partition]) for b in bs]
    return read


def grouped(batches: list[pa.RecordBatch], sort_unit_bytes: int) -> list[pa.Table]:
    """The reduce task's buckets (its partition over the sort unit: hash buckets), released."""
    sets = partition_rows(
        iter(batches),
        SCHEMA,
        ["k"],
        memory_bytes=1 << 30,
        sort_unit_bytes=sort_unit_bytes,
        partitions=PARTITIONS,
    )
    return [rows.release() for rows in sets]


def hot_partition() -> int:
    return hot_hash() % PARTITIONS


def test_the_hot_keys_rows_written_last_are_bucketed_as_slices_of_what_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot partition of a grouped shuffle's outputs, past the sort unit: the hot key's bucket
    is slices of the batches as read, and only the other rows are split by copies; each key group
    whole in one bucket, the hot key alone in the last; the same groups as from outputs in input
    order, whose every row is split by copies."""
    table = table_of(hot_keys(40_000))
    partition = hot_partition()
    ordered = reduce_input(tmp_path, table, True, partition)
    plain = reduce_input(tmp_path, table, False, partition)
    rows = sum(b.num_rows for b in ordered)
    unit = pa.Table.from_batches(ordered).nbytes // 8
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", unit // 4)
    splits = counted_splits(monkeypatch)
    sliced = grouped(ordered, unit)
    hot = sliced[-1]
    assert hot["k"].unique().to_pylist() == [0] and hot.num_rows > rows // 2
    assert buffer_addresses([hot]) <= buffer_addresses(ordered)  # the batches as read, not copies
    assert 0 < sum(splits) < rows - hot.num_rows + unit  # the others, and the rows past the sort unit's
    split_before = sum(splits)
    copied = grouped(plain, unit)
    assert sum(splits) - split_before > rows - unit, "rows in input order are all split by copies"
    assert not buffer_addresses(copied) & buffer_addresses(plain)
    for tables in (sliced, copied):
        groups = [g["k"][0].as_py() for t in tables for g in iter_groups(t, ["k"])]
        assert len(groups) == len(set(groups))  # each key group in one bucket
    assert rows_of(sliced) == rows_of(copied) == rows_of(ordered)


def test_hot_rows_not_last_or_viewing_a_stream_payload_are_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices only of the order the map side writes and only where they hold little besides their
    rows: a batch whose hot rows come first (one reversed) has its set split by copies, and so do
    batches packed in one stream payload."""
    table = table_of(hot_keys(40_000))
    partition = hot_partition()
    ordered = reduce_input(tmp_path, table, True, partition)
    unit = pa.Table.from_batches(ordered).nbytes // 8
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", unit // 4)

    def mixed(batch: pa.RecordBatch) -> bool:
        hot = hash_rows(batch, ["k"]) == np.uint64(hot_hash())
        return bool(hot.any() and not hot.all())

    longest = max((i for i in range(len(ordered)) if mixed(ordered[i])), key=lambda i: ordered[i].num_rows)
    reversed_one = list(ordered)
    reversed_one[longest] = decoded(
        [ordered[longest].take(pa.array(np.arange(ordered[longest].num_rows)[::-1]))]
    )[0]
    splits = counted_splits(monkeypatch)
    tables = grouped(reversed_one, unit)
    assert splits and not buffer_addresses(tables) & buffer_addresses([reversed_one[longest]])
    assert rows_of(tables) == rows_of(ordered)
    packed = decoded(ordered)  # as a stream delivers them: views of one payload
    splits = counted_splits(monkeypatch)
    tables = grouped(packed, unit)
    assert splits and not buffer_addresses(tables) & buffer_addresses(packed)
    assert rows_of(tables) == rows_of(ordered)


def test_bucket_of_level_zero_spreads_each_partitions_rows_evenly() -> None:
    """Level 0 is the hash's top bits: within each of 200 partitions the 16 buckets hold shares
    that vary as independent draws do (the partition is the hash modulo 200: a bucket that
    followed it would leave cells empty or doubled), and level 1 agrees with level 0 on a
    sixteenth of the rows."""
    hashes = hash_rows(pa.record_batch({"k": pa.array(np.arange(400_000), pa.int64())}), ["k"])
    partitions = (hashes % np.uint64(200)).astype(np.int64)
    counts = np.bincount(partitions * FANOUT + bucket_of(hashes, 0), minlength=200 * FANOUT)
    assert counts.min() > 0
    assert counts.std() / np.sqrt(counts.mean()) < 1.3  # about 1 for independent (Poisson) counts
    agree = float(np.mean(bucket_of(hashes, 0) == bucket_of(hashes, 1)))
    assert abs(agree - 1 / FANOUT) < 0.01
    assert key_buckets.FANOUT == 1 << key_buckets.FANOUT_BITS


def test_hot_tails_finds_each_batchs_run_of_hot_rows_or_none_out_of_order() -> None:
    hot = np.array([0, 0, 1, 1, 0, 1, 1, 1, 0, 0], dtype=bool)  # batches [0, 4), [4, 8), [8, 10)
    starts, ends = np.array([0, 4, 8]), np.array([4, 8, 10])
    tails = hot_tails(hot, starts, ends)
    assert tails is not None and tails.tolist() == [2, 5, 10]
    assert hot_tails(hot, np.array([0, 3, 8]), np.array([3, 8, 10])) is None  # [3, 8): a hot row first
    all_hot = np.ones(6, dtype=bool)
    tails = hot_tails(all_hot, np.array([0, 2]), np.array([2, 6]))
    assert tails is not None and tails.tolist() == [0, 2]
