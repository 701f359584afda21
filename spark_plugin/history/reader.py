"""Reading the history tables back (``arrowbeat events|tables|report``, the live page's order of
executors): delta-rs, no Spark session, so an operator's laptop reads what a cluster wrote.

:func:`open_history_table` opens one table under a located root, :func:`read_rows` reads an
application's rows in time order, :func:`resolve_app` turns an ``--app`` value (or :data:`LATEST`)
into an application the tables hold, and :func:`load_history` gathers everything one application
recorded (heartbeats, lifecycle events, shuffle metrics) per executor for the report, with the
intervals the RM kept no history (``MONITORING_GAP``, ``history.gaps``) apart. A process
that read them ends through :func:`run_reader` or ``arrowbeat_base.hard_exit.exit_now`` (the CLI, the
benchmarks, the demo job): delta-rs's readers can abort a normal interpreter exit. Every text
that came from the wire (ids, hosts) passes ``wire_text``; a storage error is one line, scrubbed
of the location's credentials.

Errors are the plugin's tree (``spark_plugin.errors``): a missing or unreadable table is a
:class:`TablePathError`, an application the tables do not hold an :class:`UnknownApplicationError`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from arrowbeat_base.hard_exit import exit_now
from heartbeat import one_line
from spark_plugin.errors import TablePathError, UnknownApplicationError
from spark_plugin.history.gaps import KIND as GAP_KIND
from spark_plugin.history.gaps import MonitoringGap, parse_gap
from spark_plugin.history.storage import TablesLocation, locate
from spark_plugin.history.tables import EXECUTOR_EVENTS, HEARTBEATS, SHUFFLE_METRICS
from spark_plugin.history.wire_text import MAX_ERROR_CHARS, MAX_ID_CHARS, wire_text

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

LATEST = "latest"
"""The ``--app`` value that names the application that started last in the tables."""


def open_history_table(location: TablesLocation, name: str) -> DeltaTable:
    """The table ``name`` under ``location``; :class:`TablePathError` saying where it was looked
    for when there is none (or it cannot be read), with any credential scrubbed."""
    from deltalake import DeltaTable

    shown = location.spark_uri(name)
    missing = TablePathError(
        f"no Delta table {shown}: is {location} the application's spark.arrowbeat.tables.path "
        "(by default <spark.sql.warehouse.dir>/arrowbeat)?"
    )
    if location.local is not None and not (location.local / name / "_delta_log").is_dir():
        raise missing
    try:
        return DeltaTable(location.table_uri(name), storage_options=location.options())
    except Exception as exc:  # delta-rs: TableNotFoundError, object-store and log errors
        if type(exc).__name__ == "TableNotFoundError":
            raise missing from None
        raise TablePathError(
            f"cannot read {shown}: {one_line(location.scrub(exc), MAX_ERROR_CHARS, reflow=True)}"
        ) from None


def has_table(location: TablesLocation, name: str) -> bool:
    """Whether ``name`` exists (and opens) under ``location``."""
    try:
        open_history_table(location, name)
    except TablePathError:
        return False
    return True


def read_rows(
    table: DeltaTable, location: TablesLocation, app_id: str | None, columns: Sequence[str] | None = None
) -> pa.Table:
    """The table's rows (of ``app_id`` if given), sorted by ``ts``."""
    filters: Any = None if app_id is None else [("app_id", "=", app_id)]
    try:
        rows = table.to_pyarrow_table(columns=None if columns is None else list(columns), filters=filters)
    except Exception as exc:
        raise TablePathError(
            f"cannot read {table.table_uri}: {one_line(location.scrub(exc), MAX_ERROR_CHARS, reflow=True)}"
        ) from None
    return rows.sort_by([("ts", "ascending")]) if "ts" in rows.column_names else rows


