"""The report's figures: PNGs drawn with matplotlib's Agg canvas (no display, no global ``pyplot``
state), returned as base64 text for a ``data:`` URI, so the report opens anywhere, offline.

Per executor, the heartbeat round-trip times and the gaps between consecutive heartbeats over time
(:func:`executor_plot`), one lane per executor (:func:`timeline_plot`), bytes per shuffle
(:func:`shuffle_plot`); lifecycle events are marked in the colour :data:`EVENT_COLOURS` gives
their kind (the HTML tables use the same colours). matplotlib is imported on first use (the
``report`` extra).
"""

from __future__ import annotations

import base64
import datetime as dt
import io
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from spark_plugin.history.reader import ExecutorHistory, ShuffleSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes

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
    "SHUFFLE_CORRUPT": "#ff1493",
    "DEGRADED": "#e6a100",
    "RECOVERED": "#2ca02c",
    "MONITORING_GAP": "#d62728",
}


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


__all__ = ["EVENT_COLOURS", "executor_plot", "shuffle_plot", "timeline_plot"]
