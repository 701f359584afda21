"""A reduce partition larger than ``shuffle.reduceMemory`` comes back as tables of whole key
groups from private spill files that are gone afterwards (``reduce_spill``); no JVM."""

from __future__ import annotations

import stat
import tempfile
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle.partitioner import hash_rows
from spark_plugin.shuffle import key_buckets
from spark_plugin.shuffle.map_output import route
from spark_plugin.shuffle.worker import memory_buckets, reduce_spill, row_buckets
from spark_plugin.shuffle.worker.grouping import Rows, iter_cogroups, iter_groups
from spark_plugin.shuffle.worker.reduce_spill import bucket_rows, partition_rows, spilled_bytes
from spark_plugin.shuffle.worker.row_buckets import Side
from tests.spark_plugin.shuffle.reduce_inputs import (
    buffer_addresses,
    counted_splits,
    decoded,
    decoded_apart,
    read_as_reducer,
    rows_of,
)

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


@pytest.fixture(autouse=True)
def spill_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Spill files go under ``SPARK_LOCAL_DIRS``, as in an executor's Python worker."""
    root = tmp_path / "local-dir"
    root.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(root))
    return root


def batches(
    keys: Sequence[str | int | None], rows_per_batch: int = 1000, schema: pa.Schema = SCHEMA
) -> list[pa.RecordBatch]:
    values = np.arange(len(keys), dtype=np.int64)
    table = pa.table({"k": pa.array(keys, schema.field("k").type), "v": pa.array(values)}, schema=schema)
    return read_as_reducer(table, rows_per_batch)


def released_rows(*args: Any, **kwargs: Any) -> Iterator[pa.Table]:
    """``partition_rows``'s sets of rows, each released as a table that the test then holds."""
    for rows in partition_rows(*args, **kwargs):
        yield rows.release()


def released_sides(*args: Any, **kwargs: Any) -> Iterator[list[pa.Table]]:
    """``bucket_rows``'s buckets, each side released as a table."""
    for sides in bucket_rows(*args, **kwargs):
        yield [rows.release() for rows in sides]


def keys_once(tables: list[pa.Table]) -> list[object]:
    """The key of every group of ``tables``, each of which must come back in one table only."""
    groups = [g["k"][0].as_py() for t in tables for g in iter_groups(t, ["k"])]
    assert len(groups) == len(set(groups)), "a key group came back in more than one bucket"
    return groups


def partitions_of(table: pa.Table, partitions: int) -> set[int]:
    """The reduce partitions (of ``partitions``) that ``table``'s rows are routed to."""
    return set(route(table.combine_chunks().to_batches()[0], ["k"], partitions).tolist())


def test_a_partition_within_the_budget_is_one_table_and_writes_nothing(spill_root: Path) -> None:
    data = batches([f"key{i % 50}" for i in range(5000)])
    before = spilled_bytes()
    tables = [rows.release() for rows in partition_rows(iter(data), SCHEMA, ["k"], memory_bytes=1 << 30)]
    assert len(tables) == 1
    assert rows_of(tables) == rows_of([pa.Table.from_batches(data)])
    assert spilled_bytes() == before
    assert not any(spill_root.iterdir())


def test_over_the_budget_every_key_group_comes_back_whole_in_one_bucket(spill_root: Path) -> None:
    keys = [f"key{(i * 7919) % 997}" for i in range(40_000)]
    data = batches(keys)
    budget = pa.Table.from_batches(data).nbytes // 8
    before = spilled_bytes()
    seen_in: dict[str, int] = {}
    tables = []
    for index, rows in enumerate(partition_rows(iter(data), SCHEMA, ["k"], memory_bytes=budget)):
        assert any(spill_root.iterdir()), "the buckets are read back from disk"
        table = rows.release()
        for group in iter_groups(table, ["k"]):
            key = group["k"][0].as_py()
            assert key not in seen_in, f"{key} came back in buckets {seen_in[key]} and {index}"
            seen_in[key] = index
        tables.append(table)
    assert len(tables) > 1
    assert all(t.nbytes <= budget for t in tables)
    assert rows_of(tables) == rows_of([pa.Table.from_batches(data)])  # nothing lost, nothing twice
    assert len(seen_in) == 997
    assert spilled_bytes() - before >= pa.Table.from_batches(data).nbytes
    assert not any(spill_root.iterdir()), "the spill folder is removed once read"


