"""The Delta tables arrowbeat keeps, their schemas, and opening them safely.

The ResourceManager runs outside the user's Spark session, so it writes with delta-rs
(``deltalake``): writing never launches a job inside the user's application. Any delta-spark
reader (batch SQL or Structured Streaming) reads the tables; ``tests/spark`` checks that.

Schemas (one row per heartbeat received / per lifecycle event):

``heartbeats``: app_id, executor_id, host, instance_id, ts (UTC timestamp), rtt_ms, gap_ms (time
since the previous heartbeat of the same executor, null for its first; the RM sees each executor's
heartbeats in order, a streaming query cannot), jvm_pulse_age_ms, slots_total, slots_busy,
running_tasks, rss_bytes, gc_ms (the executor JVM's garbage-collection time since the previous
heartbeat, null when unknown).

``executor_events``: app_id, executor_id, host, instance_id, ts, event (REGISTERED, REREGISTERED,
HEARTBEAT_TIMEOUT, UNREACHABLE, UNREGISTERED; Spark's view: SPARK_REMOVED, SPARK_LOST,
UNMONITORED; tasks: TASK_STUCK, TASK_RESUMED; the agent's findings: SHUFFLE_CORRUPT, a damaged
map output of its own, the detail naming the shuffle, map partition and file; compared with its
peers: DEGRADED, consistently slower, the detail giving the signal, how far from the peers and
since when, and RECOVERED, back in line (``monitoring.driver_degraded``); the RM's own:
MONITORING_GAP, an interval without history after the RM was restarted, ``history.gaps``), detail.

A table written by an older arrowbeat that lacks only columns added since (nullable, at the end)
gets them added when opened; any other difference is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from heartbeat import one_line

# Raised here; declared in the package's one exception tree (spark_plugin.errors).
from spark_plugin.errors import HistoryTableError as HistoryTableError
from spark_plugin.errors import IncompatibleTableError as IncompatibleTableError
from spark_plugin.errors import TablePathError as TablePathError
from spark_plugin.history.storage import TablesLocation, locate
from spark_plugin.history.wire_text import MAX_ERROR_CHARS
from spark_plugin.settings.config import declared_default

TS = pa.timestamp("us", tz="UTC")

DEFAULT_RETENTION_S: float = declared_default("spark.arrowbeat.tables.retention")


def table_properties(retention_s: float = DEFAULT_RETENTION_S) -> dict[str, str]:
    """Keep the log and removed files for ``retention_s``: compaction and vacuum then bound the
    file count of a long application to about that long's commits; a streaming reader may lag
    at most that long."""
    interval = f"interval {max(1, round(retention_s))} seconds"
    return {
        "delta.logRetentionDuration": interval,
        "delta.deletedFileRetentionDuration": interval,
        "delta.checkpointInterval": "20",
    }


@dataclass(frozen=True)
class TableSpec:
    name: str
    schema: pa.Schema


#: Leading columns of both monitoring tables: which executor instance, of which application, when.
_WHO_AND_WHEN = [
    ("app_id", pa.string()),
    ("executor_id", pa.string()),
    ("host", pa.string()),
    ("instance_id", pa.string()),
    ("ts", TS),
]

HEARTBEATS = TableSpec(
    "heartbeats",
    pa.schema(
        [
            *_WHO_AND_WHEN,
            ("rtt_ms", pa.float64()),
            ("gap_ms", pa.float64()),
            ("jvm_pulse_age_ms", pa.int64()),
            ("slots_total", pa.int64()),
            ("slots_busy", pa.int64()),
            ("running_tasks", pa.int64()),
            ("rss_bytes", pa.int64()),
            ("gc_ms", pa.float64()),  # added in 0.2: older tables get it when opened
        ]
    ),
)

EXECUTOR_EVENTS = TableSpec(
    "executor_events",
    pa.schema(
        [
            *_WHO_AND_WHEN,
            ("event", pa.string()),
            ("detail", pa.string()),
        ]
    ),
)

SHUFFLE_METRICS = TableSpec(
    "shuffle_metrics",
    pa.schema(
        [
            ("app_id", pa.string()),
            ("shuffle_id", pa.int64()),
            ("ts", TS),
            ("side", pa.string()),
            ("partition", pa.int64()),
            ("attempt", pa.string()),
            ("executor_id", pa.string()),
            ("bytes", pa.int64()),
            ("batches", pa.int64()),
            ("rows", pa.int64()),
            ("spill_bytes", pa.int64()),
            ("blocked_on_credit_s", pa.float64()),
            ("seconds", pa.float64()),
            ("recomputed", pa.bool_()),
            ("detail", pa.string()),
            ("corrupt", pa.bool_()),  # added with checksums (issue 36): older tables get it when opened
        ]
    ),
)
"""Written by the application's driver process (``spark_plugin.history.shuffle_metrics``), not the RM, so it
is not in :data:`TABLES`: one row per map task (side ``write``: partition = map partition) and per
reduce partition read (side ``read``), successful task attempts only. ``recomputed`` marks a map
partition written again by a retried stage (executor loss, a damaged output) and a read that used
such outputs; ``corrupt`` marks a map partition written again because a reader found its first
output damaged (the detail names the executor, the file and what was found)."""

TABLES: tuple[TableSpec, ...] = (HEARTBEATS, EXECUTOR_EVENTS)

_WHO_AND_WHEN_DOCS = {
    "app_id": "Spark's application id",
    "executor_id": "Spark's executor id (empty for an event about the RM itself, `MONITORING_GAP`)",
    "host": "the executor's host, as its agent registered it",
    "instance_id": "the agent's registration (new per registration: a re-registered executor gets a new one)",
}
COLUMN_DOCS: dict[str, dict[str, str]] = {
    HEARTBEATS.name: {
        **_WHO_AND_WHEN_DOCS,
        "ts": "when the RM received the heartbeat (UTC)",
        "rtt_ms": "the heartbeat's round trip, on the RM's clock",
        "gap_ms": "time since the executor's previous heartbeat (null for its first); the RM sees each "
        "executor's heartbeats in order, a streaming query cannot",
        "jvm_pulse_age_ms": "how long ago the executor JVM last pulsed its agent",
        "slots_total": "the executor's task slots",
        "slots_busy": "slots running a task",
        "running_tasks": "tasks running on the executor",
        "rss_bytes": "resident memory of the executor JVM",
        "gc_ms": "the JVM's garbage-collection time since the previous heartbeat (null when unknown)",
    },
    EXECUTOR_EVENTS.name: {
        **_WHO_AND_WHEN_DOCS,
        "ts": "when the event happened (UTC)",
        "event": "the event's kind (the list below)",
        "detail": "what the event's kind says more: a cause, a stack, the evidence of a gap",
    },
    SHUFFLE_METRICS.name: {
        "app_id": "Spark's application id",
        "shuffle_id": "arrowbeat's shuffle id",
        "ts": "when the driver appended the row (UTC)",
        "side": "`write` (a map task: partition = map partition), `read` (a reduce partition read) or "
        "`route` (an exchange decision: bytes = the optimizer's estimate, -1 for none)",
        "partition": "the map or reduce partition",
        "attempt": "the task attempt that reported it (successful attempts only)",
        "executor_id": "the executor that ran the task",
        "bytes": "Arrow IPC bytes written or read",
        "batches": "record batches written or read",
        "rows": "rows written or read",
        "spill_bytes": "bytes the task spilled to its local dirs",
        "blocked_on_credit_s": "time the reader waited for credit (backpressure)",
        "seconds": "the task's time in the shuffle",
        "recomputed": "a map partition written again by a retried stage (executor loss, a damaged "
        "output), or a read that used such outputs",
        "detail": "JSON: recomputed maps, a coalesced task's reducers, a damaged output's finding, a "
        "route's path, reason and threshold (null when none)",
        "corrupt": "a map partition written again because a reader found its first output damaged",
    },
}
"""What each column holds, per table (the documentation site's schema pages are generated from the
specs above and these; a test keeps them covering every column)."""


def _fields(schema: pa.Schema) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in schema}


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    # delta-rs may hand back large/view string variants of what we wrote.
    strings = {pa.string(), pa.large_string(), pa.string_view()}
    return a == b or (a in strings and b in strings)


def open_table(
    root: TablesLocation | Path | str, spec: TableSpec, retention_s: float = DEFAULT_RETENTION_S
) -> str:
    """Creates ``<root>/<name>`` as a Delta table, or checks an existing one (and sets its
    retention); returns the table's URI as delta-rs opens it (with ``locate(root).options()``)."""
    location = locate(root)
    if location.local is None:
        return _open_remote(location, spec, retention_s)
    from deltalake import DeltaTable

    path = location.local / spec.name
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".arrowbeat-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise TablePathError(f"cannot write the arrowbeat table path {path}: {exc.strerror or exc}") from exc
    if not (path / "_delta_log").is_dir():
        if any(p for p in path.iterdir() if not p.name.startswith(".")):
            raise TablePathError(
                f"{path} is not empty and is not a Delta table: choose another spark.arrowbeat.tables.path"
            )
        DeltaTable.create(
            str(path), schema=spec.schema, mode="ignore", configuration=table_properties(retention_s)
        )
        return str(path)
    try:
        table = DeltaTable(str(path))
        existing = table.schema().to_arrow()
    except Exception as exc:  # delta-rs raises several unrelated types for a damaged log
        raise TablePathError(f"{path} holds a corrupt Delta table ({exc}): repair or move it") from exc
    _check_schema(table, existing, str(path), spec, retention_s)
    return str(path)


