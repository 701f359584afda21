"""The driver's one sink for ``shuffle_metrics`` rows: one queue, one writer, one exit hook.

Two kinds of rows reach the table from the user's driver process. A released shuffle's rows are
written while ``release()`` waits (``write_now``: the caller sees its rows on the table when the
call returns, or the error). A call routed to Spark's exchange records one row it must not wait
for (``enqueue``): a background writer appends what is queued every ``BATCH_S`` seconds in one
commit per tables location (a Delta commit per call would cost each small call, routed to Spark
to save a fraction of a second, a commit's CPU, and grow the table's log by a file per call).
The background writer's flushes take one lock, so they never overlap each other.

Rows whose table cannot be written (a missing bucket, a full disk) stay queued, in order, and
are retried by the next flush, within ``MAX_PENDING`` entries (the oldest are dropped and
counted, so an application whose tables stay unwritable for days keeps a bounded queue). At
interpreter exit one hook runs what the driver registered (``at_exit``: the metrics of shuffles
never released), then writes everything still queued. Nothing here ever fails a user's call.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_plugin.history.storage import locate, tables_root
from spark_plugin.settings.config import from_spark_conf
from spark_plugin.shuffle.driver.session import as_view, conf_entries

log = logging.getLogger("arrowbeat.shuffle")

BATCH_S = 5.0
"""Queued rows are appended in one commit per this many seconds (or by ``flush``)."""

MAX_PENDING = 10_000
"""Queued entries (one shuffle's rows each) kept while their table cannot be written."""


@dataclass(frozen=True)
class Destination:
    """Where an application's rows go: its tables location and the retention its tables keep
    (``spark.arrowbeat.tables.path`` and ``.retention`` as its session sees them)."""

    tables: Any
    """A ``Path``, or a located URI (``spark_plugin.history.storage.TablesLocation``)."""
    retention_s: float


_destinations: dict[str, Destination] = {}
"""A classic application's destination by its id: its ``SparkConf`` does not change while it
runs (a Spark Connect session's conf may, so it is read each time)."""


def destination(session: Any, app: str) -> Destination:
    """The application's destination as this session sees it (on Spark Connect, without the conf
    entries Spark withholds from clients, e.g. cloud credentials); classic: read once per
    application (a copy of the whole conf costs tens of milliseconds)."""
    view = as_view(session)
    found = None if view.connect else _destinations.get(app)
    if found is None:
        entries = conf_entries(view)
        config = from_spark_conf(entries)
        root = tables_root(config, dict(entries))
        tables = root if isinstance(root, Path) else locate(root, dict(entries))
        found = Destination(tables, config.tables_retention_s)
        if not view.connect:
            _destinations[app] = found
    return found


@dataclass
class Pending:
    """Rows of one shuffle, waiting for the writer."""

    destination: Destination
    """Where they go, resolved when they were recorded: the session may be gone when written."""
    app: str
    shuffle_id: int
    rows: list[dict[str, Any]]


_pending: list[Pending] = []
_pending_lock = threading.Lock()
_failing: set[str] = set()
"""Tables locations whose last append failed: logged once when it starts failing, once when it
writes again, not at every retry."""
dropped = 0
"""Entries dropped since the driver started: queued past ``MAX_PENDING``."""
_write_lock = threading.Lock()
_writer: threading.Thread | None = None
_wake = threading.Event()
_exit_callbacks: list[Callable[[], None]] = []


def write_now(to: Destination, app: str, shuffle_id: int, rows: Sequence[dict[str, Any]]) -> None:
    """Append one shuffle's rows now, as one commit; raises what the write raised. Not behind the
    background writer's lock: a flush retrying a slow or failing location must not hold up a
    ``release()`` (Delta's optimistic commits keep concurrent appends apart)."""
    from spark_plugin.history.shuffle_metrics import append_batches

    append_batches(to.tables, [(app, shuffle_id, list(rows))], retention_s=to.retention_s)


def enqueue(to: Destination, app: str, shuffle_id: int, rows: Sequence[dict[str, Any]]) -> None:
    """Queue one shuffle's rows for the background writer (started if none runs)."""
    global _writer
    with _pending_lock:
        _pending.append(Pending(to, app, shuffle_id, list(rows)))
        if _writer is None or not _writer.is_alive():
            _writer = threading.Thread(target=_write_in_batches, name="arrowbeat-metrics-rows", daemon=True)
            _writer.start()


def _write_in_batches() -> None:
    """The background writer: every ``BATCH_S`` (or when woken), what is queued; it ends once
    nothing is (the next ``enqueue`` starts another). Rows whose table could not be written are
    queued again, so it runs on until they are written."""
    while True:
        _wake.wait(BATCH_S)
        _wake.clear()
        flush()
        with _pending_lock:
            if not _pending:
                return


def flush() -> int:
    """Append every queued row now, one commit per tables location; returns rows written. A
    failure never reaches the caller: the rows are queued again (in their order, ahead of newer
    ones) for the next flush, within ``MAX_PENDING``."""
    from spark_plugin.history.shuffle_metrics import append_batches

    written = 0
    with _write_lock:
        with _pending_lock:
            batch = list(_pending)
            _pending.clear()
        by_location: dict[str, list[Pending]] = {}
        for item in batch:
            by_location.setdefault(repr(item.destination), []).append(item)
        unwritten: list[Pending] = []
        for where, items in by_location.items():
            try:
                to = items[0].destination
                append_batches(
                    to.tables, [(i.app, i.shuffle_id, i.rows) for i in items], retention_s=to.retention_s
                )
            except Exception as exc:
                unwritten += items
                if where not in _failing:
                    _failing.add(where)
                    log.warning("shuffle_metrics rows not written, kept to retry: %s", exc)
                continue
            written += sum(len(i.rows) for i in items)
            if where in _failing:
                _failing.discard(where)
                log.info("shuffle_metrics rows written again (%d)", sum(len(i.rows) for i in items))
        if unwritten:
            _requeue(unwritten)
    return written


def _requeue(unwritten: list[Pending]) -> None:
    """Puts entries that could not be written back ahead of the ones queued since, keeping the
    newest ``MAX_PENDING``."""
    global dropped
    with _pending_lock:
        _pending[:0] = unwritten
        over = len(_pending) - MAX_PENDING
        if over > 0:
            del _pending[:over]
            dropped += over
            log.warning("shuffle_metrics: %d queued entries dropped (queue full: %d)", over, MAX_PENDING)


def at_exit(callback: Callable[[], None]) -> Callable[[], None]:
    """Run ``callback`` at interpreter exit, before the last flush (usable as a decorator)."""
    _exit_callbacks.append(callback)
    return callback


def _at_exit() -> None:
    for callback in _exit_callbacks:
        try:
            callback()
        except Exception as exc:  # best effort: the session may be gone
            log.debug("shuffle_metrics at exit: %s", exc)
    flush()


atexit.register(_at_exit)
