"""arrowbeat's gauges in Spark's metrics system, end to end, on the shared frozen-executor run of
``tests.harness.frozen`` (a spark-submit application on local-cluster[2,1,1024], interval 500 ms,
timeout 2 s), to which this module adds Spark's ``PrometheusServlet`` at the driver UI's
``/metrics/prometheus``, a CSV sink on the executors and an Arrow shuffle (``--shuffle``). One
executor JVM is frozen (SIGSTOP): its heartbeat age grows past the timeout and the state counts
change, as an HTTP GET of the servlet shows; after SIGCONT it re-registers. The executors' shuffle
gauges reach only the executors' own sinks (Spark's servlet shows the driver's metrics), so they
are read from CSV.
"""

from __future__ import annotations

import csv
import itertools
import re
import time
import urllib.request
from collections.abc import Generator
from pathlib import Path

import pytest

from harness.procs import wait_until
from tests.harness.frozen import INTERVAL_S, TIMEOUT_S, FrozenRun, Phase, Probe

pytestmark = [pytest.mark.spark, pytest.mark.slow]
MARGIN_S = 10.0
"""Slack on a loaded 2-core machine over interval + timeout (plus one scrape)."""
SINKS = "org.apache.spark.metrics.sink"
PLUGIN = "plugin_arrowbeat_ArrowBeatPlugin_"
_GAUGE = re.compile(r"^metrics_(\S+?)_Value\{type=\"gauges\"\} (\S+)$")


def servlet_text(ui: str) -> str:
    with urllib.request.urlopen(f"{ui}/metrics/prometheus", timeout=10) as response:
        return str(response.read().decode())


def scrape(ui: str) -> dict[str, float]:
    """The driver's arrowbeat gauges from the servlet, by metric name as Prometheus sees it
    (``executors_running``, ``executor_1_heartbeatAgeMs``, ...)."""
    found = {}
    for line in servlet_text(ui).splitlines():
        match = _GAUGE.match(line)
        if match and f"_driver_{PLUGIN}" in match[1]:
            found[match[1].split(f"_driver_{PLUGIN}", 1)[1]] = float(match[2])
    return found


def csv_gauges(folder: Path, name: str) -> dict[str, float]:
    """Executor id -> latest value of the executors' CSV files of ``name``."""
    found = {}
    for path in folder.glob(f"*.plugin.arrowbeat.ArrowBeatPlugin.{name}.csv"):
        executor_id = path.name.split(".")[1]
        with path.open() as f:
            rows = list(csv.reader(f))
        if len(rows) > 1:
            found[executor_id] = float(rows[-1][1])
    return found


