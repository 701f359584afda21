"""The task bodies Spark runs in its Python workers for a materialized shuffle: map and reduce side.

Map task (``df.mapInArrow(map_fn)``): route the partition's batches by key into a map-output file
(``map_output``) in this executor's agent directory, then emit one tiny *status row per reduce
partition* (where the file is, its segments, bytes/batches/rows).

Reduce task (``statuses.repartition(R, rk).mapInArrow(reduce_fn)``): receive the status rows of
its reduce partition and read each map output one of two ways:

- a *host-local file read*: outputs of this executor, and with ``readHostLocalDisk`` those of
  other executors on this host, are read straight from their files. A worker is a
  different process from the agent, and a direct file read is cheaper than a loopback stream.
- a *stream*: the other outputs go through an engine ``InputGate`` of
  ``RemoteChannelSpec``s, one credit-based stream per remote agent, staged by its
  ``MapOutputService`` over ``MapOutputClient``.

The status rows travel through Spark's own shuffle on purpose: they are a few bytes per
(map, reduce) pair, and it makes Spark's DAGScheduler the map-output tracker of record. When an
executor is lost, its status blocks are lost with its map-output files, the reduce stage hits
a fetch failure, and Spark recomputes exactly the lost map partitions on live executors before
the reads resume; a read that fails fails the task with ``MapOutputLostError`` (naming executor
and map partitions), and its retry goes through the same path.

Spark Connect: a plan made from a Connect session carries no secret (the client never sees it),
so a reduce task that streams gets it from its own agent (``keyed``); there being no accumulator
and no driver inside the cluster, ``write_reports`` rebuilds the map tasks' reports from their
status rows and ``release_function`` releases a shuffle from a task.

Task timings come from an injected ``arrowbeat_base.clock.Clock`` (monotonic).

Paths: the shuffle roots are resolved where the task runs (``agent_layout.shuffle_roots``: the
executor's own local dirs, never a path computed on the driver); every id in a map output's name
passes ``check_id``; the map task writes only into one of its agent's folders (spread over the
executor's local dirs) after checking it is private; a host-local read opens only a map output of
the status row's executor and shuffle (``agent_layout.owned_output``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import CorruptDataError, MapOutputLostError, SchemaMismatchError, ShuffleError
from arrow_shuffle.gate import InputGate, RemoteChannelSpec
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.private_files import check_id, check_private_dir
from arrow_shuffle.transport import TcpTransport, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.settings.tls import TlsMaterial, client_context, server_context
from spark_plugin.shuffle.agent_layout import note_read, owned_output, shuffle_roots, spread_dir
from spark_plugin.shuffle.map_output import MapOutputWriter, read_segments
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient, find_agent, secret_of
from spark_plugin.shuffle.worker.grouping import Rows, iter_groups
from spark_plugin.shuffle.worker.reduce_spill import partition_rows, spilled_bytes

STATUS_SCHEMA = pa.schema(
    [
        ("rk", pa.int64()),
        ("reduce", pa.int32()),
        ("map", pa.int32()),
        ("attempt", pa.string()),
        ("executor", pa.string()),
        ("host", pa.string()),
        ("data_port", pa.int32()),
        ("control_port", pa.int32()),
        ("path", pa.string()),
        ("segments", pa.string()),
        ("bytes", pa.int64()),
        ("batches", pa.int64()),
        ("rows", pa.int64()),
        ("spill_bytes", pa.int64()),
        ("seconds", pa.float64()),
    ]
)
"""One row per (map partition, reduce partition). ``spill_bytes`` and ``seconds`` are the map
task's own, repeated on each of its rows: with the others they make its write report where no
accumulator carries one (``write_reports``)."""
STATUS_DDL = (
    "rk bigint, reduce int, map int, attempt string, executor string, host string, data_port int, "
    "control_port int, path string, segments string, bytes bigint, batches bigint, rows bigint, "
    "spill_bytes bigint, seconds double"
)
CARRIER_SCHEMA = pa.schema(
    [("carrier", pa.string()), ("carrier_host", pa.string()), ("carrier_port", pa.int32())]
)
"""Where a status row was shuffled from (``carry_function``): the executor, and its agent's host and
control port. Absent, the row was shuffled by the map task itself, from the executor it names."""
CARRIED_DDL = STATUS_DDL + ", carrier string, carrier_host string, carrier_port int"


@dataclass(frozen=True)
class ShufflePlan:
    """Everything a task needs, shipped in the task closure (the secret included: it only
    reaches executors of this application, as Spark's own auth secret does)."""

    app_id: str
    shuffle_id: int
    root: str
    """``spark.arrowbeat.shuffle.dir`` as configured ("" for the default), resolved by each task
    with ``shuffle_roots`` on its own executor."""
    secret: str = field(repr=False)  # repr and str never show it (issue 13)
    """Empty in a plan made from a Spark Connect session: its tasks ask their agent (``keyed``)."""
    key_columns: tuple[str, ...]
    num_partitions: int
    schema_ipc: bytes
    route_keys: tuple[int, ...]
    memory_bytes: int = 8 << 20
    """``spark.arrowbeat.shuffle.mapMemory``: a map task writes a run past it (``MapOutputWriter``)."""
    reduce_memory_bytes: int = 512 << 20
    """``spark.arrowbeat.shuffle.reduceMemory``: a grouped reduce task spills past it (``reduce_spill``)."""
    buffer_size: int = 1 << 20
    read_host_local: bool = True
    """Read map outputs of other executors on the same host from disk (``reads_from_disk``)."""
    checksum: bool = True
    """``spark.arrowbeat.shuffle.checksum``: map outputs carry checksums that every reader verifies."""
    lost_wait_s: float = 5.0
    """How long a reduce task that found map outputs lost waits for their executor to go before
    failing (``lost_outputs``): Spark's ``spark.shuffle.io.retryWait``."""
    tls: TlsMaterial | None = field(default=None, repr=False)
    """``spark.arrowbeat.ssl.*`` on: what tasks rebuild their SSL contexts from (an
    ``ssl.SSLContext`` cannot be pickled). Holds the key (pipelined map tasks serve their output):
    as secret as ``secret``, never in a repr."""

    @property
    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema_ipc))


