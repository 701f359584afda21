"""``mode="pipelined"``: map tasks stream to running reduce tasks under credits, in one stage.

Plan: ``df.mapInArrow(fn).union(rows(R).mapInArrow(fn))`` is *one* stage of M + R tasks (a union
of narrow dependencies), so with M + R free slots all of them run at once and a map task blocked
on credits has its readers running. The driver refuses up front when M + R exceeds the
application's slots (Spark's barrier mode, which would guarantee co-scheduling, rejects unions).
``rows(R)`` is an RDD scan, whose unknown partitioning keeps Spark 4.1+ from zipping the union's
children partition by partition (``spark.sql.unionOutputPartitioning``: with M = R = 1 both sides
report ``SinglePartition`` and the map and reduce task would become one task waiting on itself);
the driver also checks the planned union has M + R partitions and refuses otherwise.

Data path: each map task hosts an engine ``PartitionServer`` with a PIPELINED ``ResultPartition``
(R subpartitions, bounded buffers: the writer blocks until reducers grant credit) in its own
Python worker; pipelined data never outlives its producer, so unlike materialized map outputs it
needs no agent. The driver's ``rendezvous.Rendezvous`` maps each map task to its address. The map
task exits once every subpartition was consumed (or fails after ``CONSUME_TIMEOUT_S`` on an
injected ``arrowbeat_base.clock.Clock``), and unregisters its entry as it ends, drained or failed:
its readers located it before they could drain it, and a retried reader could not re-read it
anyway. So the driver holds entries of running shuffles only, however many ran before.

Failure: pipelined outputs are consumed as they stream and cannot be re-read, so a lost task
fails its readers/producers and, after Spark's retries, the query, with an error naming the
partition; it never yields a partial result. Use ``mode="materialized"`` for recoverable shuffles.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ShuffleError
from arrow_shuffle.gate import InputGate, RemoteChannelSpec
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import ResultPartition
from arrow_shuffle.partition_server import PartitionServer, StreamCounts
from arrow_shuffle.writer import RecordWriter
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.plan import Report, ShufflePlan, client_transport, server_transport
from spark_plugin.shuffle.rendezvous_client import locate, register, unregister
from spark_plugin.shuffle.worker.reduce_task import ReadStats

log = logging.getLogger(__name__)

CONSUME_TIMEOUT_S = 120.0
"""Longest a finished map task waits for its reducers to drain it."""

HANG_UP_GRACE_S = 10.0
"""Longest a drained map task waits for its readers to hang up before it closes its server (a
reader hangs up as soon as it reads END; past this it learns END from the stream anyway)."""
WAIT_SLICE_S = 0.05
"""Real seconds between two looks at the injected clock while waiting for readers (a stream's
END or hang-up wakes the wait at once)."""


def _host() -> str:
    """The address reducers reach this worker at: Spark's own choice (``SPARK_LOCAL_IP``) first."""
    chosen = os.environ.get("SPARK_LOCAL_IP")
    if chosen:
        return chosen
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def pipelined_function(
    plan: ShufflePlan,
    num_maps: int,
    rendezvous: tuple[str, int],
    report: Report,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    pre: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]] | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """One function for both sides: union partitions ``< num_maps`` are map tasks."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        index = ctx.partitionId()
        attempt = ctx.attemptNumber()
        config = ShuffleConfig(
            buffer_size=plan.buffer_size, network_memory_bytes=32 * plan.buffer_size, checksum=plan.checksum
        )
        if index < num_maps:
            yield from _map(
                plan, rendezvous, index, attempt, config, report, pre(batches) if pre else batches, clock
            )
        else:
            yield from _reduce(
                plan, rendezvous, index - num_maps, num_maps, config, report, consume, batches, clock
            )

    return run


def _map(
    plan: ShufflePlan,
    rendezvous: tuple[str, int],
    index: int,
    attempt: int,
    config: ShuffleConfig,
    report: Report,
    batches: Iterable[pa.RecordBatch],
    clock: Clock,
) -> Iterator[pa.RecordBatch]:
    started = clock.monotonic()
    pool = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    server = PartitionServer(plan.secret, plan.app_id, _host(), 0, config, server_transport(plan))
    token = secrets.randbits(30)  # tells this attempt's partition from an earlier one's
    pid = PartitionId(plan.app_id, plan.shuffle_id, index, token)
    partition = ResultPartition(pid, plan.num_partitions, plan.schema, pool, config)
    server.register(partition)
    registered = False
    try:
        host, port = server.address
        register(
            rendezvous,
            plan.secret,
            plan.shuffle_id,
            index,
            host,
            port,
            token,
            clock=clock,
            transport=client_transport(plan),
        )
        registered = True
        writer = RecordWriter(partition, plan.key_columns)
        try:
            for batch in batches:
                if not batch.schema.equals(plan.schema):
                    batch = pa.RecordBatch.from_arrays(batch.columns, schema=plan.schema)
                writer.write(batch)
            writer.finish()
        except BaseException:
            writer.abort()
            raise
        _wait_until_drained(server, plan.num_partitions, index, clock)
        _wait_for_hang_ups(server, plan.num_partitions, clock)
        stats = partition.stats()
        report(
            {
                "side": "write",
                "partition": index,
                "attempt": f"pipelined.{attempt}",
                "recomputed": False,
                "executor": "pipelined",
                "control": [],
                "bytes": stats.bytes_written,
                "batches": stats.batches_written,
                "rows": stats.rows_written,
                "spill_bytes": 0,
                "blocked_s": stats.blocked_on_pool_s + stats.blocked_on_credit_s,
                "seconds": clock.monotonic() - started,
            }
        )
    finally:
        server.close()
        if registered:
            _unregister(plan, rendezvous, index, token, clock)
    return
    yield


def _wait_until_drained(server: PartitionServer, streams: int, index: int, clock: Clock) -> None:
    """Every subpartition sent its END, within ``CONSUME_TIMEOUT_S`` on ``clock``."""
    deadline = clock.monotonic() + CONSUME_TIMEOUT_S

    def drained(counts: StreamCounts) -> bool:
        return counts.completed >= streams

    while not server.wait_for_streams(drained, WAIT_SLICE_S):
        if clock.monotonic() > deadline:
            raise ShuffleError(f"pipelined map partition {index}: reducers did not drain it in time")


def _wait_for_hang_ups(server: PartitionServer, streams: int, clock: Clock) -> None:
    """Close only once every reader hung up after END (bounded): a credit a reader announces
    while END is still in flight must find the connection open, not a reset."""
    deadline = clock.monotonic() + HANG_UP_GRACE_S

    def hung_up(counts: StreamCounts) -> bool:
        return counts.ended_completed >= streams

    for _ in range(int(HANG_UP_GRACE_S / WAIT_SLICE_S)):  # bounded in real time too, as it was
        if server.wait_for_streams(hung_up, WAIT_SLICE_S) or clock.monotonic() >= deadline:
            return


def _unregister(plan: ShufflePlan, rendezvous: tuple[str, int], index: int, token: int, clock: Clock) -> None:
    """Best effort: a driver that cannot be told keeps the entry until its TTL sweep."""
    try:
        unregister(
            rendezvous,
            plan.secret,
            plan.shuffle_id,
            index,
            token,
            clock=clock,
            transport=client_transport(plan),
        )
    except ShuffleError as exc:
        log.info("pipelined map partition %s of shuffle %s not unregistered: %s", index, plan.shuffle_id, exc)


def _reduce(
    plan: ShufflePlan,
    rendezvous: tuple[str, int],
    reducer: int,
    num_maps: int,
    config: ShuffleConfig,
    report: Report,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    batches: Iterable[pa.RecordBatch],
    clock: Clock,
) -> Iterator[pa.RecordBatch]:
    started = clock.monotonic()
    for _ in batches:  # the range row that made this task; nothing to read from it
        pass
    maps = locate(
        rendezvous, plan.secret, plan.shuffle_id, num_maps, clock=clock, transport=client_transport(plan)
    )
    specs = [
        RemoteChannelSpec(
            (m["host"], int(m["port"])),
            PartitionId(plan.app_id, plan.shuffle_id, int(m["map"]), int(m["token"])),
            reducer,
        )
        for m in sorted(maps, key=lambda m: int(m["map"]))
    ]
    need = len(specs) * config.exclusive_buffers_per_channel + config.floating_buffers_per_gate
    pool = NetworkBufferPool(need, config.buffer_size)
    gate = InputGate(specs, plan.schema, pool, config, plan.secret, client_transport(plan))
    stats = ReadStats()

    def counted() -> Iterator[pa.RecordBatch]:
        for b in gate:
            stats.count(b)
            yield b

    try:
        yield from consume(reducer, counted())
    finally:
        gate.close()
    report(
        {
            "side": "read",
            "partition": reducer,
            "attempt": "pipelined",
            "recomputed": False,
            "recomputed_maps": [],
            "executor": "pipelined",
            "control": [],
            "bytes": stats.bytes,
            "batches": stats.batches,
            "rows": stats.rows,
            "spill_bytes": 0,
            "blocked_s": gate.stats().blocked_on_data_s,
            "seconds": clock.monotonic() - started,
        }
    )