def test_one_key_larger_than_the_budget_comes_back_whole(spill_root: Path) -> None:
    data = batches(["hot"] * 30_000 + [f"k{i}" for i in range(300)])
    budget = pa.Table.from_batches(data).nbytes // 10
    tables = [rows.release() for rows in partition_rows(iter(data), SCHEMA, ["k"], memory_bytes=budget)]
    hot = [t for t in tables if "hot" in t["k"].to_pylist()]
    assert len(hot) == 1
    assert hot[0]["k"].to_pylist().count("hot") == 30_000
    assert rows_of(tables) == rows_of([pa.Table.from_batches(data)])
    assert not any(spill_root.iterdir())


def test_two_big_keys_sharing_a_bucket_twice_are_split_apart_at_the_next_level() -> None:
    """A bucket whose re-split leaves every row in one bucket again still holds two keys: it is
    split once more (only a bucket of one key stops early), so each comes back on its own."""
    from arrow_shuffle.partitioner import hash_rows

    names = [f"key{i}" for i in range(20_000)]
    hashes = hash_rows(pa.record_batch({"k": pa.array(names)}), ["k"])
    at = [key_buckets.bucket_of(hashes, level) for level in range(3)]
    pair = next(
        (0, j)
        for j in range(1, len(names))
        if at[0][j] == at[0][0] and at[1][j] == at[1][0] and at[2][j] != at[2][0]
    )
    data = batches([names[pair[0]]] * 20_000 + [names[pair[1]]] * 20_000)
    budget = pa.Table.from_batches(data).nbytes // 3  # each big key alone is over half of it
    tables = [rows.release() for rows in partition_rows(iter(data), SCHEMA, ["k"], memory_bytes=budget)]
    holding = [t for t in tables if {names[pair[0]], names[pair[1]]} & set(t["k"].to_pylist())]
    assert len(holding) == 2, [t.num_rows for t in holding]
    assert rows_of(tables) == rows_of([pa.Table.from_batches(data)])


def test_spill_files_are_private_and_removed_when_the_consumer_stops_early(spill_root: Path) -> None:
    data = batches([f"key{i % 300}" for i in range(20_000)])
    budget = pa.Table.from_batches(data).nbytes // 4
    buckets: Generator[Rows, None, None] = partition_rows(iter(data), SCHEMA, ["k"], memory_bytes=budget)
    next(buckets)
    [folder] = list(spill_root.iterdir())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    buckets.close()  # the user's function failed, say: the generator is closed
    assert not any(spill_root.iterdir())


def test_a_cogroup_over_the_budget_meets_each_key_of_both_sides_in_one_bucket() -> None:
    right_schema = pa.schema([("key", pa.string()), ("w", pa.float64())])
    left = batches([f"key{i % 400}" for i in range(30_000)])
    right_keys = [f"key{i % 600}" for i in range(0, 12_000, 2)]  # even keys, 20 rows each
    right_table = pa.table(
        {"key": pa.array(right_keys), "w": pa.array(np.ones(len(right_keys)))}, schema=right_schema
    )
    right = read_as_reducer(right_table, 500)
    budget = pa.Table.from_batches(left).nbytes // 6
    pairs: dict[str, tuple[int, int]] = {}
    buckets = 0
    for lt, rt in released_sides(
        [Side(iter(left), SCHEMA, ["k"]), Side(iter(right), right_schema, ["key"])], memory_bytes=budget
    ):
        buckets += 1
        assert lt.schema == SCHEMA and rt.schema == right_schema
        for lg, rg in iter_cogroups(lt, ["k"], rt, ["key"]):
            key = (lg["k"] if lg.num_rows else rg["key"])[0].as_py()
            assert key not in pairs, f"{key} met twice"
            pairs[key] = (lg.num_rows, rg.num_rows)
    assert buckets > 1
    assert len(pairs) == 400 + 100  # left's 0..399 and right's even keys 400..598
    assert pairs["key0"] == (75, 20) and pairs["key1"] == (75, 0)  # an odd key: left rows only
    assert pairs["key500"] == (0, 20)  # right only: an empty left table with its columns
    assert sum(lr for lr, _ in pairs.values()) == 30_000
    assert sum(rr for _, rr in pairs.values()) == 6_000


