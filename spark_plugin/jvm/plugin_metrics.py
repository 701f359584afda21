"""arrowbeat's figures in Spark's metrics system, sent over the launcher's protocol channel.

The JVM plugins register Dropwizard gauges through ``PluginContext.metricRegistry()``
(``launcher/.../PluginMetrics.java``), so every sink Spark is configured with (the driver UI's
``PrometheusServlet``, JMX, CSV, ...) shows them under the plugin's source
``plugin.arrowbeat.ArrowBeatPlugin``. The values live here, in the Python processes; once per
heartbeat interval each writes its figures to the JVM as one or more lines

    ARROWBEAT-METRICS <snapshot> name=value name=value ...

on its protocol channel (``protocol.metrics_lines``). ``<snapshot>`` numbers the set (every line of
one set carries the same number); names come from a fixed list per role (``DRIVER_METRICS``,
``EXECUTOR_METRICS``, and on the driver ``executor.<id>.heartbeatAgeMs`` / ``executor.<id>.rttMs``);
values are decimal numbers. The JVM refuses any other line (rate-limited log) and keeps the latest
value of each name. A per-executor name missing from a whole snapshot is removed, so an executor
that went leaves no gauge behind.

Which figures are ages is decided here: a heartbeat age is sent as a ``protocol.Age``, and the JVM
adds the time since the line arrived. So a frozen executor's heartbeat age keeps growing between
lines, and keeps growing if this driver-side process itself stalls (then the RM hears nobody, which
the age then says); the driver's own ``metricsLineAgeMs`` gauge shows how long ago the last line came.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm.protocol import Age, metrics_lines

log = logging.getLogger("arrowbeat.metrics")

DRIVER_METRICS = frozenset(
    {
        "executors.running",
        "executors.timedOut",
        "executors.unreachable",
        "executors.unmonitored",
        "events.heartbeatTimeout",
        "events.unreachable",
        "events.reregistered",
        "events.shuffleCorrupt",
        "executors.degraded",
        "events.degraded",
        "events.recovered",
        "history.rowsBuffered",
        "history.rowsDropped",
        "history.commitFailures",
    }
)
"""The driver's fixed names (``PluginMetrics.DRIVER`` on the JVM side)."""
GRAY_METRICS = frozenset({"executors.degraded", "events.degraded", "events.recovered"})
"""The gray-failure gauges (``monitoring.driver_degraded``), sent on a line of their own: a launcher
jar built before them refuses that line only, never the rest of the snapshot."""
PER_EXECUTOR = ("heartbeatAgeMs", "rttMs")
EXECUTOR_METRICS = frozenset(
    {
        "shuffle.poolUsedBytes",
        "shuffle.bytesServed",
        "shuffle.poolWaitMs",
        "shuffle.creditWaitMs",
        "shuffle.spillBytes",
        "shuffle.diskBytes",
        "shuffle.streamsOpen",
        "shuffle.corruptOutputs",
    }
)
"""An executor's names (``PluginMetrics.EXECUTOR`` on the JVM side)."""

_PER_EXECUTOR_NAME = re.compile(r"executor\.[A-Za-z0-9][A-Za-z0-9_-]{0,63}\.(?:heartbeatAgeMs|rttMs)")

# The agent's payload figures (``MapOutputService.metrics``) behind each executor metric, and the
# factor to its unit. creditWaitMs and spillBytes appear once the agent reports them.
_EXECUTOR_SOURCES: dict[str, tuple[str, float]] = {
    "shuffle.poolUsedBytes": ("shuffle_pool_used_bytes", 1.0),
    "shuffle.bytesServed": ("shuffle_bytes_staged", 1.0),
    "shuffle.poolWaitMs": ("shuffle_stream_wait_total_s", 1000.0),
    "shuffle.creditWaitMs": ("shuffle_blocked_on_credit_s", 1000.0),
    "shuffle.spillBytes": ("shuffle_spill_bytes", 1.0),
    "shuffle.diskBytes": ("shuffle_disk_bytes", 1.0),
    "shuffle.streamsOpen": ("shuffle_streams_open", 1.0),
    "shuffle.corruptOutputs": ("shuffle_outputs_corrupt", 1.0),  # damaged outputs found, agent's life
}

_STATE_METRICS = {
    "RUNNING": "executors.running",
    "TIMEOUT": "executors.timedOut",
    "UNREACHABLE": "executors.unreachable",
    "UNMONITORED": "executors.unmonitored",
}
_WATCHED_STATES = ("RUNNING", "TIMEOUT", "UNREACHABLE")
"""Executors that get per-executor gauges: live ones, and silent ones Spark has not removed."""


JVM_OWN_METRICS = ("metricsLineAgeMs",)
"""Gauges the JVM keeps itself on both sides (never sent here): how long ago the last line came."""

