"""Property-based: credits bound what is in flight, every row arrives once and in order.

Random batch sizes, buffer sizes, credit settings, consumer slowness and cancellation, over
the real TCP transport. The sender and the receiver count what they do; the invariants are
asserted on those counters.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arrow_shuffle import (
    InputGate,
    LocalChannelSpec,
    NetworkBufferPool,
    PartitionId,
    PartitionKind,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleError,
    ShuffleServer,
)
from arrow_shuffle.partitioner import hash_rows
from arrow_shuffle.remote_channel import RemoteInputChannel

from .conftest import APP, SCHEMA, SECRET, make_batch

scenario = st.fixed_dictionaries(
    {
        "buffer_size": st.sampled_from([4096, 8192, 32768]),
        "exclusive": st.integers(1, 3),
        "floating": st.integers(0, 4),
        "subpartitions": st.integers(1, 3),
        "batch_rows": st.lists(st.integers(1, 700), min_size=1, max_size=25),
        "slow_every": st.sampled_from([0, 3, 7]),
        "cancel_after": st.one_of(st.none(), st.integers(0, 10)),
        "flush_timeout_s": st.sampled_from([0.0, 0.005, 0.05]),
        "blocking": st.booleans(),
        "local_first": st.booleans(),
    }
)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
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
        blocking_memory_bytes=6 * s["buffer_size"],  # BLOCKING: spill almost everything
        spill_dir=str(tmp_path_factory.mktemp("spill")),
    )
    pool = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    server = ShuffleServer(SECRET, APP, config=config)
    try:
        kind = PartitionKind.BLOCKING if s["blocking"] else PartitionKind.PIPELINED
        partition = ResultPartition(PartitionId(APP, 7, 0), s["subpartitions"], SCHEMA, pool, kind, config)
        server.register(partition)
        writer = RecordWriter(partition, key_columns=["key"])
        written: list[pa.RecordBatch] = []
        producer_error: list[BaseException] = []

        def produce() -> None:
            start = 0
            try:
                for rows in s["batch_rows"]:
                    batch = make_batch(start, rows, payload_len=int(rows) % 40)
                    writer.write(batch)
                    written.append(batch)
                    start += rows
                writer.finish()
            except ShuffleError as exc:  # only legitimate when the consumer cancelled
                producer_error.append(exc)
                writer.abort()

        producer = threading.Thread(target=produce)
        producer.start()
        specs: list[LocalChannelSpec | RemoteChannelSpec] = [
            RemoteChannelSpec(server.address, partition.partition_id, i) for i in range(s["subpartitions"])
        ]
        if s["local_first"]:  # mix in a local channel: same gate, no network, no credit
            specs[0] = LocalChannelSpec(partition, 0)
        received: dict[int, list[int]] = defaultdict(list)
        cancelled = False
        gate = InputGate(specs, SCHEMA, pool, config, secret=SECRET)
        try:
            for n, batch in enumerate(gate):
                if s["cancel_after"] is not None and n >= s["cancel_after"]:
                    cancelled = True
                    gate.close()
                    break
                if s["slow_every"] and n % s["slow_every"] == 0:
                    time.sleep(0.002)  # a slow consumer, not synchronisation
                sub = _sub_of(batch.column("key").to_numpy(), s["subpartitions"])
                received[sub].extend(batch.column("seq").to_pylist())
        finally:
            gate.close()
        producer.join(15)
        assert not producer.is_alive()
        channels = [c for c in gate.channels if isinstance(c, RemoteInputChannel)]
        for channel in channels:  # in flight never exceeded what the receiver announced
            assert (
                channel.max_in_flight
                <= config.exclusive_buffers_per_channel + config.floating_buffers_per_gate
            )
            assert channel.buffers_received <= channel.credits_announced
        for sender in server.senders():  # no buffer left without credit
            assert sender.max_overdraft <= 0
            assert sender.buffers_sent <= sender.credit.granted_total
        if not cancelled:
            assert not producer_error
            expected = pa.Table.from_batches(written, schema=SCHEMA) if written else None
            total = sum(len(v) for v in received.values())
            assert total == (expected.num_rows if expected is not None else 0)
            for seqs in received.values():  # exactly once, in order per subpartition
                assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            all_seqs = sorted(x for v in received.values() for x in v)
            assert all_seqs == list(range(len(all_seqs)))
    finally:
        server.close()  # idempotent; also on a failing example, so nothing leaks
    assert pool.num_available == pool.num_segments, "every buffer must be back in the pool"


def _sub_of(keys: np.ndarray, n: int) -> int:
    """The subpartition a handed-out batch came from (all its rows must share it)."""
    batch = pa.record_batch({"key": pa.array(keys)})
    subs = np.unique(hash_rows(batch, ["key"]) % np.uint64(n))
    assert len(subs) <= 1, "a batch handed out by the gate mixes subpartitions"
    return int(subs[0]) if len(subs) else 0