def client_transport(plan: ShufflePlan) -> Transport | None:
    """How a task connects to agents and to other tasks: TLS when the plan carries material."""
    return None if plan.tls is None else _client_transport(plan.tls)


def server_transport(plan: ShufflePlan) -> Transport | None:
    """How a pipelined map task accepts its readers: TLS when the plan carries material."""
    return None if plan.tls is None else _server_transport(plan.tls)


@functools.lru_cache(maxsize=4)  # one per application's material in a reused Python worker
def _client_transport(material: TlsMaterial) -> TcpTransport:
    return TcpTransport(client_context=client_context(material), server_name=material.server_name)


@functools.lru_cache(maxsize=4)
def _server_transport(material: TlsMaterial) -> TcpTransport:
    return TcpTransport(server_context=server_context(material))


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


Report = Callable[[dict[str, Any]], None]


def unreported(row: dict[str, Any]) -> None:
    """The ``Report`` of a plan whose reports nobody collects (Spark Connect: no accumulators)."""


def _task() -> tuple[int, str, int]:
    """``(partition, "stage.taskAttemptId.attemptNumber", stage)`` of the running task.

    PySpark's ``TaskContext`` has no stage attempt number: a reducer tells a recomputed map output
    by its stage id, later than the query's first map stage (``read_partitions``)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, "0.0.0", 0
    return ctx.partitionId(), f"{ctx.stageId()}.{ctx.taskAttemptId()}.{ctx.attemptNumber()}", ctx.stageId()


# -- map side ------------------------------------------------------------------------------------
def map_function(
    plan: ShufflePlan,
    report: Report,
    pre: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]] | None = None,
    clock: Clock = SYSTEM_CLOCK,
    map_offset: int = 0,
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The map task; ``pre`` is a chained ``mapInArrow`` function run in the same worker first.

    ``map_offset`` is added to Spark's partition index: a cogroup's right side numbers its map
    partitions from ``RIGHT_MAPS`` so that both sides' outputs of one shuffle stay apart."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        if pre is not None:
            batches = _checked(pre(batches), plan.schema, "the chained mapInArrow function")
        started = clock.monotonic()
        map_index, attempt, stage = _task()
        map_index += map_offset
        agent = find_agent(shuffle_roots(plan.root), plan.app_id, clock=clock)
        name = f"m{check_id(map_index, 'map partition')}-{check_id(attempt, 'task attempt')}"
        path = os.path.join(
            check_private_dir(spread_dir(agent.output_dirs, plan.shuffle_id, map_index)),
            f"s{check_id(plan.shuffle_id, 'shuffle id')}",
            f"{name}-{uuid.uuid4().hex[:8]}.arrows",
        )
        writer = MapOutputWriter(
            path,
            plan.schema,
            plan.key_columns,
            plan.num_partitions,
            plan.memory_bytes,
            checksum=plan.checksum,
        )
        try:
            for batch in batches:
                writer.write(batch)
            outputs = writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            # Workers are reused and mimalloc keeps freed pages: hand them back between tasks.
            pa.default_memory_pool().release_unused()
        seconds = clock.monotonic() - started
        report(
            {
                "side": "write",
                "partition": map_index,
                "attempt": attempt,
                "stage": stage,
                "recomputed": False,
                "executor": agent.executor_id,
                "control": [agent.host, agent.control_port],
                "bytes": sum(o.bytes for o in outputs),
                "batches": sum(o.batches for o in outputs),
                "rows": sum(o.rows for o in outputs),
                "spill_bytes": writer.spill_bytes,
                "blocked_s": 0.0,
                "seconds": seconds,
            }
        )
        r = plan.num_partitions
        yield pa.record_batch(
            [
                pa.array(plan.route_keys, pa.int64()),
                pa.array(range(r), pa.int32()),
                pa.array([map_index] * r, pa.int32()),
                pa.array([attempt] * r),
                pa.array([agent.executor_id] * r),
                pa.array([agent.host] * r),
                pa.array([agent.data_port] * r, pa.int32()),
                pa.array([agent.control_port] * r, pa.int32()),
                pa.array([path] * r),
                pa.array([json.dumps(o.segments) for o in outputs]),
                pa.array([o.bytes for o in outputs], pa.int64()),
                pa.array([o.batches for o in outputs], pa.int64()),
                pa.array([o.rows for o in outputs], pa.int64()),
                pa.array([writer.spill_bytes] * r, pa.int64()),
                pa.array([seconds] * r, pa.float64()),
            ],
            schema=STATUS_SCHEMA,
        )

    return run


def carry_function(
    plan: ShufflePlan, clock: Clock = SYSTEM_CLOCK
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Stamps persisted status rows with the executor that shuffles them (``CARRIER_SCHEMA``).

    An adaptive shuffle's status rows are cached where their map task ran, and Spark shuffles a
    cached partition from wherever it reads it: off its owner when the locality wait runs out. The
    rows are then held by an executor that does not hold their files, and replacing the owner
    (lost outputs) leaves them behind, stale, for every retry. Stamped, a reducer that finds the
    outputs lost tells the carrier too (``lost_outputs``), whose replacement is the fetch failure
    that has Spark recompute them."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        me: AgentInfo | None = None
        for batch in batches:
            if me is None:
                me = find_agent(shuffle_roots(plan.root), plan.app_id, clock=clock)
            n = batch.num_rows
            columns = [batch.column(name) for name in STATUS_SCHEMA.names]
            columns += [
                pa.array([me.executor_id] * n, pa.string()),
                pa.array([me.host] * n, pa.string()),
                pa.array([me.control_port] * n, pa.int32()),
            ]
            schema = pa.schema([*STATUS_SCHEMA, *CARRIER_SCHEMA])
            yield pa.RecordBatch.from_arrays(
                [c.cast(f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
            )

    return run


REPORT_COLUMNS = (
    "map",
    "reduce",
    "attempt",
    "executor",
    "host",
    "control_port",
    "bytes",
    "batches",
    "rows",
    "spill_bytes",
    "seconds",
)
"""The status columns ``write_reports`` needs (what a driver collects of an eager map side)."""


def write_reports(statuses: pa.Table) -> list[dict[str, Any]]:
    """The map tasks' write reports, rebuilt from their status rows (``REPORT_COLUMNS``), one per
    map attempt: what ``map_function`` reports through an accumulator, where there is none."""
    reports: dict[tuple[int, str], dict[str, Any]] = {}
    for row in statuses.select(list(REPORT_COLUMNS)).to_pylist():
        key = (int(row["map"]), str(row["attempt"]))
        found = reports.get(key)
        if found is None:
            found = reports[key] = {
                "side": "write",
                "partition": key[0],
                "attempt": key[1],
                "stage": int(key[1].split(".")[0]),
                "recomputed": False,
                "executor": row["executor"],
                "control": [row["host"], int(row["control_port"])],
                "bytes": 0,
                "batches": 0,
                "rows": 0,
                "spill_bytes": int(row["spill_bytes"] or 0),
                "blocked_s": 0.0,
                "seconds": float(row["seconds"] or 0.0),
            }
        for column in ("bytes", "batches", "rows"):
            found[column] += int(row[column] or 0)
    return [reports[k] for k in sorted(reports)]


def _checked(batches: Iterable[pa.RecordBatch], schema: pa.Schema, what: str) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        _check_schema(batch.schema, schema, what)
        yield batch


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
    """The status rows this task received, per reduce partition, one per map partition."""
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
        found[row["reduce"]].setdefault(row["map"], row)  # Spark tracks one output per map
    return {r: sorted(m.values(), key=lambda s: s["map"]) for r, m in found.items()}


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
    # One query runs its map stage once; a map status from a later stage is a recomputation
    # (Spark resubmitted the lost partitions after a fetch failure).
    first_stage = min(int(s["attempt"].split(".")[0]) for s in statuses)
    stats.recomputed = sorted(
        {(s["map"], s["attempt"]) for s in statuses if int(s["attempt"].split(".")[0]) > first_stage}
    )
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
            for batch in read_segments(path, json.loads(s["segments"])):
                stats.file_bytes += batch.nbytes
                yield _count(stats, batch)
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
                stats.streamed_bytes += batch.nbytes
                yield _count(stats, batch)
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


def agent_client(plan: ShufflePlan, address: tuple[str, int]) -> MapOutputClient:
    """A control connection to the agent at ``address`` with ``plan``'s secret and transport."""
    return MapOutputClient(
        address, plan.secret, f"agent {address[0]}:{address[1]}", transport=client_transport(plan)
    )


