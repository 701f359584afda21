"""The map task of a materialized shuffle, run by Spark in a Python worker.

``df.mapInArrow(map_function(plan))``: route the partition's batches by key into a map-output
file (``map_output``) in this executor's agent directory, then emit one tiny *status row per reduce
partition* (where the file is, its segments and their checksums, bytes/batches/rows). The status
rows travel through Spark's own shuffle on purpose: they are a few bytes per (map, reduce) pair,
and it makes Spark's DAGScheduler the map-output tracker of record (``reduce_task``).

Paths: the shuffle roots are resolved where the task runs (``agent_layout.shuffle_roots``: the
executor's own local dirs, never a path computed on the driver); every id in a map output's name
passes ``check_id``; the map task writes only into one of its agent's folders (spread over the
executor's local dirs) after checking it is private. Spark Connect has no accumulators:
``write_reports`` rebuilds the map tasks' reports from their status rows.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from arrow_shuffle.errors import SchemaMismatchError
from arrow_shuffle.private_files import check_id, check_private_dir
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.agent_layout import shuffle_roots, spread_dir
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.plan import CARRIER_SCHEMA, STATUS_SCHEMA, Report, ShufflePlan
from spark_plugin.shuffle.worker.agent_client import AgentInfo, find_agent


def _task() -> tuple[int, str, int]:
    """``(partition, "stage.taskAttemptId.attemptNumber", stage)`` of the running task.

    PySpark's ``TaskContext`` has no stage attempt number: a reducer tells a recomputed map output
    by its stage id, later than the query's first map stage (``read_partitions``)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, "0.0.0", 0
    return ctx.partitionId(), f"{ctx.stageId()}.{ctx.taskAttemptId()}.{ctx.attemptNumber()}", ctx.stageId()


def attempt_stage(attempt: str) -> int:
    """The stage id in a map attempt as ``_task`` writes it (``stage.taskAttemptId.attemptNumber``)."""
    return int(attempt.split(".", 1)[0])


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
            hot_key_last=plan.hot_key_last,
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
    plan: ShufflePlan, map_stage: int, clock: Clock = SYSTEM_CLOCK
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Stamps persisted status rows with the executor that shuffles them, and with ``map_stage``, the
    stage the map job ran as (``CARRIER_SCHEMA``).

    An adaptive shuffle's status rows are cached where their map task ran, and Spark shuffles a
    cached partition from wherever it reads it: off its owner when the locality wait runs out. The
    rows are then held by an executor that does not hold their files, and replacing the owner
    (lost outputs) leaves them behind, stale, for every retry. Stamped, a reducer that finds the
    outputs lost tells the carrier too (``lost_outputs``), whose replacement is the fetch failure
    that has Spark recompute them.

    The map stage is what tells a reduce task which outputs a recomputation wrote: from its rows
    alone it cannot, when every row it receives was recomputed (owner and carrier both replaced)."""

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
                pa.array([map_stage] * n, pa.int64()),
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
                "stage": attempt_stage(key[1]),
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


# -- what the reduce side does with the batches --------------------------------------------------
def _check_schema(got: pa.Schema, want: pa.Schema, what: str) -> None:
    if got.names != want.names or any(a.type != b.type for a, b in zip(got, want, strict=True)):
        raise SchemaMismatchError(f"{what} returned schema {got}, but the declared schema is {want}")