METRIC_DOCS: dict[str, str] = {
    "executors.running": "executors the RM lists RUNNING",
    "executors.timedOut": "executors the RM lists timed out (HEARTBEAT_TIMEOUT)",
    "executors.unreachable": "executors the RM lists UNREACHABLE",
    "executors.unmonitored": "executors Spark runs without a registered agent (UNMONITORED)",
    "events.heartbeatTimeout": "HEARTBEAT_TIMEOUT events since the driver-side process started (a gauge "
    "holding a running total, replayed from the history by a restarted RM)",
    "events.unreachable": "UNREACHABLE events since the driver-side process started (a running total)",
    "events.reregistered": "REREGISTERED events since the driver-side process started (a running total)",
    "executors.degraded": "executors recorded DEGRADED (consistently slower than their peers) and not "
    "since RECOVERED or gone",
    "events.degraded": "DEGRADED events since the driver-side process started (a running total)",
    "events.recovered": "RECOVERED events since the driver-side process started (a running total)",
    "events.shuffleCorrupt": "damaged map outputs the executors' agents found (SHUFFLE_CORRUPT events; "
    "each executor's own count is its `shuffle.corruptOutputs`)",
    "history.rowsBuffered": "history rows waiting for a commit",
    "history.rowsDropped": "history rows dropped past the buffer bound after failed commits",
    "history.commitFailures": "history commits that failed (each retried; rows wait in the buffer)",
    "executor.<id>.heartbeatAgeMs": "ms since the RM last heard from the executor; keeps growing while it "
    "is silent (and while the driver-side process itself is stalled); for running executors and silent "
    "ones Spark has not removed; removed when the executor goes",
    "executor.<id>.rttMs": "the executor's last heartbeat round trip, ms",
    "shuffle.poolUsedBytes": "the agent's shuffle buffer pool in use",
    "shuffle.bytesServed": "bytes the agent streamed to reducers",
    "shuffle.poolWaitMs": "total time streams waited for pool buffers",
    "shuffle.creditWaitMs": "total time the agent's streams waited for a reducer's credit",
    "shuffle.spillBytes": "bytes spilled to the executor's local dirs",
    "shuffle.diskBytes": "map outputs on the executor's disks",
    "shuffle.streamsOpen": "streams the agent serves now",
    "shuffle.corruptOutputs": "damaged map outputs of this executor found since its agent started (each "
    "also a SHUFFLE_CORRUPT row in `executor_events`)",
    "metricsLineAgeMs": "ms since the Python process last sent figures (large: it is stalled or gone)",
}
"""What each gauge shows (the documentation site's metrics list is generated from the name sets above
and these; a test keeps them covering every name)."""


def allowed(role: str, name: str) -> bool:
    """Whether the JVM of ``role`` (``driver`` or ``executor``) takes ``name``."""
    if role == "driver":
        return name in DRIVER_METRICS or _PER_EXECUTOR_NAME.fullmatch(name) is not None
    if role == "executor":
        return name in EXECUTOR_METRICS
    raise ValueError(f"no metrics role {role!r}")


def encode(snapshot: int, figures: Mapping[str, float | None], role: str) -> list[str]:
    """The lines of one snapshot (``protocol.metrics_lines``). An unknown value (None, NaN) is
    left out; a name the JVM of ``role`` would refuse raises ``JvmCommandError`` and nothing is
    encoded (a bug here, not an input problem)."""
    fields: dict[str, float] = {}
    for name, value in figures.items():
        if not allowed(role, name):
            raise JvmCommandError(f"{role} metric name {name[:80]!r} is not one the JVM takes")
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        fields[name] = value
    gray = {name: value for name, value in fields.items() if name in GRAY_METRICS}
    rest = {name: value for name, value in fields.items() if name not in GRAY_METRICS}
    return metrics_lines(snapshot, rest) + (metrics_lines(snapshot, gray) if gray else [])


_COUNTED = {
    "HEARTBEAT_TIMEOUT": "events.heartbeatTimeout",
    "UNREACHABLE": "events.unreachable",
    "REREGISTERED": "events.reregistered",
    "SHUFFLE_CORRUPT": "events.shuffleCorrupt",
    "DEGRADED": "events.degraded",
    "RECOVERED": "events.recovered",
}
"""The events the driver counts, and each one's gauge."""