INT_SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def test_past_the_sort_unit_the_groups_come_back_a_memory_bucket_at_a_time(spill_root: Path) -> None:
    """Within the budget but past the sort unit, rows with numeric keys are bucketed in memory as
    they arrive: every key group (nulls one group) whole in one smaller table, nothing lost or
    twice, nothing written."""
    keys: list[int | None] = [None if i % 101 == 0 else (i * 7919) % 997 for i in range(40_000)]
    data = batches(keys, schema=INT_SCHEMA)
    whole = pa.Table.from_batches(data)
    before = spilled_bytes()
    seen_in: dict[int | None, int] = {}
    tables = list(
        released_rows(iter(data), INT_SCHEMA, ["k"], memory_bytes=1 << 30, sort_unit_bytes=whole.nbytes // 8)
    )
    for index, table in enumerate(tables):
        for group in iter_groups(table, ["k"]):
            key = group["k"][0].as_py()
            assert key not in seen_in, f"{key} came back in buckets {seen_in[key]} and {index}"
            seen_in[key] = index
    assert len(tables) > 1
    assert max(t.num_rows for t in tables) < whole.num_rows // 4  # each sort is a bucket's
    assert rows_of(tables) == rows_of([whole])
    assert len(seen_in) == 997 + 1  # and the null key
    assert spilled_bytes() == before
    assert not any(spill_root.iterdir())


def test_small_arriving_batches_are_bucketed_together_not_one_by_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reduce task reads a segment per map output, partition and run (often a thousand rows or
    fewer): they are gathered up to ``SPLIT_BYTES`` and split together, since a split per batch
    costs a hash, a sort and a ``take`` per bucket of each. Same rows, same buckets."""
    keys: list[int | None] = [None if i % 101 == 0 else (i * 7919) % 997 for i in range(40_000)]
    data = batches(keys, rows_per_batch=50, schema=INT_SCHEMA)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 4)
    splits = counted_splits(monkeypatch)
    tables = list(
        released_rows(iter(data), INT_SCHEMA, ["k"], memory_bytes=1 << 30, sort_unit_bytes=whole.nbytes // 8)
    )
    assert len(data) == 800 and 4 <= len(splits) <= 6, splits  # one split per quarter of the rows
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == 998


def test_a_large_arriving_batch_is_split_alone_not_joined_to_the_gathered_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Joining a batch of ``SPLIT_BYTES`` or more to the gathered ones would copy it once more:
    what was gathered is split first, then the large batch on its own."""
    small = batches([i % 997 for i in range(3_000)], rows_per_batch=100, schema=INT_SCHEMA)
    large = batches([i % 997 for i in range(3_000, 23_000)], rows_per_batch=20_000, schema=INT_SCHEMA)
    whole = pa.Table.from_batches(small + large)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", large[0].nbytes)
    splits = counted_splits(monkeypatch)
    tables = list(
        released_rows(iter(small + large), INT_SCHEMA, ["k"], memory_bytes=1 << 30, sort_unit_bytes=1)
    )
    assert splits == [3_000, 20_000], splits
    assert rows_of(tables) == rows_of([whole])


def test_string_keys_past_the_sort_unit_stay_one_table() -> None:
    """A key hashed by a Python call per distinct value is not bucketed in memory (hashing would
    cost more than the sorted copy saves): past the sort unit, still one table."""
    data = batches([f"key{i % 997}" for i in range(40_000)])
    whole = pa.Table.from_batches(data)
    tables = list(
        released_rows(iter(data), SCHEMA, ["k"], memory_bytes=1 << 30, sort_unit_bytes=whole.nbytes // 8)
    )
    assert len(tables) == 1
    assert rows_of(tables) == rows_of([whole])


def test_memory_buckets_go_to_disk_when_the_budget_is_then_passed(spill_root: Path) -> None:
    """Rows already bucketed in memory are written out with the rest once the budget is passed."""
    data = batches([(i * 31) % 499 for i in range(40_000)], schema=INT_SCHEMA)
    whole = pa.Table.from_batches(data)
    before = spilled_bytes()
    seen: set[int] = set()
    tables = []
    for table in released_rows(
        iter(data), INT_SCHEMA, ["k"], memory_bytes=whole.nbytes // 3, sort_unit_bytes=whole.nbytes // 10
    ):
        assert any(spill_root.iterdir()), "read back from disk"
        groups = {g["k"][0].as_py() for g in iter_groups(table, ["k"])}
        assert not groups & seen
        seen |= groups
        tables.append(table)
    assert rows_of(tables) == rows_of([whole])
    assert len(seen) == 499
    assert spilled_bytes() - before >= whole.nbytes
    assert not any(spill_root.iterdir())


@pytest.mark.parametrize("partitions", [None, 7])
def test_a_cogroup_past_the_sort_unit_meets_each_key_of_both_sides_in_one_memory_bucket(
    partitions: int | None,
) -> None:
    """With ``partitions`` too: these batches each hold rows of several partitions, so they are
    split by partition, and each key of both sides still meets in one bucket."""
    right_schema = pa.schema([("key", pa.int32()), ("w", pa.float64())])
    left = batches([i % 400 for i in range(30_000)], schema=INT_SCHEMA)
    right_keys = [i % 600 for i in range(0, 12_000, 2)]  # even keys, 20 rows each
    right_table = pa.table(
        {"key": pa.array(right_keys, pa.int32()), "w": pa.array(np.ones(len(right_keys)))},
        schema=right_schema,
    )
    right = read_as_reducer(right_table, 500)
    unit = pa.Table.from_batches(left).nbytes // 6
    pairs: dict[int, tuple[int, int]] = {}
    buckets = 0
    before = spilled_bytes()
    for lt, rt in released_sides(
        [Side(iter(left), INT_SCHEMA, ["k"]), Side(iter(right), right_schema, ["key"])],
        memory_bytes=None,
        sort_unit_bytes=unit,
        partitions=partitions,
    ):
        buckets += 1
        assert lt.schema == INT_SCHEMA and rt.schema == right_schema
        for lg, rg in iter_cogroups(
            lt, ["k"], rt.cast(pa.schema([("key", pa.int64()), ("w", pa.float64())])), ["key"]
        ):
            key = (lg["k"] if lg.num_rows else rg["key"])[0].as_py()
            assert key not in pairs, f"{key} met twice"
            pairs[key] = (lg.num_rows, rg.num_rows)
    assert buckets > 1 and spilled_bytes() == before
    assert len(pairs) == 500  # left's 0..399 and right's even keys 400..598
    assert pairs[0] == (75, 20) and pairs[1] == (75, 0) and pairs[500] == (0, 20)
    assert sum(lr for lr, _ in pairs.values()) == 30_000
    assert sum(rr for _, rr in pairs.values()) == 6_000


def as_a_reduce_task_reads(
    keys: Sequence[int | None], partitions: int, maps: int = 4, streamed: bool = False
) -> list[pa.RecordBatch]:
    """Rows of ``keys`` as a coalesced reduce task reads them: per map output (``maps`` slices of
    the rows) a batch per reduce partition, each holding only that partition's rows (routed as
    the map side routes them), decoded as from files (each batch its own memory) or ``streamed``
    (packed: all of them views of one buffer)."""
    table = pa.table(
        {"k": pa.array(keys, pa.int64()), "v": pa.array(np.arange(len(keys)))}, schema=INT_SCHEMA
    )
    pieces = []
    for part in np.array_split(np.arange(len(keys)), maps):
        rows = table.take(pa.array(part)).combine_chunks().to_batches()[0]
        ids = route(rows, ["k"], partitions)
        pieces += [rows.filter(pa.array(ids == p)) for p in range(partitions) if (ids == p).any()]
    return decoded(pieces) if streamed else decoded_apart(pieces)


def test_with_partitions_each_batch_of_one_partition_goes_to_its_bucket_uncopied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A coalesced reduce task reads a batch per map output and reduce partition: with the shuffle's
    ``partitions`` the buckets in memory are those partitions and each batch moves to its own whole,
    with no split (no copy); every bucket is one partition's rows, every key group whole in one."""
    keys: list[int | None] = [None if i % 101 == 0 else (i * 7919) % 997 for i in range(40_000)]
    data = as_a_reduce_task_reads(keys, partitions=12)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 100)  # each partition alone
    arrived = buffer_addresses(data)
    splits = counted_splits(monkeypatch)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 8,
            partitions=12,
        )
    )
    assert splits == []
    assert len(tables) == 12
    assert buffer_addresses(tables) <= arrived  # the batches themselves, not copies
    for table in tables:
        assert len(partitions_of(table, 12)) == 1
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == 998


