"""Batched, durable appends of heartbeats and lifecycle events to the Delta history tables.

Subscribers hand rows to :meth:`HistoryWriter.append` from RM threads; it only buffers. A flusher
thread commits each table at most once per flush interval, so readers see rows within about one
interval and the log grows by one commit per interval, not per heartbeat. Whether a flush (and a
maintenance round) is due is decided by :meth:`HistoryWriter.run_due` on the injected
``arrowbeat_base.clock.Clock``'s ``monotonic()``, so tests drive it with a ``ManualClock``.

A failed commit is retried and its rows stay buffered (bounded: past ``max_buffered_rows`` the
oldest are dropped and counted), so a table that is briefly unavailable loses nothing. Each
commit carries a Delta application transaction (this writer's id, a per-table batch number): a
retry first asks the table whether the failed attempt landed after all, so a retried batch is
never written twice. Periodic maintenance compacts small files, checkpoints the log and vacuums
what retention allows, which bounds the file count of a day-long application. It also maintains
``shuffle_metrics``, which the application's driver appends to (one commit per released shuffle)
and nothing else compacts: without it, each append loads a table one file larger than the last
(a streaming query's driver grew 25 MiB and twice as slow per append over 1,000 shuffles).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.history.storage import TablesLocation, locate
from spark_plugin.history.tables import (
    DEFAULT_RETENTION_S,
    EXECUTOR_EVENTS,
    HEARTBEATS,
    SHUFFLE_METRICS,
    TABLES,
    TableSpec,
    open_table,
)
from spark_plugin.history.wire_text import MAX_DETAIL_CHARS, MAX_ID_CHARS, wire_text
from spark_plugin.settings.config import declared_default

log = logging.getLogger("arrowbeat.history")

DEFAULT_COMPACT_INTERVAL_S: float = declared_default("spark.arrowbeat.tables.compactInterval")

Row = dict[str, Any]


@dataclass
class _Pending:
    spec: TableSpec
    path: str
    rows: deque[Row]
    dropped: int = 0
    rejected: int = 0
    commits: int = 0
    failures: int = 0
    """Batches whose commit failed every attempt (their rows stayed buffered)."""
    batch: int = 0
    """Number of the next batch; committed batch numbers are in the table's transaction log."""


