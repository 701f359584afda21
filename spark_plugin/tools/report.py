"""One application's liveness history as a self-contained HTML file (``arrowbeat report``).

Read from the Delta history tables with delta-rs (no Spark session): per executor, the heartbeat
round-trip times and the gaps between consecutive heartbeats over time, with the lifecycle events
marked (a missed heartbeat, a broken stream, a re-registration, an unregistration, Spark's own
removals); the Arrow shuffle's bytes per shuffle; summary tables (each executor's lifetime,
longest gap, timeouts). Plots are PNGs drawn with matplotlib's Agg canvas (no display, no global
``pyplot`` state) and embedded as ``data:`` URIs, so the file opens anywhere, offline, and names
no external URL. Every text that came from the wire (ids, hosts, details) passes ``wire_text``
and is HTML-escaped.

Errors are the plugin's tree (``spark_plugin.errors``): a missing or unreadable table is a
:class:`TablePathError`, an application the tables do not hold an :class:`UnknownApplicationError`.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_plugin.errors import HistoryTableError, TablePathError
from spark_plugin.history import EXECUTOR_EVENTS, HEARTBEATS, TablesLocation, locate
from spark_plugin.history.tables import SHUFFLE_METRICS
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.settings.config import declared_default

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable
    from matplotlib.axes import Axes

LATEST = "latest"
"""The ``--app`` value that names the application that started last in the tables."""

DEFAULT_TIMEOUT_S: float = declared_default("spark.arrowbeat.heartbeat.timeout")

LOSS_EVENTS = ("HEARTBEAT_TIMEOUT", "UNREACHABLE", "SPARK_LOST")
"""An executor lost without saying goodbye (UNREGISTERED is also the normal end)."""
#: Event kind -> colour of its marks (plots and tables); kinds not listed are drawn grey.
EVENT_COLOURS = {
    "REGISTERED": "#1f77b4",
    "REREGISTERED": "#2ca02c",
    "HEARTBEAT_TIMEOUT": "#d62728",
    "UNREACHABLE": "#ff7f0e",
    "UNREGISTERED": "#7f7f7f",
    "SPARK_REMOVED": "#9467bd",
    "SPARK_LOST": "#8c564b",
    "UNMONITORED": "#e377c2",
    "TASK_STUCK": "#bcbd22",
    "TASK_RESUMED": "#17becf",
}


class UnknownApplicationError(HistoryTableError):
    """The tables hold no row of the application asked for; the message lists the ones they hold."""


# --- reading ---------------------------------------------------------------------------------------


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
        raise TablePathError(f"cannot read {shown}: {one_line(location.scrub(exc))}") from None


def has_table(location: TablesLocation, name: str) -> bool:
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
        raise TablePathError(f"cannot read {table.table_uri}: {one_line(location.scrub(exc))}") from None
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


def one_line(text: object) -> str:
    """delta-rs's multi-line, coloured error text as one plain line."""
    return " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(text)).split())[:2000]


# --- the figures the report shows ------------------------------------------------------------------


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
    app_id: str
    tables: str
    executors: list[ExecutorHistory]
    events: list[dict[str, Any]]
    shuffles: list[ShuffleSummary]
    shuffle_table: bool


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
    for row in events:
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
    )


def id_order(executor_id: str) -> tuple[bool, int, str]:
    """Numeric executor ids in numeric order, then the others (``driver``) by name."""
    return (not executor_id.isdigit(), int(executor_id) if executor_id.isdigit() else 0, executor_id)


# --- plots -----------------------------------------------------------------------------------------


def _times(values: Iterable[dt.datetime]) -> Any:
    """UTC times as naive ``datetime64[us]`` (what matplotlib plots without a time zone warning)."""
    import numpy as np

    return np.array([v.astimezone(dt.UTC).replace(tzinfo=None) for v in values], dtype="datetime64[us]")


def _date_axis(axis: Any) -> None:
    """Concise UTC time labels on ``axis`` (an x axis)."""
    from matplotlib import dates

    locator = dates.AutoDateLocator()  # type: ignore[no-untyped-call]
    axis.set_major_locator(locator)
    axis.set_major_formatter(dates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]