def applications(location: TablesLocation) -> list[tuple[str, dt.datetime]]:
    """Every application in ``executor_events`` with its first event's time, latest first."""
    events = read_rows(open_history_table(location, EXECUTOR_EVENTS.name), location, None, ["app_id", "ts"])
    if events.num_rows == 0:
        return []
    firsts = events.group_by("app_id").aggregate([("ts", "min")]).to_pylist()
    found = [(str(r["app_id"]), r["ts_min"]) for r in firsts if r["app_id"] is not None]
    return sorted(found, key=lambda item: item[1], reverse=True)


def resolve_app(location: TablesLocation, app: str) -> str:
    """``app`` itself if the tables hold it, the latest application for :data:`LATEST`; else
    :class:`UnknownApplicationError` listing (a few of) the applications they hold."""
    apps = applications(location)
    if app == LATEST and apps:
        return apps[0][0]
    if any(a == app for a, _ in apps):
        return app
    if app != LATEST and has_table(location, HEARTBEATS.name):  # heartbeats but no event: unusual
        beats = read_rows(open_history_table(location, HEARTBEATS.name), location, app, ["app_id"])
        if beats.num_rows:
            return app
    where = location.spark_uri(EXECUTOR_EVENTS.name)
    if not apps:
        raise UnknownApplicationError(f"{where} holds no application yet")
    listed = ", ".join(f"{wire_text(a, MAX_ID_CHARS)} (from {t:%Y-%m-%d %H:%M:%S}Z)" for a, t in apps[:8])
    more = f" and {len(apps) - 8} more" if len(apps) > 8 else ""
    raise UnknownApplicationError(
        f"no application {wire_text(app, MAX_ID_CHARS)!r} in {where}; it holds (latest first): "
        f"{listed}{more}; or pass --app {LATEST}"
    )


@dataclass
class ExecutorHistory:
    """One executor's heartbeats and events, and what the summary table shows of them."""

    executor_id: str
    hosts: list[str] = field(default_factory=list)
    instances: set[str] = field(default_factory=set)
    beat_ts: list[dt.datetime] = field(default_factory=list)
    rtt_ms: list[float] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def first_seen(self) -> dt.datetime | None:
        times = self.beat_ts[:1] + [e["ts"] for e in self.events[:1]]
        return min(times) if times else None

    @property
    def last_seen(self) -> dt.datetime | None:
        times = self.beat_ts[-1:] + [e["ts"] for e in self.events[-1:]]
        return max(times) if times else None

    def gaps(self) -> list[tuple[dt.datetime, float]]:
        """(time of a heartbeat, seconds since the previous one of this executor), in order:
        computed from the recorded times, so a gap across a re-registration counts too."""
        return [(b, (b - a).total_seconds()) for a, b in zip(self.beat_ts, self.beat_ts[1:], strict=False)]

    def longest_gap(self) -> tuple[float, dt.datetime | None]:
        gaps = self.gaps()
        if not gaps:
            return 0.0, None
        at, seconds = max(gaps, key=lambda g: g[1])
        return seconds, at

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e["event"] == kind)


@dataclass
class ShuffleSummary:
    """One shuffle's task reports (``shuffle_metrics``), summed over its map and reduce tasks."""

    shuffle_id: int
    first: dt.datetime | None = None
    """When its first task report was recorded: shuffles are listed in the order they ran."""
    maps: int = 0
    written: int = 0
    rows: int = 0
    reads: int = 0
    read: int = 0
    spill: int = 0
    blocked_s: float = 0.0
    recomputed: int = 0


@dataclass
class AppHistory:
    """Everything one application recorded, as :func:`load_history` read it."""

    app_id: str
    tables: str
    executors: list[ExecutorHistory]
    events: list[dict[str, Any]]
    shuffles: list[ShuffleSummary]
    shuffle_table: bool
    monitoring_gaps: list[MonitoringGap] = field(default_factory=list)
    """Intervals without history (the RM was down, then restarted: ``history.gaps``), oldest
    first: in them, no heartbeat and no event says nothing about the executors' health."""