def test_with_partitions_a_batch_of_several_partitions_is_split_by_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Batches that do not keep to one partition are split by it (copies), so rows still meet in a
    bucket only by their key, whatever a reader hands over."""
    keys = [(i * 7919) % 997 for i in range(40_000)]
    mixed = batches(keys, rows_per_batch=700, schema=INT_SCHEMA)
    data = as_a_reduce_task_reads(keys, partitions=12)[:30] + mixed
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 100)  # each partition alone
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 8,
            partitions=12,
        )
    )
    assert len(tables) == 12
    for table in tables:
        assert len(partitions_of(table, 12)) == 1
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == 997


def test_with_partitions_a_partition_over_the_sort_unit_comes_back_as_hash_buckets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition that grows past the sort unit (a hot key's) is bucketed by hash from then on,
    so it comes back as several buckets, each of that partition's rows alone, as without
    partitions; the other partitions come back one bucket each."""
    keys = [0 if i % 3 else (i * 7919) % 997 for i in range(60_000)]  # key 0: two thirds of the rows
    data = as_a_reduce_task_reads(keys, partitions=4)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 100)  # each partition alone
    hot = int(route(pa.record_batch({"k": pa.array([0], pa.int64())}), ["k"], 4)[0])
    hot_bytes = sum(row_buckets.held_bytes(b) for b in data if route(b, ["k"], 4)[0] == hot)
    tables = list(
        released_rows(
            iter(data), INT_SCHEMA, ["k"], memory_bytes=1 << 30, sort_unit_bytes=hot_bytes // 2, partitions=4
        )
    )
    partitions = [partitions_of(t, 4) for t in tables]
    assert all(len(p) == 1 for p in partitions)  # no bucket mixes partitions
    assert sorted(min(p) for p in partitions if hot not in p) == sorted(set(range(4)) - {hot})
    of_hot = [t for t, p in zip(tables, partitions, strict=True) if hot in p]
    hot_rows = sum(b.num_rows for b in data if route(b, ["k"], 4)[0] == hot)
    assert len(of_hot) > 1 and sum(t.num_rows for t in of_hot) == hot_rows
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == 997