def _png(figure: Any) -> str:
    """The figure as a base64 PNG, without the PNG's "Software" text (it carries a URL)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _mark_events(axes: Sequence[Axes], events: Sequence[dict[str, Any]]) -> None:
    """Draws each event as a dashed vertical line on every axis (labelled once per kind)."""
    kinds: set[str] = set()
    for e, at in zip(events, _times(e["ts"] for e in events), strict=True):
        kind = str(e["event"])
        colour = EVENT_COLOURS.get(kind, "#7f7f7f")
        for ax in axes:
            label = kind if (ax is axes[0] and kind not in kinds) else None
            ax.axvline(at, color=colour, linewidth=1.4, linestyle="--", label=label)
        kinds.add(kind)


def executor_plot(e: ExecutorHistory, timeout_s: float) -> str:
    """RTT (top) and heartbeat gaps (bottom) of one executor over time, its events marked."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.4), layout="constrained")
    rtt_ax, gap_ax = fig.subplots(2, 1, sharex=True)
    if e.beat_ts:
        rtt_ax.plot(_times(e.beat_ts), e.rtt_ms, ".", markersize=3, color="#1f77b4")
        gaps = e.gaps()
        if gaps:
            gap_ax.plot(_times(t for t, _ in gaps), [s for _, s in gaps], ".", markersize=3, color="#444")
        # A silence longer than the timeout as the heartbeat's age rising from the last answered
        # heartbeat until the next one: where it crosses the timeout line, the RM reports it.
        for n, (at, seconds) in enumerate(s for s in gaps if s[1] > timeout_s):
            ramp = _times([at - dt.timedelta(seconds=seconds), at])
            label = "silence > timeout" if n == 0 else None
            gap_ax.plot(ramp, [0.0, seconds], "-", color="#d62728", linewidth=1.5, label=label)
    else:
        rtt_ax.text(0.5, 0.5, "no heartbeat recorded", ha="center", va="center", transform=rtt_ax.transAxes)
    gap_ax.axhline(timeout_s, color="#d62728", linewidth=0.8, linestyle=":", label=f"timeout {timeout_s:g} s")
    _mark_events([rtt_ax, gap_ax], e.events)
    rtt_ax.set_ylabel("RTT (ms)")
    gap_ax.set_ylabel("heartbeat gap (s)")
    gap_ax.set_xlabel("time (UTC)")
    rtt_ax.set_title(f"executor {e.executor_id} on {', '.join(e.hosts)}", fontsize=10)
    _date_axis(gap_ax.xaxis)
    for ax in (rtt_ax, gap_ax):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=7, framealpha=0.8)
    return _png(fig)


def timeline_plot(executors: Sequence[ExecutorHistory], timeout_s: float) -> str:
    """One lane per executor: heartbeats as ticks, gaps over the timeout in red, events as marks."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 1.2 + 0.35 * len(executors)), layout="constrained")
    ax = fig.subplots()
    drawn: set[str] = set()
    for lane, e in enumerate(executors):
        if e.beat_ts:
            ax.plot(_times(e.beat_ts), [lane] * len(e.beat_ts), "|", color="#1f77b4", markersize=8)
        for at, seconds in e.gaps():
            if seconds > timeout_s:
                span = _times([at - dt.timedelta(seconds=seconds), at])
                ax.plot(span, [lane, lane], color="#d62728", linewidth=3)
        for ev, at in zip(e.events, _times(ev["ts"] for ev in e.events), strict=True):
            kind = str(ev["event"])
            label = None if kind in drawn else kind
            ax.plot([at], [lane], "D", color=EVENT_COLOURS.get(kind, "#7f7f7f"), markersize=6, label=label)
            drawn.add(kind)
    ax.set_yticks(range(len(executors)), [e.executor_id for e in executors])
    ax.set_ylim(-0.7, len(executors) - 0.3)
    ax.set_ylabel("executor")
    ax.set_xlabel("time (UTC)")
    _date_axis(ax.xaxis)
    ax.grid(True, axis="x", alpha=0.3)
    if drawn:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return _png(fig)


def shuffle_plot(shuffles: Sequence[ShuffleSummary]) -> str:
    """Bytes written (map side) and read (reduce side) per shuffle."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.2), layout="constrained")
    ax = fig.subplots()
    xs = range(len(shuffles))
    ax.bar(
        [x - 0.2 for x in xs], [s.written / 2**20 for s in shuffles], 0.4, label="written", color="#1f77b4"
    )
    ax.bar([x + 0.2 for x in xs], [s.read / 2**20 for s in shuffles], 0.4, label="read", color="#ff7f0e")
    ax.set_xticks(list(xs), [str(s.shuffle_id) for s in shuffles])
    ax.set_xlabel("shuffle id")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return _png(fig)