def load_history(location: TablesLocation | Path | str, app_id: str) -> AppHistory:
    """Everything the report shows of ``app_id`` (already resolved, see :func:`resolve_app`)."""
    location = locate(location)
    beats = read_rows(
        open_history_table(location, HEARTBEATS.name),
        location,
        app_id,
        ["executor_id", "host", "instance_id", "ts", "rtt_ms"],
    ).to_pylist()
    events = read_rows(open_history_table(location, EXECUTOR_EVENTS.name), location, app_id).to_pylist()
    by_id: dict[str, ExecutorHistory] = {}

    def executor(row: dict[str, Any]) -> ExecutorHistory:
        eid = wire_text(row["executor_id"], MAX_ID_CHARS)
        found = by_id.setdefault(eid, ExecutorHistory(eid))
        host = wire_text(row["host"], MAX_ID_CHARS)
        if host not in found.hosts:
            found.hosts.append(host)
        found.instances.add(wire_text(row["instance_id"], MAX_ID_CHARS))
        return found

    for row in beats:
        e = executor(row)
        e.beat_ts.append(row["ts"])
        e.rtt_ms.append(float(row["rtt_ms"]) if row["rtt_ms"] is not None else float("nan"))
    monitoring_gaps = []
    for row in events:
        if row["event"] == GAP_KIND:  # not an executor's: the RM's own hole in the history
            gap = parse_gap(row["detail"])
            if gap is not None:
                monitoring_gaps.append(gap)
            continue
        executor(row).events.append(row)
    shuffles: dict[int, ShuffleSummary] = {}
    shuffle_table = has_table(location, SHUFFLE_METRICS.name)
    if shuffle_table:
        metrics = read_rows(open_history_table(location, SHUFFLE_METRICS.name), location, app_id)
        for r in metrics.to_pylist():
            s = shuffles.setdefault(int(r["shuffle_id"]), ShuffleSummary(int(r["shuffle_id"]), r["ts"]))
            if r["side"] == "write":
                s.maps += 1
                s.written += int(r["bytes"] or 0)
                s.rows += int(r["rows"] or 0)
            else:
                s.reads += 1
                s.read += int(r["bytes"] or 0)
            s.spill += int(r["spill_bytes"] or 0)
            s.blocked_s += float(r["blocked_on_credit_s"] or 0.0)
            s.recomputed += bool(r["recomputed"])
    return AppHistory(
        app_id=app_id,
        tables=str(location),
        executors=sorted(by_id.values(), key=lambda e: id_order(e.executor_id)),
        events=events,
        shuffles=list(shuffles.values()),  # rows come sorted by time
        shuffle_table=shuffle_table,
        monitoring_gaps=monitoring_gaps,
    )


def run_reader(main: Callable[[], int | None]) -> NoReturn:
    """Runs ``main`` (a command or benchmark that reads the tables) and ends the process with
    its status through ``arrowbeat_base.hard_exit.exit_now`` (delta-rs's readers can abort a normal
    interpreter exit: see there): ``main``'s return value (None is 0), a
    ``SystemExit``'s code (argparse's usage errors and ``--help``), 130 on Ctrl-C, or 1 with the
    traceback printed for any other exception, as Python itself would."""
    import sys
    import traceback

    code: int
    try:
        result = main()
        code = 0 if result is None else int(result)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_now(code)


def id_order(executor_id: str) -> tuple[bool, int, str]:
    """Numeric executor ids in numeric order, then the others (``driver``) by name."""
    return (not executor_id.isdigit(), int(executor_id) if executor_id.isdigit() else 0, executor_id)


__all__ = [
    "LATEST",
    "AppHistory",
    "ExecutorHistory",
    "ShuffleSummary",
    "UnknownApplicationError",
    "applications",
    "has_table",
    "id_order",
    "load_history",
    "open_history_table",
    "read_rows",
    "resolve_app",
    "run_reader",
]