def test_with_partitions_a_batch_viewing_a_packed_payload_is_filed_as_a_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stream packs small batches of several partitions into one payload, decoded in place: a
    batch filed whole would keep the whole payload alive while its bucket waits, so it is copied
    and each bucket's memory goes with the bucket (the batches of files are filed as they are)."""
    keys = [(i * 7919) % 997 for i in range(40_000)]
    data = as_a_reduce_task_reads(keys, partitions=12, streamed=True)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 100)  # each partition alone
    payload = buffer_addresses(data)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 8,
            partitions=12,
        )
    )
    assert len(tables) == 12
    assert not buffer_addresses(tables) & payload
    assert rows_of(tables) == rows_of([whole])


def test_a_hot_partitions_rows_are_split_with_their_hashes_aligned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that reach a partition gone hot are hash-bucketed with the hashes its filing computed:
    each split is handed exactly its rows' ``hash_rows``, and every key group comes back whole."""
    keys: list[int | None] = [
        0 if i % 3 else None if i % 101 == 0 else (i * 7919) % 997 for i in range(60_000)
    ]
    data = as_a_reduce_task_reads(keys, partitions=4, maps=12)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 40)
    handed: list[bool] = []
    split = row_buckets.split_by_bucket

    def checked(batch: pa.RecordBatch, keys: Sequence[str], *args: Any, **kwargs: Any) -> Iterator[Any]:
        if kwargs.get("hashes") is not None:
            assert np.array_equal(kwargs["hashes"], hash_rows(batch, keys))
        handed.append(kwargs.get("hashes") is not None)
        return split(batch, keys, *args, **kwargs)

    monkeypatch.setattr(memory_buckets, "split_by_bucket", checked)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 20,
            partitions=4,
        )
    )
    assert sum(handed) >= 3, handed  # the hot partition's later rows, split with their hashes
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == len(set(keys))