# --- HTML ------------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; } td.text { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
.event { font-weight: 600; } .bad { color: #d62728; font-weight: 600; } .note { color: #666; }
"""


def _t(value: object) -> str:
    return html.escape(str(value), quote=True)


def _when(ts: dt.datetime | None) -> str:
    return "-" if ts is None else ts.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def size_text(n: float) -> str:
    """Bytes as B / KiB / MiB / GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], text_columns: Sequence[int] = ()) -> str:
    """An HTML table; cells are already escaped HTML."""
    out = ["<table><tr>" + "".join(f"<th>{_t(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = "".join(
            f'<td class="text">{c}</td>' if i in text_columns else f"<td>{c}</td>" for i, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _event_cell(kind: str) -> str:
    colour = EVENT_COLOURS.get(kind, "#7f7f7f")
    return f'<span class="event" style="color:{colour}">{_t(wire_text(kind, MAX_ID_CHARS))}</span>'


def _quantile(values: Sequence[float], q: float) -> float | None:
    clean = sorted(v for v in values if v == v)
    return clean[min(len(clean) - 1, int(q * len(clean)))] if clean else None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def render(history: AppHistory, timeout_s: float = DEFAULT_TIMEOUT_S, max_plots: int = 64) -> str:
    """The report as one HTML document (PNG plots inline)."""
    execs = history.executors
    app = _t(wire_text(history.app_id, MAX_ID_CHARS))
    times = [t for e in execs for t in (e.first_seen, e.last_seen) if t is not None]
    start, end = (min(times), max(times)) if times else (None, None)
    losses = sum(e.count(k) for e in execs for k in LOSS_EVENTS)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>arrowbeat report: {app}</title><style>{_CSS}</style></head><body>",
        f"<h1>Executor liveness of {app}</h1>",
        f'<p class="note">From the Delta tables at {_t(history.tables)}; {_when(start)} to {_when(end)} '
        f"(UTC). {len(execs)} executors, {sum(len(e.beat_ts) for e in execs)} heartbeats, "
        f"{len(history.events)} lifecycle events ({losses} losses). Gaps are measured against the "
        f"heartbeat timeout {timeout_s:g} s (<code>--timeout</code>).</p>",
        "<h2>Executors</h2>",
    ]
    summary = []
    for e in execs:
        gap, gap_at = e.longest_gap()
        lifetime = (e.last_seen - e.first_seen).total_seconds() if e.first_seen and e.last_seen else 0.0
        last = e.events[-1]["event"] if e.events else "-"
        summary.append(
            [
                _t(e.executor_id),
                _t(", ".join(e.hosts)),
                str(len(e.instances)),
                _when(e.first_seen),
                _when(e.last_seen),
                f"{lifetime:.1f}",
                str(len(e.beat_ts)),
                _ms(_quantile(e.rtt_ms, 0.5)),
                _ms(_quantile(e.rtt_ms, 0.95)),
                f'<span class="bad">{gap:.2f}</span>' if gap > timeout_s else f"{gap:.2f}",
                _when(gap_at),
                str(e.count("HEARTBEAT_TIMEOUT")),
                str(e.count("UNREACHABLE")),
                str(e.count("REREGISTERED")),
                _event_cell(str(last)) if last != "-" else "-",
            ]
        )
    head = ["executor", "host", "instances", "first seen", "last seen", "lifetime s", "heartbeats"]
    head += ["RTT p50 ms", "RTT p95 ms", "longest gap s", "gap ended at", "timeouts", "unreachable"]
    head += ["re-registrations", "last event"]
    parts.append(_table(head, summary, text_columns=(0, 1, 14)))
    if execs:
        parts += [
            "<h2>Timeline</h2>",
            f'<img class="timeline" alt="timeline" src="data:image/png;base64,'
            f'{timeline_plot(execs, timeout_s)}">',
        ]
    # Executors with losses first, then the longest gaps: those are what a reader looks for.
    chosen = sorted(
        execs,
        key=lambda e: (-sum(e.count(k) for k in LOSS_EVENTS), -e.longest_gap()[0], id_order(e.executor_id)),
    )[:max_plots]
    parts.append("<h2>Per executor: RTT and heartbeat gaps</h2>")
    if len(chosen) < len(execs):
        parts.append(
            f'<p class="note">{len(chosen)} of {len(execs)} executors plotted (those with losses and the '
            "longest gaps first; <code>--max-plots</code>).</p>"
        )
    for e in sorted(chosen, key=lambda e: id_order(e.executor_id)):
        eid = _t(e.executor_id)
        parts.append(f'<h3 id="executor-{eid}">Executor {eid}</h3>')
        parts.append(
            f'<img class="executor-plot" data-executor="{eid}" '
            f'alt="RTT and heartbeat gaps of executor {eid}" '
            f'src="data:image/png;base64,{executor_plot(e, timeout_s)}">'
        )
        if e.events:
            rows = [
                [
                    _when(ev["ts"]),
                    _event_cell(str(ev["event"])),
                    _t(wire_text(ev["instance_id"], MAX_ID_CHARS))[:12],
                    _t(wire_text(ev["detail"] or "")),
                ]
                for ev in e.events
            ]
            parts.append(_table(["time", "event", "instance", "detail"], rows, text_columns=(1, 2, 3)))
    parts.append("<h2>Arrow shuffle: bytes per shuffle</h2>")
    if history.shuffles:
        parts.append(
            f'<img class="shuffle-plot" alt="bytes per shuffle" '
            f'src="data:image/png;base64,{shuffle_plot(history.shuffles)}">'
        )
        rows = [
            [
                str(s.shuffle_id),
                str(s.maps),
                size_text(s.written),
                str(s.rows),
                str(s.reads),
                size_text(s.read),
                size_text(s.spill),
                f"{s.blocked_s:.2f}",
                str(s.recomputed),
            ]
            for s in history.shuffles
        ]
        head = ["shuffle", "map tasks", "written", "rows", "reduce reads", "read", "spilled"]
        parts.append(_table([*head, "blocked on credit s", "recomputed"], rows))
    else:
        where = "no shuffle_metrics table" if not history.shuffle_table else "no rows in shuffle_metrics"
        parts.append(f'<p class="note">No Arrow shuffle recorded for this application ({where}).</p>')
    parts.append("<h2>Lifecycle events</h2>")
    rows = [
        [
            _when(ev["ts"]),
            _t(wire_text(ev["executor_id"], MAX_ID_CHARS)),
            _t(wire_text(ev["host"], MAX_ID_CHARS)),
            _event_cell(str(ev["event"])),
            _t(wire_text(ev["detail"] or "")),
        ]
        for ev in history.events
    ]
    parts.append(_table(["time", "executor", "host", "event", "detail"], rows, text_columns=(1, 2, 3, 4)))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(
    tables: TablesLocation | Path | str,
    app: str,
    output: Path,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_plots: int = 64,
) -> tuple[str, AppHistory]:
    """Resolves ``app`` (or :data:`LATEST`), renders its report and writes it to ``output``
    (a temporary file renamed into place, so a reader never sees half a report)."""
    location = locate(tables)
    app_id = resolve_app(location, app)
    history = load_history(location, app_id)
    document = render(history, timeout_s, max_plots)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    partial.write_text(document, encoding="utf-8")
    partial.replace(output)
    return app_id, history


__all__ = [
    "LATEST",
    "AppHistory",
    "UnknownApplicationError",
    "applications",
    "load_history",
    "open_history_table",
    "render",
    "resolve_app",
    "size_text",
    "write_report",
]