def keyed(plan: ShufflePlan, me: AgentInfo) -> ShufflePlan:
    """``plan`` with the application secret: its own, or, for a plan made without one (from a
    Spark Connect session, which never sees it), the one this worker's agent hands it."""
    if plan.secret:
        return plan
    return replace(plan, secret=secret_of(me))


def release_function(
    plan: ShufflePlan, agents: Sequence[tuple[str, int]], clock: Clock = SYSTEM_CLOCK
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task that releases the shuffle in every agent of ``agents`` and yields the bytes freed.

    How a driver that cannot reach the agents itself (a Spark Connect client: outside the
    cluster, without the secret) releases a shuffle: one task, inside the cluster, keyed by its
    own executor's agent. An agent that is gone took its data with it."""

    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in batches:  # the one range row that made this task
            pass
        keyed_plan = keyed(plan, find_agent(shuffle_roots(plan.root), plan.app_id, clock=clock))
        freed = 0
        for host, port in agents:
            try:
                with agent_client(keyed_plan, (host, port)) as client:
                    freed += client.release(keyed_plan.shuffle_id)
            except ShuffleError:
                continue
        yield pa.record_batch([pa.array([freed], pa.int64())], names=["freed"])

    return run


def _files_of(items: Sequence[dict[str, Any]]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """One executor's map-output files and, per file, the segments of every partition to read,
    in reduce-partition order (``items`` are in that order)."""
    files: dict[str, list[tuple[Any, ...]]] = {}
    for s in items:
        files.setdefault(s["path"], []).extend(tuple(x) for x in json.loads(s["segments"]))
    return list(files.items())


def _label(plan: ShufflePlan, reducers: Sequence[int]) -> str:
    which = (
        f"reduce partition {reducers[0]}"
        if len(reducers) == 1
        else (f"reduce partitions {reducers[0]}-{reducers[-1]}")
    )
    return f"shuffle {plan.shuffle_id}, {which}"


def lost_outputs(
    plan: ShufflePlan, statuses: Sequence[dict[str, Any]], message: str, clock: Clock = SYSTEM_CLOCK
) -> MapOutputLostError:
    """The error to fail a reduce task with when map outputs could not be read, once Spark can act.

    Spark lists the outputs as fine: only when their executor is gone does it drop them, so that
    the task's retry meets a fetch failure and Spark recomputes exactly those map partitions. So,
    first, each owner's agent is told which of its files could not be read (``report_lost``): one
    that finds them gone has its JVM ask Spark to replace the executor; an agent that died made
    its JVM ask already. Rows of those owners that another executor carries (``stale_carriers``)
    would outlive that replacement: the carrier's agent is told (``carried_lost``) and has its
    executor replaced too. Then the task waits, at most ``plan.lost_wait_s`` (Spark's own
    ``spark.shuffle.io.retryWait`` before a fetch failure), for those agents to stop answering:
    their executors are going, and the retry then sees a fetch failure, not the same stale
    outputs."""
    owners: dict[tuple[str, int], list[str]] = defaultdict(list)
    for s in statuses:
        owners[(str(s["host"]), int(s["control_port"]))].append(str(s["path"]))
    answering = []
    lost = set()
    for (host, port), paths in owners.items():
        try:
            with agent_client(plan, (host, port)) as client:
                chunks = [paths[i : i + 1000] for i in range(0, len(paths), 1000)]
                if any([client.report_lost(plan.shuffle_id, chunk) for chunk in chunks]):
                    answering.append((host, port))
                    lost.add((host, port))
        except ShuffleError:
            lost.add((host, port))
            continue  # the agent is gone: its JVM reported the loss when it died
    for (host, port), gone in stale_carriers(statuses, lost).items():
        try:
            with agent_client(plan, (host, port)) as client:
                if client.carried_lost(plan.shuffle_id, gone):
                    answering.append((host, port))
        except ShuffleError:
            continue  # the carrier is gone: Spark dropped what it carried
    _wait_gone(answering, plan.lost_wait_s, clock)
    return MapOutputLostError(message)


def _wait_gone(answering: list[tuple[str, int]], wait_s: float, clock: Clock) -> None:
    """Waits, at most ``wait_s``, for the agents ``answering`` to stop: their executors are being
    replaced, and the task's retry must meet a fetch failure, not the same stale outputs."""
    deadline = clock.monotonic() + wait_s
    pause = threading.Event()
    while answering and clock.monotonic() < deadline:
        answering = [a for a in answering if _answers(a)]
        pause.wait(0.1)
    if not answering:  # give the driver the moment it needs to drop the executor's outputs
        pause.wait(min(1.0, wait_s))


def damaged_output(
    plan: ShufflePlan, status: dict[str, Any], label: str, exc: CorruptDataError, clock: Clock = SYSTEM_CLOCK
) -> MapOutputLostError:
    """The error to fail a reduce task with when a map output it read host-locally is damaged.

    Reading it again would fail the same way: its owner's agent is told (``report_corrupt``), and
    removes it and has Spark recompute it (``corrupt_outputs``): by dropping its status rows, so
    the task's retry meets a fetch failure for exactly that map partition (answered at once), or,
    where it cannot, by replacing the executor (then the task waits for it to go, as for a lost
    output). An owner that cannot be told is going or gone, which Spark sees by itself."""
    owner = (str(status["host"]), int(status["control_port"]))
    where = (
        f"{label}: the map output of map partition {status['map']} on executor {status['executor']} "
        f"({status['path']}) is damaged ({exc})"
    )
    try:
        with agent_client(plan, owner) as client:
            outcome = client.report_corrupt(plan.shuffle_id, str(status["path"]), str(exc))
    except ShuffleError as err:
        return MapOutputLostError(
            f"{where}; its executor's agent cannot be told ({err}): Spark retries the task"
        )
    if outcome == 1:
        return MapOutputLostError(
            f"{where}; Spark recomputes map partition {status['map']} and retries the task"
        )
    if outcome == 2:
        _wait_gone([owner], plan.lost_wait_s, clock)
        return MapOutputLostError(
            f"{where}; Spark replaces executor {status['executor']} and recomputes its outputs"
        )
    return MapOutputLostError(
        f"{where}; shuffle {plan.shuffle_id} was released on executor {status['executor']}, so map "
        f"partition {status['map']} cannot be recomputed any more: run the query again"
    )


def stale_carriers(
    statuses: Sequence[dict[str, Any]], lost: set[tuple[str, int]]
) -> dict[tuple[str, int], list[str]]:
    """The agents (host, control port) of executors that carry status rows naming outputs of the
    owners in ``lost`` (their agent found them missing, or is unreachable), with those owners'
    executor ids. A row is trusted only where its outputs are: one carried elsewhere
    (``carry_function``) outlives its owner's replacement, so the carrier must go too."""
    carriers: dict[tuple[str, int], set[str]] = defaultdict(set)
    for s in statuses:
        carrier = s.get("carrier")
        if not carrier or carrier == s["executor"]:
            continue
        if (str(s["host"]), int(s["control_port"])) in lost:
            carriers[(str(s["carrier_host"]), int(s["carrier_port"]))].add(str(s["executor"]))
    return {address: sorted(owners) for address, owners in carriers.items()}


def _answers(address: tuple[str, int]) -> bool:
    """Does something still accept connections at ``address``?"""
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False


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


def _count(stats: ReadStats, batch: pa.RecordBatch) -> pa.RecordBatch:
    stats.batches += 1
    stats.rows += batch.num_rows
    stats.bytes += batch.nbytes
    return batch


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


# -- what the reduce side does with the batches --------------------------------------------------
def _check_schema(got: pa.Schema, want: pa.Schema, what: str) -> None:
    if got.names != want.names or any(a.type != b.type for a, b in zip(got, want, strict=True)):
        raise SchemaMismatchError(f"{what} returned schema {got}, but the declared schema is {want}")


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
) -> Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Group the reducer's rows in Arrow and call ``func`` once per group (the hot loop: with
    100k groups a microsecond per group is a tenth of a second, so checks are cheap first). Past
    ``memory_bytes`` the rows are grouped a spilled bucket at a time (``reduce_spill``)."""

    def consume(reducer: int, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for bucket in partition_rows(batches, in_schema, key_columns, memory_bytes):
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
