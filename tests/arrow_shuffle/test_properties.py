"""Property-based: credits bound what is in flight, every row arrives once and in order.

Random batch sizes, buffer sizes, credit settings, consumer slowness, consumer cancellation
and producer aborts, over the real TCP transport. The credit invariants are witnessed by the
*receiver* (``RemoteInputChannel.stats()``): it counts every buffer that arrives without
announced, unused credit, and on every receive compares what it holds unconsumed with the
credit it announced; the sender's own counters are only cross-checked against it.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from arrow_shuffle import (
    InputGate,
    NetworkBufferPool,
    PartitionId,
    PartitionServer,
    ProducerFailedError,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleError,
)
from arrow_shuffle.partitioner import hash_rows
from arrow_shuffle.remote_channel import RemoteInputChannel
from harness.procs import wait_until

from .conftest import APP, SCHEMA, SECRET, make_batch

scenario = st.fixed_dictionaries(
    {
        "buffer_size": st.sampled_from([4096, 8192, 32768]),
        "exclusive": st.integers(1, 3),
        "floating": st.integers(0, 4),
        "subpartitions": st.integers(1, 3),
        "batch_rows": st.lists(st.integers(1, 700), min_size=1, max_size=25),
        "slow_every": st.sampled_from([0, 3, 7]),
        # who stops the exchange early, after how many batches read (consumer) or written (producer)
        "stop": st.sampled_from([None, "consumer", "producer"]),
        "stop_at": st.integers(0, 12),
        "flush_timeout_s": st.sampled_from([0.0, 0.005, 0.05]),
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario)
def test_credit_invariants_and_exactly_once_delivery(tmp_path_factory, s: dict[str, Any]) -> None:
    config = ShuffleConfig(
        buffer_size=s["buffer_size"],
        network_memory_bytes=256 * s["buffer_size"],
        exclusive_buffers_per_channel=s["exclusive"],
        floating_buffers_per_gate=s["floating"],
        flush_timeout_s=s["flush_timeout_s"],
        keepalive_interval_s=0.2,
        peer_timeout_s=3.0,
        buffer_request_timeout_s=10.0,
    )
    cancel_at = s["stop_at"] if s["stop"] == "consumer" else None
    abort_at = s["stop_at"] if s["stop"] == "producer" else None
    event(f"stopped by {s['stop'] or 'nobody'}")
    pool = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    server = PartitionServer(SECRET, APP, config=config)
    try:
        partition = ResultPartition(PartitionId(APP, 7, 0), s["subpartitions"], SCHEMA, pool, config)
        server.register(partition)
        writer = RecordWriter(partition, key_columns=["key"])
        written: list[pa.RecordBatch] = []
        producer_error: list[BaseException] = []

        def produce() -> None:
            start = 0
            try:
                for n, rows in enumerate(s["batch_rows"]):
                    if n == abort_at:
                        break
                    batch = make_batch(start, rows, payload_len=int(rows) % 40)
                    writer.write(batch)
                    written.append(batch)
                    start += rows
                if abort_at is not None:  # mid-stream: the partition is never finished
                    writer.abort("aborted by the test")
                else:
                    writer.finish()
            except ShuffleError as exc:  # only legitimate when the consumer cancelled: its reader left
                producer_error.append(exc)
                writer.abort()

        producer = threading.Thread(target=produce)
        producer.start()
        specs = [
            RemoteChannelSpec(server.address, partition.partition_id, i) for i in range(s["subpartitions"])
        ]
        received: dict[int, list[int]] = defaultdict(list)
        cancelled = False
        consumer_error: ShuffleError | None = None
        gate = InputGate(specs, SCHEMA, pool, config, secret=SECRET)
        try:
            for n, batch in enumerate(gate):
                if cancel_at is not None and n >= cancel_at:
                    cancelled = True
                    gate.close()
                    break
                if s["slow_every"] and n % s["slow_every"] == 0:
                    time.sleep(0.002)  # a slow consumer, not synchronisation
                sub = _sub_of(batch.column("key").to_numpy(), s["subpartitions"])
                received[sub].extend(batch.column("seq").to_pylist())
        except ShuffleError as exc:
            consumer_error = exc
        finally:
            gate.close()
        producer.join(15)
        assert not producer.is_alive()

        remote = [c for c in gate.channels if isinstance(c, RemoteInputChannel)]
        for channel in remote:  # the receiver is the witness: no buffer came without credit
            stats = channel.stats()
            assert stats.buffers_without_credit == 0, stats
            assert stats.max_in_flight_over_credit == 0, stats
            assert (
                stats.max_in_flight <= config.exclusive_buffers_per_channel + config.floating_buffers_per_gate
            )
            assert stats.buffers_received <= stats.credits_announced
        gate_stats = gate.stats()
        assert gate_stats.buffers_without_credit == 0 and gate_stats.max_in_flight_over_credit == 0

        for seqs in received.values():  # whatever arrived came once and in order per subpartition
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        all_seqs = sorted(x for v in received.values() for x in v)
        if abort_at is not None:
            assert not producer_error
            assert isinstance(consumer_error, ProducerFailedError), repr(consumer_error)
            assert "aborted by the test" in str(consumer_error)  # the producer's reason, and where
            assert str(partition.partition_id) in str(consumer_error)
            assert gate_stats.channels_finished == 0  # nothing reported complete that was not
            sent_rows = sum(b.num_rows for b in written)
            assert set(all_seqs) <= set(range(sent_rows))
        elif not cancelled:
            assert consumer_error is None, repr(consumer_error)
            assert not producer_error
            assert all_seqs == list(range(sum(b.num_rows for b in written)))
            assert gate_stats.channels_finished == len(specs)
            senders = {sender.subpartition.index: sender for sender in server.senders()}
            # A sender marks itself completed just after sending end-of-partition.
            assert wait_until(lambda: all(senders[c.subpartition].completed for c in remote), 30, 0.005)
            for channel in remote:  # the sender's count agrees with the receiver's
                assert senders[channel.subpartition].buffers_sent == channel.stats().buffers_received
        else:
            assert consumer_error is None, repr(consumer_error)
    finally:
        server.close()  # idempotent; also on a failing example, so nothing leaks
    assert partition.pool.in_use == 0
    assert gate.floating.in_use == 0
    assert pool.num_available == pool.num_segments, "every buffer must be back in the pool"


def _sub_of(keys: np.ndarray, n: int) -> int:
    """The subpartition a handed-out batch came from (all its rows must share it)."""
    batch = pa.record_batch({"key": pa.array(keys)})
    subs = np.unique(hash_rows(batch, ["key"]) % np.uint64(n))
    assert len(subs) <= 1, "a batch handed out by the gate mixes subpartitions"
    return int(subs[0]) if len(subs) else 0
