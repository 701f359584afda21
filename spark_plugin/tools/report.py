"""One application's liveness history as a self-contained HTML file (``arrowbeat report``).

The history comes from ``spark_plugin.history.reader`` (delta-rs, no Spark session), the figures
from ``report_plots``; this module lays them out: per executor, the heartbeat round-trip times and
the gaps between consecutive heartbeats over time, with the lifecycle events marked (a missed
heartbeat, a broken stream, a re-registration, an unregistration, Spark's own removals); the Arrow
shuffle's bytes per shuffle; summary tables (each executor's lifetime, longest gap, timeouts);
first of all, the intervals in which the RM itself kept no history (``MONITORING_GAP``).
The plots are embedded as ``data:`` URIs, so the file opens anywhere, offline, and names no
external URL. Every text that came from the wire (ids, hosts, details) passes ``wire_text`` and
is HTML-escaped.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Sequence
from pathlib import Path

from spark_plugin.history import TablesLocation, locate
from spark_plugin.history.reader import AppHistory, id_order, load_history, resolve_app
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.settings.config import declared_default
from spark_plugin.tools.report_plots import EVENT_COLOURS, executor_plot, shuffle_plot, timeline_plot
from spark_plugin.tools.views import size_text

DEFAULT_TIMEOUT_S: float = declared_default("spark.arrowbeat.heartbeat.timeout")

LOSS_EVENTS = ("HEARTBEAT_TIMEOUT", "UNREACHABLE", "SPARK_LOST")
"""An executor lost without saying goodbye (UNREGISTERED is also the normal end)."""


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


def _gaps_section(history: AppHistory) -> list[str]:
    """The intervals without history (the RM was down and restarted), first: there, the plots'
    silence is a hole in the record, not health."""
    gaps = history.monitoring_gaps
    if not gaps:
        return []
    rows = [
        [
            _when(None if g.start is None else dt.datetime.fromtimestamp(g.start, dt.UTC)),
            _when(dt.datetime.fromtimestamp(g.end, dt.UTC)),
            "-" if g.seconds is None else f"{g.seconds:.1f}",
            str(g.lost_rows),
            _t(wire_text(g.cause)),
        ]
        for g in gaps
    ]
    return [
        '<h2 class="bad">Monitoring gaps</h2>',
        f'<p class="note">{len(gaps)} intervals in which arrowbeat\'s ResourceManager was down (dead or '
        "hung, then restarted) and kept no history: no heartbeat or event there says nothing about "
        "the executors. Rows lost in flight are a lower bound.</p>",
        _table(["from", "to", "seconds", "rows lost", "cause"], rows, text_columns=(4,)),
    ]


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
        *_gaps_section(history),
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


__all__ = ["DEFAULT_TIMEOUT_S", "LOSS_EVENTS", "render", "write_report"]
