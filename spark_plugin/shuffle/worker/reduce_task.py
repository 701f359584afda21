"""The reduce task of a materialized shuffle, run by Spark in a Python worker.

``statuses.repartition(R, rk).mapInArrow(reduce_function(plan, consume))``: receive the status
rows of its reduce partition and read each map output one of two ways:

- a *host-local file read*: outputs of this executor, and with ``readHostLocalDisk`` those of
  other executors on this host, are read straight from their files (a worker is a different
  process from the agent, and a direct file read is cheaper than a loopback stream); a read
  opens only a map output of the status row's executor and shuffle (``agent_layout.owned_output``);
- a *stream*: the other outputs go through an engine ``InputGate`` of ``RemoteChannelSpec``s,
  one credit-based stream per remote agent, staged by its ``MapOutputService`` over
  ``MapOutputClient``.

When an executor is lost, its status blocks are lost with its map-output files, the reduce stage
hits a fetch failure, and Spark recomputes exactly the lost map partitions on live executors
before the reads resume; a read that fails fails the task with ``MapOutputLostError`` (naming
executor and map partitions) after ``lost_outputs`` arranged the recompute. Then the batches go
to a consumer: passed through, a whole partition, or key groups (``group_consumer``). Task
timings come from an injected ``arrowbeat_base.clock.Clock`` (monotonic).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import CorruptDataError, SchemaMismatchError, ShuffleError
from arrow_shuffle.gate import InputGate, RemoteChannelSpec
from arrow_shuffle.ids import PartitionId
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.agent_layout import note_read, owned_output, shuffle_roots
from spark_plugin.shuffle.map_output import read_segments
from spark_plugin.shuffle.plan import CARRIER_SCHEMA, STATUS_SCHEMA, Report, ShufflePlan, client_transport
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient, find_agent
from spark_plugin.shuffle.worker.grouping import Rows, iter_groups
from spark_plugin.shuffle.worker.map_task import _check_schema, _task, attempt_stage
from spark_plugin.shuffle.worker.output_recovery import _files_of, _label, damaged_output, keyed, lost_outputs
from spark_plugin.shuffle.worker.reduce_spill import partition_rows, spilled_bytes
from spark_plugin.shuffle.worker.row_buckets import held_bytes


@dataclass
class ReadStats:
    bytes: int = 0
    batches: int = 0
    rows: int = 0
    file_bytes: int = 0
    """Bytes read by host-local file reads (map-output files read by the task itself)."""
    streamed_bytes: int = 0
    """Bytes streamed from other executors' agents through the credit-based gate."""
    blocked_s: float = 0.0
    spill_bytes: int = 0
    """Bytes the grouped function's input spilled to local disk (``reduce_spill``)."""
    recomputed: list[tuple[int, str]] = field(default_factory=list)
    """``(map partition, attempt)`` of the map outputs read that were written by a recomputation."""

    def count(self, batch: pa.RecordBatch) -> int:
        """Count ``batch`` as read; its bytes (``held_bytes``)."""
        size = held_bytes(batch)
        self.batches += 1
        self.rows += batch.num_rows
        self.bytes += size
        return size


# -- reduce side ---------------------------------------------------------------------------------
_pool_lock = threading.Lock()


_pools: dict[tuple[int, int], NetworkBufferPool] = {}


def _worker_pool(segments: int, size: int) -> NetworkBufferPool:
    """A gate pool reused by the tasks of one (reused) Python worker: pages touched once."""
    with _pool_lock:
        pool = _pools.get((segments, size))
        if pool is None:
            pool = _pools[(segments, size)] = NetworkBufferPool(segments, size)
        return pool


def statuses_by_reducer(batches: Iterable[pa.RecordBatch]) -> dict[int, list[dict[str, Any]]]:
    """The status rows this task received, per reduce partition, one per map partition.

    Spark serves one output per map partition of the exchange that brings them, so a second row
    of one (reduce, map) naming another file is two map outputs under one map index (two map
    partitions evaluated in one task, say, which takes its partition id as their index): keeping
    either would drop the other's rows without a word, so it fails the task, naming both files."""
    received = list(batches)
    if not received:
        return {}
    # Columns by name, nullability ignored: an adaptive shuffle recomputes ``rk`` (non-null).
    table = pa.Table.from_batches(received)
    schema = STATUS_SCHEMA
    if CARRIER_SCHEMA.names[0] in table.column_names:  # rows shuffled from a cache (``carry_function``)
        schema = pa.schema([*STATUS_SCHEMA, *CARRIER_SCHEMA])
    table = table.select(schema.names).cast(schema)
    rows = table.to_pylist()
    found: dict[int, dict[int, dict[str, Any]]] = defaultdict(dict)
    for row in rows:
        kept = found[row["reduce"]].setdefault(row["map"], row)
        if kept["path"] != row["path"]:
            raise ShuffleError(
                f"reduce partition {row['reduce']}: two map outputs claim map partition {row['map']} "
                f"({kept['path']}, attempt {kept['attempt']}, and {row['path']}, attempt "
                f"{row['attempt']}): a shuffle's map partitions must have distinct indices; reading "
                "one would lose the other's rows (a bug in how this shuffle was planned)"
            )
    return {r: sorted(m.values(), key=lambda s: s["map"]) for r, m in found.items()}