class LivenessTally:
    """An RM subscriber: counts HEARTBEAT_TIMEOUT, UNREACHABLE and REREGISTERED events (and
    SHUFFLE_CORRUPT, DEGRADED and RECOVERED, which the driver's ``EventRouter`` hands it: the bus
    never carries them), keeps the executors degraded now, and remembers executors that went
    (unregistered, or removed by Spark), whose gauges go too.
    Events arrive on the RM's event thread; readers call from the reporter's."""

    def __init__(self, max_gone: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(_COUNTED.values(), 0)
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._max_gone = max_gone
        self._degraded: set[str] = set()

    def __call__(self, event: object) -> None:
        from heartbeat import ExecutorEvent

        if isinstance(event, ExecutorEvent):
            self._count(event.kind.value, event.executor_id)

    def replay(self, recorded: Iterable[tuple[str, str]]) -> None:
        """Counts ``(event, executor_id)`` pairs an earlier process of this application recorded
        (``history.recovery.Recovered.events``, oldest first), as if they had just happened: a
        restarted RM's counters go on from where the dead one's stopped, as Spark's counters must."""
        for kind, executor_id in recorded:
            self._count(kind, executor_id)

    def _count(self, kind: str, executor_id: str) -> None:
        counted = _COUNTED.get(kind)
        with self._lock:
            if counted is not None:
                self._counts[counted] += 1
            if kind == "DEGRADED" and len(self._degraded) < self._max_gone:
                self._degraded.add(executor_id)
            elif kind == "RECOVERED":
                self._degraded.discard(executor_id)
            if kind in ("UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"):
                self._degraded.discard(executor_id)
                self._gone[executor_id] = None
                while len(self._gone) > self._max_gone:
                    self._gone.popitem(last=False)
            elif kind in ("REGISTERED", "REREGISTERED"):
                self._gone.pop(executor_id, None)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def degraded(self) -> int:
        """Executors recorded DEGRADED and not since RECOVERED or gone."""
        with self._lock:
            return len(self._degraded)

    def gone(self, executor_id: str) -> bool:
        with self._lock:
            return executor_id in self._gone


def driver_figures(
    executors: Iterable[Any],
    tally: LivenessTally,
    history_stats: Mapping[str, Mapping[str, int]] | None,
    now: float,
) -> dict[str, float | None]:
    """The driver's snapshot from the RM's listing (``ExecutorInfo``s; times are wall-clock
    seconds, ``now`` too): executors per state, each watched executor's heartbeat age (since its
    registration if it never answered; an ``Age``, which the JVM's gauge keeps ageing) and last
    RTT, event counts, the executors degraded now and the history writer's
    buffered, dropped and (when it counts them) failed commits."""
    figures: dict[str, float | None] = dict.fromkeys(_STATE_METRICS.values(), 0.0)
    for info in executors:
        name = _STATE_METRICS.get(info.state)
        if name is not None:
            figures[name] = (figures[name] or 0.0) + 1
        if info.state not in _WATCHED_STATES or tally.gone(info.executor_id):
            continue
        if _PER_EXECUTOR_NAME.fullmatch(f"executor.{info.executor_id}.rttMs") is None:
            continue  # an id with dots or other characters a metric name cannot carry
        heard = info.last_heartbeat if info.last_heartbeat is not None else info.registered_at
        figures[f"executor.{info.executor_id}.heartbeatAgeMs"] = Age(max(0.0, (now - heard) * 1000.0))
        figures[f"executor.{info.executor_id}.rttMs"] = info.last_rtt_ms
    figures.update({name: float(count) for name, count in tally.counts().items()})
    figures["executors.degraded"] = float(tally.degraded())
    if history_stats is not None:
        tables = list(history_stats.values())
        figures["history.rowsBuffered"] = float(sum(t.get("buffered", 0) for t in tables))
        figures["history.rowsDropped"] = float(sum(t.get("dropped", 0) for t in tables))
        if any("failures" in t for t in tables):  # once the writer counts failed commits
            figures["history.commitFailures"] = float(sum(t.get("failures", 0) for t in tables))
    return figures


def executor_figures(agent_metrics: Mapping[str, float]) -> dict[str, float | None]:
    """An executor's snapshot from its agent's shuffle figures (``MapOutputService.metrics``);
    figures the agent does not report (no shuffle service yet) are left out."""
    figures: dict[str, float | None] = {}
    for name, (source, factor) in _EXECUTOR_SOURCES.items():
        value = agent_metrics.get(source)
        if value is not None:
            figures[name] = float(value) * factor
    return figures


class MetricsReporter:
    """Sends one snapshot per interval on a daemon thread, the first one interval after
    :meth:`start` (the JVM installs its handler once the ready line arrived). A failing
    snapshot is logged once and skipped: metrics never end the process."""

    def __init__(
        self,
        figures: Callable[[], Mapping[str, float | None]],
        send: Callable[[int, Mapping[str, float | None]], None],
        interval_s: float,
    ) -> None:
        self._figures = figures
        self._send = send
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._snapshot = 0
        self._warned = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="plugin-metrics", daemon=True)
        self._thread.start()

    def send_one(self) -> None:
        """One snapshot now (the loop's step; tests call it directly)."""
        self._snapshot += 1
        try:
            self._send(self._snapshot, self._figures())
        except Exception:
            if not self._warned:
                log.warning("a metrics snapshot for Spark's metrics system failed", exc_info=True)
                self._warned = True

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.send_one()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