def test_with_partitions_rows_bucketed_in_memory_spill_whole_when_the_budget_is_passed(
    spill_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the budget, every row bucketed in memory so far (partition buckets, a hot partition's
    hash buckets, rows not filed yet) is written out with the rest: each comes back once, every
    key group whole in one bucket."""
    keys = [0 if i % 2 else (i * 31) % 499 for i in range(80_000)]
    data = as_a_reduce_task_reads(keys, partitions=6, maps=8)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 40)
    drained: list[int] = []
    drain = memory_buckets.MemoryBuckets.drain

    def counted(self: Any) -> list[list[pa.RecordBatch]]:
        drained.append(len(self._within))
        return drain(self)

    monkeypatch.setattr(memory_buckets.MemoryBuckets, "drain", counted)
    before = spilled_bytes()
    seen: set[int] = set()
    tables = []
    for table in released_rows(
        iter(data),
        INT_SCHEMA,
        ["k"],
        memory_bytes=whole.nbytes * 2 // 3,
        sort_unit_bytes=whole.nbytes // 10,
        partitions=6,
    ):
        assert any(spill_root.iterdir()), "read back from disk"
        groups = {g["k"][0].as_py() for g in iter_groups(table, ["k"])}
        assert not groups & seen
        seen |= groups
        tables.append(table)
    assert drained == [1, 0]  # drained with the hot partition bucketed by hash, and that within
    assert rows_of(tables) == rows_of([whole])
    assert len(seen) == 499
    assert spilled_bytes() - before >= whole.nbytes


@pytest.mark.parametrize("partitions", [None, 4])
def test_a_hot_keys_rows_get_a_bucket_of_their_own(partitions: int | None) -> None:
    """A key holding most of a partition's rows when its in-memory buckets begin gets a hash bucket
    of its own: grouped there, it is one group, handed on without a sort or a copy; its rows are
    all there and no other key's are, and every other key comes back whole elsewhere."""
    keys = [3 if i % 4 else (i * 7919) % 997 for i in range(60_000)]  # key 3: three quarters
    data = as_a_reduce_task_reads(keys, partitions=4, maps=6)
    whole = pa.Table.from_batches(data)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 8,
            partitions=partitions,
        )
    )
    hot = [t for t in tables if 3 in t["k"].to_pylist()]
    assert len(hot) == 1 and set(hot[0]["k"].to_pylist()) == {3}
    assert hot[0].num_rows == keys.count(3)
    assert rows_of(tables) == rows_of([whole])
    assert len(keys_once(tables)) == len(set(keys))