class HistoryWriter:
    """Appends rows to the history tables under ``root`` in batches, from one flusher thread.

    ``root`` is a directory, or a :class:`TablesLocation` (``storage.tables_location``) that
    carries an object store's URI and credentials; a bare URI string gets no credentials."""

    def __init__(
        self,
        root: TablesLocation | Path | str,
        flush_interval_s: float,
        compact_interval_s: float = DEFAULT_COMPACT_INTERVAL_S,
        retention_s: float = DEFAULT_RETENTION_S,
        max_buffered_rows: int = 200_000,
        commit_attempts: int = 5,
        clock: Clock = SYSTEM_CLOCK,
        maintained: tuple[TableSpec, ...] = (SHUFFLE_METRICS,),
    ) -> None:
        self.root = root
        self._maintained = tuple(spec for spec in maintained if spec not in TABLES)
        """Tables under ``root`` another process appends to, which this writer only maintains."""
        self.location = locate(root)
        self._options = self.location.options()
        self._flush_interval_s = flush_interval_s
        self._compact_interval_s = compact_interval_s
        self._retention_s = retention_s
        self._max_rows = max_buffered_rows
        self._attempts = commit_attempts
        self._clock = clock
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._tables: dict[str, _Pending] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_flush = clock.monotonic() + flush_interval_s
        self._last_maintenance = clock.monotonic()
        self.writer_id = f"arrowbeat-history-{uuid.uuid4().hex}"
        """Delta application-transaction id of this writer's commits (new per process)."""
        self._complete_until = clock.time()
        self._in_flight = 0

    def open(self) -> None:
        """Creates or checks every table; raises :class:`HistoryTableError` naming the path."""
        for spec in TABLES:
            path = open_table(self.location, spec, self._retention_s)
            self._tables[spec.name] = _Pending(spec, path, deque())

    def start(self) -> None:
        """Starts the flusher thread: the first flush is due one interval from now."""
        self._next_flush = self._clock.monotonic() + self._flush_interval_s
        self._thread = threading.Thread(target=self._run, name="history-flusher", daemon=True)
        self._thread.start()

    def append(self, table: str, row: Row) -> None:
        """Buffers one row for ``table``; never blocks on I/O."""
        with self._lock:
            pending = self._tables[table]
            pending.rows.append(row)
            if len(pending.rows) > self._max_rows:
                pending.rows.popleft()
                pending.dropped += 1

    def buffered(self, table: str) -> int:
        with self._lock:
            return len(self._tables[table].rows)

    def _run(self) -> None:
        wait_s = self._flush_interval_s
        while not self._stop.wait(wait_s):
            try:
                wait_s = self.run_due()
            except Exception as exc:  # keep flushing: one bad cycle must not end history
                if self.location.secrets():  # no traceback: delta-rs's text may quote credentials
                    log.error("history flush failed; rows stay buffered: %s", self.location.scrub(exc))
                else:
                    log.exception("history flush failed; rows stay buffered")
                wait_s = self._flush_interval_s

    def run_due(self) -> float:
        """One turn of the flusher: flushes every table if a flush interval has passed since the
        last flush (or :meth:`start`), then maintains them if a compaction interval has passed
        since the last maintenance; returns the seconds until the next flush is due."""
        if self._clock.monotonic() >= self._next_flush:
            self.flush()
            now = self._clock.monotonic()
            self._next_flush = now + self._flush_interval_s
            if now - self._last_maintenance >= self._compact_interval_s:
                self._last_maintenance = now
                self.maintain()
        return max(0.0, self._next_flush - self._clock.monotonic())

    def flush(self) -> None:
        """Commits every table's buffered rows (one commit per table); failed rows stay buffered.
        When every table committed, history is complete up to this flush's start
        (:meth:`complete_until`)."""
        with self._flush_lock:
            started = self._clock.time()
            committed = [self._flush_table(pending) for pending in self._tables.values()]
            if all(committed):
                with self._lock:
                    self._complete_until = max(self._complete_until, started)

    def complete_until(self) -> float:
        """Wall-clock time before which every appended row is committed (or was rejected or
        dropped, and counted): the writer's creation, then the start of the last flush in which
        every table committed. A restarted RM's gap starts here (``history.gaps``)."""
        with self._lock:
            return self._complete_until

    def unsaved_rows(self) -> int:
        """Rows appended and not committed yet: buffered, or in a commit under way."""
        with self._lock:
            return self._in_flight + sum(len(p.rows) for p in self._tables.values())

    def _flush_table(self, pending: _Pending) -> bool:
        """True once the rows taken are committed (or there were none); False if they went back."""
        with self._lock:
            rows = list(pending.rows)
            pending.rows.clear()
            self._in_flight = len(rows)
        try:
            return self._commit(pending, rows)
        finally:
            with self._lock:
                self._in_flight = 0

    def _commit(self, pending: _Pending, rows: list[Row]) -> bool:
        from deltalake import CommitProperties, Transaction, write_deltalake

        if not rows:
            return True
        batch = self._to_table(pending, rows)
        if batch.num_rows == 0:
            return True
        delay = 0.05
        pending.batch += 1
        marker = CommitProperties(app_transactions=[Transaction(self.writer_id, pending.batch)])
        for attempt in range(1, self._attempts + 1):
            try:
                write_deltalake(
                    pending.path,
                    batch,
                    mode="append",
                    commit_properties=marker,
                    storage_options=self._options,
                )
                pending.commits += 1
                return True
            except Exception as exc:  # commit conflicts, I/O errors: retry, then keep the rows
                if self._landed(pending):
                    log.info(
                        "batch %d of %s landed although its commit raised (%s)",
                        pending.batch,
                        pending.path,
                        self.location.scrub(exc),
                    )
                    pending.commits += 1
                    return True
                if attempt == self._attempts:
                    log.warning(
                        "could not append %d rows to %s after %d attempts (%s); keeping them buffered",
                        len(rows),
                        pending.path,
                        attempt,
                        self.location.scrub(exc),
                    )
                    pending.failures += 1
                    break
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        with self._lock:  # a later flush retries these rows as a new batch
            pending.rows.extendleft(reversed(rows))
            self._in_flight = 0
            while len(pending.rows) > self._max_rows:
                pending.rows.popleft()
                pending.dropped += 1
        return False

    def _landed(self, pending: _Pending) -> bool:
        """Did this writer's current batch of ``pending`` commit although the call raised?
        False when the table cannot tell (then the batch is retried)."""
        from deltalake import DeltaTable

        try:
            version = DeltaTable(pending.path, storage_options=self._options).transaction_version(
                self.writer_id
            )
        except Exception:
            return False
        return version is not None and version >= pending.batch

    def _to_table(self, pending: _Pending, rows: list[Row]) -> pa.Table:
        """The rows as an Arrow table; rows that do not fit the schema are rejected and counted."""
        schema = pending.spec.schema
        try:
            return pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowException, TypeError, ValueError, KeyError):
            good = []
            for row in rows:
                try:
                    pa.Table.from_pylist([row], schema=schema)
                    good.append(row)
                except (pa.ArrowException, TypeError, ValueError, KeyError) as exc:
                    pending.rejected += 1
                    log.error(
                        "rejected a %s row that does not fit its schema (%s): %r", pending.spec.name, exc, row
                    )
            return pa.Table.from_pylist(good, schema=schema)

    def maintain(self) -> None:
        """Compacts small files, checkpoints, and removes what the tables' retention allows: this
        writer's tables, and each of ``maintained`` once it exists (``shuffle_metrics`` is made by
        the first released shuffle). An append by another process meanwhile is not a conflict."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        with self._flush_lock:
            paths = [pending.path for pending in self._tables.values()]
            paths += [self.location.table_uri(spec.name) for spec in self._maintained]
            for path in paths:
                try:
                    table = DeltaTable(path, storage_options=self._options)
                except TableNotFoundError:
                    continue  # not made yet
                except Exception as exc:
                    log.info("maintenance of %s skipped this round: %s", path, self.location.scrub(exc))
                    continue
                try:
                    table.optimize.compact()
                    table = DeltaTable(path, storage_options=self._options)
                    table.create_checkpoint()
                    table.cleanup_metadata()
                    # full: also the files whose tombstones a checkpoint already dropped (every
                    # checkpoint, the writes' automatic ones included, leaves out expired tombstones,
                    # and the commits that held them are then cleaned up); the table's retention
                    # still protects files younger than it, a concurrent writer's uncommitted ones too
                    table.vacuum(dry_run=False, full=True)
                except Exception as exc:  # a concurrent writer or reader may win; try next time
                    log.info("maintenance of %s skipped this round: %s", path, self.location.scrub(exc))

    def stats(self) -> Mapping[str, Mapping[str, int]]:
        with self._lock:
            return {
                name: {
                    "buffered": len(p.rows),
                    "dropped": p.dropped,
                    "rejected": p.rejected,
                    "commits": p.commits,
                    "failures": p.failures,
                }
                for name, p in self._tables.items()
            }

    def stop(self) -> None:
        """Stops the flusher and commits what is buffered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._tables:
            self.flush()


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC)