class ServletProbe(Probe):
    """The servlet scraped before the freeze, while frozen and after the thaw; then the CSV sink
    (before anything else changes the executors)."""

    def __init__(self) -> None:
        super().__init__()
        self.detected_s = 0.0

    @property
    def csv_dir(self) -> Path:
        return self.folder / "metrics-csv"

    def conf(self) -> dict[str, str]:
        self.csv_dir.mkdir()
        return {
            "spark.ui.enabled": "true",
            "spark.ui.port": "0",
            "spark.metrics.conf.*.sink.prometheusServlet.class": f"{SINKS}.PrometheusServlet",
            "spark.metrics.conf.*.sink.prometheusServlet.path": "/metrics/prometheus",
            "spark.metrics.conf.executor.sink.csv.class": f"{SINKS}.CsvSink",
            "spark.metrics.conf.executor.sink.csv.period": "1",
            "spark.metrics.conf.executor.sink.csv.unit": "seconds",
            "spark.metrics.conf.executor.sink.csv.directory": str(self.csv_dir),
        }

    def args(self) -> list[str]:
        return ["--shuffle"]

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        app, csv_dir = run.app, self.csv_dir
        # spark.ui.port=0: the port the driver's UI bound, as Spark logs it (SPARK_LOCAL_IP=127.0.0.1)
        bound = re.search(r"started service 'SparkUI' on port ([0-9]+)", app.log_text())
        assert bound, [line for line in app.log_text().splitlines() if "SparkUI" in line]
        ui = f"http://127.0.0.1:{bound[1]}"
        jvms = run.jvms
        assert len(jvms) == 2
        ages = [f"executor_{e}_heartbeatAgeMs" for e in sorted(jvms)]

        def all_running() -> bool:
            seen = scrape(ui)
            fresh = all(seen.get(a, 1e9) < TIMEOUT_S * 1000 for a in ages)
            return seen.get("executors_running") == 2 and fresh

        assert wait_until(all_running, 30), (
            servlet_text(ui)[:3000],
            [line for line in app.log_text().splitlines() if "ignored" in line or "etric" in line][:20],
        )
        seen = scrape(ui)
        assert seen["executors_timedOut"] == 0 and seen["events_heartbeatTimeout"] == 0, seen
        assert all(f"executor_{e}_rttMs" in seen for e in jvms), seen
        assert seen["metricsLineAgeMs"] < 10 * INTERVAL_S * 1000, seen

        yield Phase.FROZEN
        age = f"executor_{run.frozen}_heartbeatAgeMs"
        readings: list[float] = []

        def timed_out() -> bool:
            now = scrape(ui)
            readings.append(now.get(age, -1.0))
            return (
                now.get(age, 0.0) > TIMEOUT_S * 1000
                and now.get("executors_timedOut", 0) + now.get("executors_unreachable", 0) == 1
                and now.get("executors_running") == 1
            )

        assert wait_until(timed_out, INTERVAL_S + TIMEOUT_S + MARGIN_S, interval_s=0.2), readings
        self.detected_s = time.monotonic() - run.stopped_at

        def events() -> float:
            now = scrape(ui)
            return now.get("events_heartbeatTimeout", 0.0) + now.get("events_unreachable", 0.0)

        # The state gauge is the RM's listing; the event count follows on the RM's event thread,
        # so one snapshot can carry the new state before the count (the next one has both).
        assert wait_until(lambda: events() >= 1, 3 * INTERVAL_S + MARGIN_S, interval_s=0.2), scrape(ui)
        assert events() == 1, scrape(ui)
        # Once past the last heartbeat answered before the freeze, the age only grows (within the
        # few ms by which one line's transit differs from the next's).
        grown = readings[next(i for i, r in enumerate(readings) if r > 4 * INTERVAL_S * 1000) :]
        assert all(b >= a - 50 for a, b in itertools.pairwise(grown)), readings

        yield Phase.THAWED

        def back() -> bool:
            now = scrape(ui)
            return now.get("executors_running") == 2 and now.get("events_reregistered", 0) >= 1

        assert wait_until(back, 30), scrape(ui)
        assert scrape(ui)[age] < TIMEOUT_S * 1000

        # The executors' own sink: each agent's shuffle figures. (On one host reducers read map
        # outputs from their files, so bytes served may stay 0 here; the value is not asserted.)
        names = ("shuffle.poolUsedBytes", "shuffle.bytesServed", "shuffle.diskBytes", "metricsLineAgeMs")
        assert wait_until(lambda: all(len(csv_gauges(csv_dir, n)) == 2 for n in names), 30), sorted(
            p.name for p in csv_dir.iterdir()
        )
        assert all(v >= 0 for n in names for v in csv_gauges(csv_dir, n).values())


SERVLET = ServletProbe()
FROZEN_PROBES = (SERVLET,)


def test_gauges_over_the_prometheus_servlet_follow_a_frozen_executor(frozen_run: FrozenRun) -> None:
    SERVLET.verdict()
    assert frozen_run.result, "the application ran its last job"
    assert frozen_run.exit_code == 0
    print(f"frozen executor timed out on the servlet after {SERVLET.detected_s:.1f} s")