def _open_remote(location: TablesLocation, spec: TableSpec, retention_s: float) -> str:
    """:func:`open_table` on an object store or HDFS: no directory to probe, and every message
    scrubbed of the location's credentials (the delta-rs error is not chained: it may quote them)."""
    from deltalake import DeltaTable

    uri, shown, options = location.table_uri(spec.name), location.spark_uri(spec.name), location.options()
    try:
        # Created unless one is there (then a no-op); not ``is_deltatable``, whose S3 requests
        # never leave the process in deltalake 1.6 (they time out).
        DeltaTable.create(
            uri,
            schema=spec.schema,
            mode="ignore",
            configuration=table_properties(retention_s),
            storage_options=options,
        )
        table = DeltaTable(uri, storage_options=options)
        existing = table.schema().to_arrow()
    except Exception as exc:  # credentials, endpoint, bucket, network: delta-rs's many error types
        why = one_line(location.scrub(exc), MAX_ERROR_CHARS, reflow=True)
        raise TablePathError(
            f"cannot open or create the arrowbeat table {shown} (spark.arrowbeat.tables.path, with the "
            f"application's spark.hadoop.* credentials): {why}"
        ) from None
    _check_schema(table, existing, shown, spec, retention_s)
    return uri


def _check_schema(table: Any, existing: Any, shown: str, spec: TableSpec, retention_s: float) -> None:
    """Refuses a table with another schema; sets the table's retention if it changed."""
    have = _fields(pa.schema(existing))
    want = _fields(spec.schema)
    newer = [n for n in list(want)[len(have) :] if n not in have and list(have) == list(want)[: len(have)]]
    if newer:  # an older arrowbeat's table: the columns added since (nullable, at the end) are added
        from deltalake.schema import Field

        try:
            table.alter.add_columns([Field.from_arrow(spec.schema.field(n)) for n in newer])
        except Exception as exc:  # another driver may have added them a moment ago: look again
            table.update_incremental()
            if any(n not in _fields(pa.schema(table.schema().to_arrow())) for n in newer):
                raise IncompatibleTableError(
                    f"cannot add columns {newer} to the Delta table at {shown}: {exc}"
                ) from None
        have = _fields(pa.schema(table.schema().to_arrow()))
    wrong = [n for n, t in want.items() if n not in have or not _same_type(have[n], t)]
    extra = [n for n in have if n not in want]
    if wrong or extra:
        raise IncompatibleTableError(
            f"the Delta table at {shown} does not have arrowbeat's {spec.name} schema "
            f"(missing or different: {wrong or 'none'}; unexpected: {extra or 'none'}); arrowbeat will "
            "not write into it: point spark.arrowbeat.tables.path elsewhere"
        )
    wanted = table_properties(retention_s)
    if any(table.metadata().configuration.get(k) != v for k, v in wanted.items()):
        table.alter.set_table_properties(wanted)  # a restart with another retention setting
