"""Producer side: routing, coalescing, the two flush triggers and backpressure."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle import (
    NetworkBufferPool,
    PartitionId,
    RecordTooLargeError,
    RecordWriter,
    ResultPartition,
    SchemaMismatchError,
    ShuffleConfig,
    ShuffleError,
    column_partitioner,
)
from arrow_shuffle.partitioner import hash_rows
from arrowbeat_base.clock import ManualClock

from .conftest import APP, SCHEMA, make_batch
from .local_read import read_subpartition

PID = PartitionId(APP, 0, 0)


def test_rows_are_routed_by_key_hash_and_all_arrive(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    # Room for all of it: written before it is read.
    cfg = config.replace(flush_timeout_s=0, buffers_per_subpartition=16)
    partition = ResultPartition(PID, 3, SCHEMA, pool, config=cfg)
    writer = RecordWriter(partition, key_columns=["key"])
    batches = [make_batch(i * 100, 100) for i in range(10)]
    for b in batches:
        writer.write(b)
    writer.finish()
    expected = pa.Table.from_batches(batches)
    routes = hash_rows(expected.combine_chunks().to_batches()[0], ["key"]) % np.uint64(3)
    for sub in range(3):
        table = read_subpartition(partition, sub)
        want = expected.filter(pa.array(routes == sub))
        assert table.column("seq").to_pylist() == want.column("seq").to_pylist()
    partition.release()
    assert pool.num_available == pool.num_segments


def test_hash_is_stable_across_processes() -> None:
    batch = pa.record_batch(
        {
            "i": pa.array([1, -5, None, 2**40]),
            "s": pa.array(["a", "bé", None, ""]),
            "f": [0.0, -0.0, 1.5, None],
        }
    )
    here = hash_rows(batch, ["i", "s", "f"]).tolist()
    code = (
        "import pyarrow as pa; from arrow_shuffle.partitioner import hash_rows;"
        "b = pa.record_batch({'i': pa.array([1, -5, None, 2**40]), 's': pa.array(['a', 'bé', None, '']),"
        " 'f': [0.0, -0.0, 1.5, None]}); print(hash_rows(b, ['i', 's', 'f']).tolist())"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == str(here)
    assert here[0] != here[1]


def test_small_batches_are_coalesced_until_full(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    # The flush timeout never passes on a clock that stands still: only full buffers are handed on.
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=config, clock=ManualClock())
    writer = RecordWriter(partition)
    for i in range(200):
        writer.write(make_batch(i * 10, 10))
    queued = partition.subpartitions[0].backlog
    assert 0 < queued < 200 / 4, "small batches must share buffers"
    writer.finish()
    table = read_subpartition(partition, 0)
    assert table.column("seq").to_pylist() == list(range(2000))
    partition.release()


def test_flush_timeout_publishes_a_partial_buffer(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    """A minute's flush timeout on the partition's clock: the partial buffer is published once the
    clock has passed it, far sooner than a real minute."""
    clock = ManualClock()
    cfg = config.replace(flush_timeout_s=60.0)
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=cfg, clock=clock)
    arrived = threading.Event()
    partition.subpartitions[0].attach_reader(
        lambda: arrived.set() if partition.subpartitions[0].backlog else None
    )
    writer = RecordWriter(partition)
    writer.write(make_batch(0, 3))
    clock.jump(59.75)
    assert partition.subpartitions[0].backlog == 0
    clock.jump(0.25)
    assert arrived.wait(10), "flusher never published the partial buffer"
    buffer, _backlog, _end = partition.subpartitions[0].poll()
    assert buffer is not None
    buffer.recycle()
    writer.abort()
    partition.release()
    assert pool.num_available == pool.num_segments


def test_large_batches_are_sliced_and_single_huge_rows_rejected(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    cfg = config.replace(buffers_per_subpartition=32)  # room for all of it: written before it is read
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=cfg)
    writer = RecordWriter(partition)
    writer.write(make_batch(0, 5000))  # ~ 10x the 16 KiB buffer
    with pytest.raises(RecordTooLargeError, match="buffer_size"):
        writer.write(make_batch(5000, 1, payload_len=64 * 1024))
    writer.finish()
    assert read_subpartition(partition, 0).column("seq").to_pylist() == list(range(5000))
    partition.release()


def test_schema_mismatch_names_the_partition(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=config)
    writer = RecordWriter(partition)
    with pytest.raises(SchemaMismatchError, match=str(PID)):
        writer.write(pa.record_batch({"key": [1]}))
    writer.abort()
    partition.release()


def test_explicit_partition_ids(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    partition = ResultPartition(PID, 2, SCHEMA, pool, config=config)
    writer = RecordWriter(partition, partitioner=column_partitioner("key"))
    batch = make_batch(0, 10, key_mod=2)
    writer.write(batch)
    writer.finish()
    evens = read_subpartition(partition, 0)
    assert set(evens.column("key").to_pylist()) <= {0}
    assert evens.num_rows + read_subpartition(partition, 1).num_rows == 10
    partition.release()


def test_slow_consumer_blocks_pipelined_producer_within_pool(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """Backpressure: the writer blocks on the pool; memory never exceeds the partition's share."""
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=config.replace(flush_timeout_s=0))
    writer = RecordWriter(partition)
    total_rows = 40_000  # ~ 2 MB, far more than the partition's few 16 KiB buffers
    done = threading.Event()

    def produce() -> None:
        for start in range(0, total_rows, 500):
            writer.write(make_batch(start, 500))
        writer.finish()
        done.set()

    producer = threading.Thread(target=produce)
    producer.start()
    assert partition.pool.exhausted.wait(10), "producer never hit the pool bound"
    assert not done.is_set()
    assert partition.pool.owned <= partition.pool.max_segments
    table = read_subpartition(partition, 0)  # now consume: the producer unblocks
    producer.join(10)
    assert done.is_set()
    assert table.column("seq").to_pylist() == list(range(total_rows))
    assert partition.pool.peak_in_use <= partition.pool.max_segments
    assert partition.stats().blocked_on_pool_s > 0
    partition.release()
    assert pool.num_available == pool.num_segments


def test_flusher_failure_is_sticky(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    partition = ResultPartition(PID, 1, SCHEMA, pool, config=config.replace(flush_timeout_s=0.01))
    writer = RecordWriter(partition)
    writer.write(make_batch(0, 5))
    with writer._lock:  # publish nothing until the partition is gone
        partition.subpartitions[0].release()
    flusher = writer._flusher
    assert flusher is not None
    flusher.join(5)  # the flusher thread only ends by failing (or by finish/abort)
    assert not flusher.is_alive()
    for _ in range(2):  # stored, and raised on every later call
        with pytest.raises(ShuffleError, match="flusher"):
            writer.write(make_batch(5, 5))
    writer.abort()
    partition.release()
    assert pool.num_available == pool.num_segments