def heartbeat_row(app_id: str, record: Any, gap_ms: float | None, gc_ms: float | None = None) -> Row:
    """A ``heartbeats`` row from a :class:`heartbeat.HeartbeatRecord`; ``gc_ms``: the JVM's GC time
    since the previous heartbeat (``task_events.TaskEvents.on_heartbeat``)."""
    payload = record.payload
    return {
        "app_id": app_id,
        "executor_id": wire_text(record.executor_id, MAX_ID_CHARS),
        "host": wire_text(record.host, MAX_ID_CHARS),
        "instance_id": wire_text(record.instance_id, MAX_ID_CHARS),
        "ts": utc(record.ts),
        "rtt_ms": float(record.rtt_ms),
        "gap_ms": gap_ms,
        "jvm_pulse_age_ms": _int(payload, "jvm_pulse_age_ms"),
        "slots_total": _int(payload, "slots_total"),
        "slots_busy": _int(payload, "slots_busy"),
        "running_tasks": _int(payload, "running_tasks"),
        "rss_bytes": _int(payload, "rss_bytes"),
        "gc_ms": gc_ms,
    }


def event_row(app_id: str, event: Any) -> Row:
    """An ``executor_events`` row from a :class:`heartbeat.ExecutorEvent`; every text that came
    from the wire (ids, host, detail) passes :func:`wire_text` first."""
    kind = event.kind
    return {
        "app_id": app_id,
        "executor_id": wire_text(event.executor_id, MAX_ID_CHARS),
        "host": wire_text(event.host, MAX_ID_CHARS),
        "instance_id": wire_text(event.instance_id, MAX_ID_CHARS),
        "ts": utc(event.ts),
        "event": wire_text(getattr(kind, "name", str(kind)), MAX_ID_CHARS),
        "detail": None if event.detail is None else wire_text(event.detail, MAX_DETAIL_CHARS),
    }


def _int(payload: Any, name: str) -> int | None:
    """A non-negative int64 payload value, else None (a peer's payload is not trusted to fit)."""
    value = payload.get(name) if isinstance(payload, Mapping) else getattr(payload, name, None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 2**63:
        return None
    return int(value)


__all__ = ["EXECUTOR_EVENTS", "HEARTBEATS", "HistoryWriter", "event_row", "heartbeat_row"]