def test_a_hot_partitions_rows_keep_their_arrival_order_in_each_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sets split at once into a partition's hash buckets come after what those buckets gathered
    before, so each group's rows stay in arrival order (a stable grouping, as Spark's)."""
    keys = [0 if i % 3 else (i * 7919) % 997 for i in range(25_000)] + [0] * 35_000
    data = as_a_reduce_task_reads(keys, partitions=4, maps=24)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 12)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 20,
            partitions=4,
        )
    )
    assert rows_of(tables) == rows_of([whole])
    for table in tables:
        for group in iter_groups(table, ["k"]):
            assert (np.diff(group["v"].to_numpy()) > 0).all(), group["k"][0]


@pytest.mark.parametrize("partitions", [None, 7])
@pytest.mark.parametrize("hot_on_left", [True, False])
def test_a_cogroups_hot_key_meets_whole_on_both_sides(partitions: int | None, hot_on_left: bool) -> None:
    """A hot key of a cogroup (on both sides, or the right only) meets once, with all its rows."""
    right_schema = pa.schema([("key", pa.int32()), ("w", pa.float64())])
    n = 40_000
    hot = route(pa.record_batch({"k": pa.array([0], pa.int64())}), ["k"], 7)[0]
    cold = [
        k
        for k in range(1, 3000)
        if route(pa.record_batch({"k": pa.array([k], pa.int64())}), ["k"], 7)[0] != hot
    ]
    left_keys = [0 if hot_on_left and i % 4 else cold[i % 400] for i in range(n)]
    right_keys = [0 if i % 4 else cold[i % 500] for i in range(n)]
    left = as_a_reduce_task_reads(left_keys, partitions=7, maps=5)
    right_table = pa.table(
        {"key": pa.array(right_keys, pa.int32()), "w": pa.array(np.ones(n))}, schema=right_schema
    )
    right = read_as_reducer(right_table, 900)
    unit = pa.Table.from_batches(left).nbytes // 6
    met: dict[int, tuple[int, int]] = {}
    for lt, rt in released_sides(
        [Side(iter(left), INT_SCHEMA, ["k"]), Side(iter(right), right_schema, ["key"])],
        memory_bytes=None,
        sort_unit_bytes=unit,
        partitions=partitions,
    ):
        for lg, rg in iter_cogroups(
            lt, ["k"], rt.cast(pa.schema([("key", pa.int64()), ("w", pa.float64())])), ["key"]
        ):
            key = (lg["k"] if lg.num_rows else rg["key"])[0].as_py()
            assert key not in met, f"{key} met twice"
            met[key] = (lg.num_rows, rg.num_rows)
    assert met[0] == (left_keys.count(0), right_keys.count(0))
    assert sum(lr for lr, _ in met.values()) == n and sum(rr for _, rr in met.values()) == n


def test_the_heavy_hash_is_a_key_of_half_the_rows_or_none() -> None:
    """Sampled evenly over the rows of every side (each with its own key columns)."""
    left = pa.record_batch({"k": pa.array([1] * 600 + list(range(400)), pa.int64())})
    right = pa.record_batch({"key": pa.array([1] * 100 + [2] * 900, pa.int32())})
    one = int(hash_rows(pa.record_batch({"k": pa.array([1], pa.int64())}), ["k"])[0])
    two = int(hash_rows(pa.record_batch({"k": pa.array([2], pa.int64())}), ["k"])[0])
    assert row_buckets.heavy_hash([(left, ["k"])]) == one
    assert row_buckets.heavy_hash([(left, ["k"]), (right, ["key"])]) is None  # 700 and 900 of 2,000
    assert row_buckets.heavy_hash([(right, ["key"])]) == two
    assert row_buckets.heavy_hash([(left.slice(600), ["k"])]) is None
    assert row_buckets.heavy_hash([]) is None


def test_with_partitions_small_partitions_come_back_together_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive partitions smaller than ``SPLIT_BYTES`` come back as one bucket (a grouping's
    cost per bucket paid once for them), never past it but for one partition, each partition
    whole in exactly one bucket."""
    keys = [(i * 7919) % 997 for i in range(40_000)]
    data = as_a_reduce_task_reads(keys, partitions=24)
    whole = pa.Table.from_batches(data)
    monkeypatch.setattr(memory_buckets, "SPLIT_BYTES", whole.nbytes // 5)
    tables = list(
        released_rows(
            iter(data),
            INT_SCHEMA,
            ["k"],
            memory_bytes=1 << 30,
            sort_unit_bytes=whole.nbytes // 8,
            partitions=24,
        )
    )
    assert 5 <= len(tables) <= 8, len(tables)
    seen: list[int] = []
    for table in tables:
        parts = partitions_of(table, 24)
        assert len(parts) > 1 and table.nbytes <= whole.nbytes // 5
        seen += sorted(parts)
    assert seen == list(range(24))  # each once, in order
    assert rows_of(tables) == rows_of([whole])


def test_bucketing_by_partitions_refuses_a_count_below_one() -> None:
    with pytest.raises(ValueError, match="0 partitions"):
        list(
            partition_rows(iter(batches([1, 2], schema=INT_SCHEMA)), INT_SCHEMA, ["k"], None, 1, partitions=0)
        )


def test_spill_roots_are_sparks_local_dirs_else_the_temp_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{a},{b},{tmp_path / 'missing'}")
    assert reduce_spill.spill_roots() == [str(a), str(b)]
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert reduce_spill.spill_roots() == [tempfile.gettempdir()]


def test_held_bytes_counts_a_decoded_batch_as_nbytes_does_and_a_slice_by_its_whole_buffers() -> None:
    """``held_bytes`` (buffer sizes, cheap) stands in for ``nbytes`` (referenced ranges, built as
    arrays per call) on the batches a reduce task reads: decoded ones, whose buffers are their own."""
    keys = [None if i % 7 == 0 else f"key-{i % 311}" for i in range(5_000)]
    read = batches(keys, rows_per_batch=300)
    assert len(read) == 17
    for batch in read:
        assert batch.nbytes <= row_buckets.held_bytes(batch) <= batch.nbytes + 64  # IPC padding at most
    whole = pa.Table.from_batches(read).combine_chunks().to_batches()[0]
    piece = whole.slice(100, 10)
    assert row_buckets.held_bytes(piece) == row_buckets.held_bytes(whole) > piece.nbytes