def recomputed_outputs(statuses: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """``(map partition, attempt)`` of the statuses a recomputation wrote.

    One query runs its map stage once; a map status from a later stage is a recomputation (Spark
    reran the lost partitions after a fetch failure). Rows carried from a cache name the map job's
    stage (``map_stage``): every row one task receives may have been recomputed, and the earliest
    of them is then no guide."""
    stamped = [s["map_stage"] for s in statuses if s.get("map_stage") is not None]
    first_stage = min(stamped) if stamped else min(attempt_stage(s["attempt"]) for s in statuses)
    return sorted({(s["map"], s["attempt"]) for s in statuses if attempt_stage(s["attempt"]) > first_stage})


def read_partitions(
    plan: ShufflePlan,
    by_reducer: dict[int, list[dict[str, Any]]],
    me: AgentInfo,
    stats: ReadStats,
) -> Iterator[pa.RecordBatch]:
    """Every batch of the reduce partitions a task was given (one, or a coalesced run of them):
    host-local file reads first, then one stream per remote executor for all of them.

    One staged stream per executor, not per reduce partition, is what makes a coalesced task cost
    one control round trip per executor however many partitions it packs."""
    schema = plan.schema
    reducers = sorted(by_reducer)
    statuses = [s for r in reducers for s in by_reducer[r]]
    stats.recomputed = recomputed_outputs(statuses)
    from_files: list[dict[str, Any]] = []
    streamed: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in statuses:
        if s["bytes"] == 0:
            continue
        if reads_from_disk(s, me, plan.read_host_local):
            from_files.append(s)
        else:
            streamed[s["executor"]].append(s)
    label = _label(plan, reducers)
    touched: set[str] = set()
    for s in from_files:
        # A status row naming anything but a map output of its executor is refused, not read.
        path = owned_output(s["path"], plan.app_id, s["executor"], plan.shuffle_id)
        if os.path.dirname(path) not in touched:  # the owner's TTL counts reads, disk ones too
            touched.add(os.path.dirname(path))
            note_read(path)
        try:
            for batch in read_segments(path, json.loads(s["segments"]), schema=schema):
                stats.file_bytes += stats.count(batch)
                yield batch
        except (OSError, ShuffleError) as exc:
            with contextlib.suppress(ShuffleError):  # without the secret the owner is not told
                plan = keyed(plan, me)
            if isinstance(exc, CorruptDataError):
                raise damaged_output(plan, s, label, exc) from exc
            raise lost_outputs(
                plan,
                [s],
                f"{label}: the host-local output of map partition {s['map']} on executor "
                f"{s['executor']} is unreadable ({exc})",
            ) from exc
    if not streamed:
        return
    plan = keyed(plan, me)
    clients: list[tuple[MapOutputClient, PartitionId]] = []
    specs = []
    try:
        for executor, items in streamed.items():
            try:
                client = MapOutputClient(
                    (items[0]["host"], items[0]["control_port"]),
                    plan.secret,
                    f"executor {executor}",
                    transport=client_transport(plan),
                )
                try:
                    pid = client.stage(plan.shuffle_id, reducers[0], schema, _files_of(items))
                except BaseException:
                    client.close()
                    raise
            except ShuffleError as exc:
                raise lost_outputs(plan, items, f"{_where(label, executor, items)}: {exc}") from exc
            clients.append((client, pid))
            specs.append(RemoteChannelSpec((items[0]["host"], items[0]["data_port"]), pid, 0))
        config = ShuffleConfig(
            buffer_size=plan.buffer_size, network_memory_bytes=plan.buffer_size, checksum=plan.checksum
        )
        need = len(specs) * config.exclusive_buffers_per_channel + config.floating_buffers_per_gate
        pool = _worker_pool(need, plan.buffer_size)
        gate = InputGate(specs, schema, pool, config, plan.secret, client_transport(plan))
        try:
            for batch in gate:
                stats.streamed_bytes += stats.count(batch)
                yield batch
        except ShuffleError as exc:
            lost = [s for items in streamed.values() for s in items]
            raise lost_outputs(
                plan,
                lost,
                f"{label}: reading map outputs {sorted({s['map'] for s in lost})} from executors "
                f"{sorted(streamed)} failed ({exc}); Spark retries the task and recomputes lost map "
                "partitions",
            ) from exc
        finally:
            gate.close()
            stats.blocked_s += gate.stats().blocked_on_data_s
    finally:
        for client, pid in clients:
            with contextlib.suppress(ShuffleError):
                client.unstage(pid)
            client.close()


def reads_from_disk(status: dict[str, Any], me: AgentInfo, host_local: bool) -> bool:
    """Is this map output a host-local file read rather than a stream from its agent?

    Always for this executor's own outputs. With ``host_local`` also for those of other executors
    on this host whose file this process can read, as Spark does with
    ``spark.shuffle.readHostLocalDisk``: the disk is shared, and a file read costs one copy,
    where the stream costs the serving agent's CPU and two copies more. A file that vanishes
    (its executor died and its agent cleaned up) fails the read like a lost remote output.
    """
    if status["executor"] == me.executor_id:
        return True
    return host_local and status["host"] == me.host and os.access(status["path"], os.R_OK)


def _where(label: str, executor: str, items: Sequence[dict[str, Any]]) -> str:
    maps = sorted({s["map"] for s in items})
    return (
        f"{label}: map outputs {maps} on lost executor {executor} "
        f"({items[0]['host']}:{items[0]['control_port']}) are unreachable"
    )


@dataclass
class _ReduceTask:
    """What every reduce task learns before it reads: its status rows per reduce partition, its
    executor's agent and its attempt, and when it started (for its read report)."""

    by_reducer: dict[int, list[dict[str, Any]]]
    me: AgentInfo
    attempt: str
    started: float

    @classmethod
    def start(
        cls, plan: ShufflePlan, status_batches: Iterable[pa.RecordBatch], clock: Clock
    ) -> _ReduceTask | None:
        """``None`` for a task that received no status rows (an empty partition of the plan)."""
        by_reducer = statuses_by_reducer(status_batches)
        if not by_reducer:
            return None
        me = find_agent(shuffle_roots(plan.root), plan.app_id, clock=clock)
        _, attempt, _ = _task()
        return cls(by_reducer, me, attempt, clock.monotonic())

    @property
    def reducers(self) -> list[int]:
        return sorted(self.by_reducer)

    def report(self, stats: ReadStats, clock: Clock) -> dict[str, Any]:
        return _read_report(self.reducers, self.attempt, self.me, stats, clock.monotonic() - self.started)


def reduce_function(
    plan: ShufflePlan,
    report: Report,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    clock: Clock = SYSTEM_CLOCK,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The reduce task: ``consume(first reducer, batches)`` over every reduce partition it was given
    (one, or a contiguous run of them when the shuffle's partitions were coalesced: a key lives in
    exactly one reduce partition, so grouping their union finds the same groups)."""

    def run(status_batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _ReduceTask.start(plan, status_batches, clock)
        if task is None:
            return
        stats = ReadStats()
        spilled = spilled_bytes()
        yield from consume(task.reducers[0], read_partitions(plan, task.by_reducer, task.me, stats))
        stats.spill_bytes = spilled_bytes() - spilled
        pa.default_memory_pool().release_unused()
        report(task.report(stats, clock))

    return run


RIGHT_MAPS = 1 << 30
"""A cogroup's two inputs share one shuffle: map partition ``i`` of the right side is ``RIGHT_MAPS + i``
in its status rows, file names and ``shuffle_metrics`` rows."""


def cogroup_reduce_function(
    left: ShufflePlan,
    right: ShufflePlan,
    report: Report,
    consume: Callable[[int, Iterator[pa.RecordBatch], Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    clock: Clock = SYSTEM_CLOCK,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The reduce task of a cogroup: both sides' map outputs of its reduce partitions (told apart
    by map index, ``RIGHT_MAPS``), each read with its own schema, then ``consume(first reducer,
    left batches, right batches)``. One read report for both sides."""

    def run(status_batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task = _ReduceTask.start(left, status_batches, clock)
        if task is None:
            return
        lefts = {r: [s for s in rows if s["map"] < RIGHT_MAPS] for r, rows in task.by_reducer.items()}
        rights = {r: [s for s in rows if s["map"] >= RIGHT_MAPS] for r, rows in task.by_reducer.items()}
        stats, right_stats = ReadStats(), ReadStats()
        left_batches = _side(left, lefts, task.me, stats)
        right_batches = _side(right, rights, task.me, right_stats)
        spilled = spilled_bytes()
        yield from consume(task.reducers[0], left_batches, right_batches)
        stats.spill_bytes = spilled_bytes() - spilled
        pa.default_memory_pool().release_unused()
        for name in ("bytes", "batches", "rows", "file_bytes", "streamed_bytes", "blocked_s"):
            setattr(stats, name, getattr(stats, name) + getattr(right_stats, name))
        stats.recomputed = sorted(stats.recomputed + right_stats.recomputed)
        report(task.report(stats, clock))

    return run


def _side(
    plan: ShufflePlan, by_reducer: dict[int, list[dict[str, Any]]], me: AgentInfo, stats: ReadStats
) -> Iterator[pa.RecordBatch]:
    """One cogroup side's batches (none when no map task of that side wrote to these partitions)."""
    present = {r: rows for r, rows in by_reducer.items() if rows}
    if present:
        yield from read_partitions(plan, present, me, stats)


def _read_report(
    reducers: Sequence[int], attempt: str, me: AgentInfo, stats: ReadStats, seconds: float
) -> dict[str, Any]:
    return {
        "side": "read",
        "partition": reducers[0],
        "reducers": [reducers[0], reducers[-1]],
        "attempt": attempt,
        "recomputed": bool(stats.recomputed),
        "recomputed_maps": stats.recomputed,
        "executor": me.executor_id,
        "control": [me.host, me.control_port],
        "bytes": stats.bytes,
        "file_bytes": stats.file_bytes,
        "streamed_bytes": stats.streamed_bytes,
        "batches": stats.batches,
        "rows": stats.rows,
        "spill_bytes": stats.spill_bytes,
        "blocked_s": stats.blocked_s,
        "seconds": seconds,
    }


def passthrough(_: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches


def partition_consumer(
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], out_schema: pa.Schema
) -> Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def consume(reducer: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for out in func(batches):
            _check_schema(out.schema, out_schema, f"func on shuffled partition {reducer}")
            yield pa.RecordBatch.from_arrays(out.columns, schema=out_schema)

    return consume


def group_consumer(
    func: Callable[[pa.Table], pa.Table],
    key_columns: Sequence[str],
    in_schema: pa.Schema,
    out_schema: pa.Schema,
    batch_rows: int = 65536,
    memory_bytes: int | None = None,
    partitions: int | None = None,
) -> Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Group the reducer's rows in Arrow and call ``func`` once per group (the hot loop: with
    100k groups a microsecond per group is a tenth of a second, so checks are cheap first). Past
    ``memory_bytes`` the rows are grouped a spilled bucket at a time (``reduce_spill``);
    ``partitions``: the shuffle's reduce partitions, which bucket a coalesced task's rows."""

    def consume(reducer: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for bucket in partition_rows(batches, in_schema, key_columns, memory_bytes, partitions=partitions):
            yield from bucket_results(reducer, bucket)

    def bucket_results(reducer: int, bucket: Rows) -> Iterator[pa.RecordBatch]:
        """One bucket's results, all sent before the next bucket is sorted: results may view
        their group's rows, and holding them would keep this bucket's sorted copy alive."""
        pending: list[pa.Table] = []
        rows = 0
        for group in iter_groups(bucket, key_columns):
            out = func(group)
            if not isinstance(out, pa.Table) or not out.schema.equals(out_schema):
                out = _conform(out, out_schema, reducer, group, key_columns)
            if out.num_rows == 0:
                continue
            pending.append(out)
            rows += out.num_rows
            if rows >= batch_rows:
                yield from _emit(pending, out_schema)
                pending, rows = [], 0
        if pending:
            yield from _emit(pending, out_schema)

    return consume


def _conform(
    out: object, schema: pa.Schema, reducer: int, group: pa.Table, key_columns: Sequence[str]
) -> pa.Table:
    """``out`` with ``schema``'s exact fields, or an error naming the group and partition."""
    keys = {k: group.column(k)[0].as_py() for k in key_columns}
    if not isinstance(out, pa.Table):
        raise SchemaMismatchError(
            f"func must return a pyarrow.Table; got {type(out).__name__} for key group {keys} "
            f"of partition {reducer}"
        )
    _check_schema(out.schema, schema, f"func on key group {keys} of partition {reducer}")
    return pa.Table.from_arrays(out.columns, schema=schema)  # only nullability/metadata differ


def _emit(tables: list[pa.Table], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    yield from pa.concat_tables(tables).combine_chunks().to_batches()
