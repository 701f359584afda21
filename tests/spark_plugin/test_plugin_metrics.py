"""The figures of Spark's metrics system (``spark_plugin.jvm.plugin_metrics``) and how the Python
processes encode them; what the JVM's ``PluginMetrics`` makes of the lines is checked against it in
``test_protocol_contract.py``."""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from heartbeat import EventKind, ExecutorEvent
from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm.plugin_metrics import (
    DRIVER_METRICS,
    EXECUTOR_METRICS,
    LivenessTally,
    MetricsReporter,
    driver_figures,
    encode,
    executor_figures,
)
from spark_plugin.jvm.protocol import MAX_METRICS_FIELDS as MAX_FIELDS
from spark_plugin.jvm.protocol import MAX_METRICS_LINE_BYTES as MAX_LINE_BYTES
from spark_plugin.jvm.protocol import METRICS as PREFIX
from spark_plugin.jvm.protocol import Age
from spark_plugin.jvm.protocol import metric_number as number
from spark_plugin.jvm.sidecar import JvmChannel


@dataclass(frozen=True)
class Info:
    """The fields of ``heartbeat.ExecutorInfo`` that the figures read."""

    executor_id: str
    state: str
    registered_at: float
    last_heartbeat: float | None
    last_rtt_ms: float | None


def event(kind: EventKind, executor_id: str) -> ExecutorEvent:
    return ExecutorEvent(kind, executor_id, "h", "i", 0.0, "")


def test_numbers_are_decimal_and_bounded() -> None:
    assert [number(v) for v in (2, 2.0, 0.5, 1234.56789, -0.0001, 0)] == [
        "2",
        "2",
        "0.5",
        "1234.568",
        "0",
        "0",
    ]
    for bad in (math.inf, math.nan, 10.0**18, True, "1"):
        with pytest.raises(JvmCommandError):
            number(bad)  # type: ignore[arg-type]
    assert [number(Age(v)) for v in (2, 0.5, -0.0001)] == ["2+", "0.5+", "0+"]  # an age is marked


def test_a_snapshot_is_split_into_bounded_lines_with_one_number() -> None:
    figures: dict[str, float | None] = {f"executor.{i}.heartbeatAgeMs": 1000.0 + i for i in range(300)}
    figures["executors.running"] = 300
    figures["executor.9999.rttMs"] = None  # unknown: left out
    lines = encode(7, figures, "driver")
    assert len(lines) > 1
    fields = [f for line in lines for f in line.split(" ")[2:]]
    assert all(line.startswith(f"{PREFIX} 7 ") for line in lines)
    assert all(len(line) <= MAX_LINE_BYTES and len(line.split(" ")) - 2 <= MAX_FIELDS for line in lines)
    assert len(fields) == 301 and "executors.running=300" in fields
    assert not any(f.startswith("executor.9999.") for f in fields)


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("executors.running", "executor"),  # a driver name from an executor
        ("shuffle.poolUsedBytes", "driver"),
        ("executor.1.heartbeatAgeMs", "executor"),
        ("executor.1.2.rttMs", "driver"),  # dots in an id
        ("executor.1.rssBytes", "driver"),
        ("executors.running x", "driver"),
        ("executors.running=1", "driver"),
    ],
)
def test_names_the_jvm_would_refuse_are_never_encoded(name: str, role: str) -> None:
    with pytest.raises(JvmCommandError):
        encode(1, {name: 1.0}, role)


def test_driver_figures_count_states_and_age_each_watched_executor() -> None:
    tally = LivenessTally()
    for kind, executor in [
        (EventKind.REGISTERED, "1"),
        (EventKind.HEARTBEAT_TIMEOUT, "1"),
        (EventKind.REREGISTERED, "1"),
        (EventKind.UNREACHABLE, "3"),
        (EventKind.SPARK_LOST, "3"),
    ]:
        tally(event(kind, executor))
    executors = [
        Info("1", "RUNNING", 90.0, 99.5, 1.25),
        Info("2", "TIMEOUT", 90.0, 95.0, 2.0),
        Info("3", "UNREACHABLE", 90.0, 96.0, 3.0),  # Spark lost it: no gauges
        Info("4", "RUNNING", 98.0, None, None),  # never answered: aged from its registration
        Info("5", "UNMONITORED", 97.0, None, None),
        Info("6", "UNREGISTERED", 90.0, 91.0, 1.0),
    ]
    stats = {"heartbeats": {"buffered": 3, "dropped": 1}, "executor_events": {"buffered": 2, "dropped": 0}}
    figures = driver_figures(executors, tally, stats, now=100.0)
    assert figures == {
        "executors.running": 2.0,
        "executors.timedOut": 1.0,
        "executors.unreachable": 1.0,
        "executors.unmonitored": 1.0,
        "executor.1.heartbeatAgeMs": 500.0,
        "executor.1.rttMs": 1.25,
        "executor.2.heartbeatAgeMs": 5000.0,
        "executor.2.rttMs": 2.0,
        "executor.4.heartbeatAgeMs": 2000.0,
        "executor.4.rttMs": None,
        "events.heartbeatTimeout": 1.0,
        "events.unreachable": 1.0,
        "events.reregistered": 1.0,
        "events.shuffleCorrupt": 0.0,
        "events.degraded": 0.0,
        "events.recovered": 0.0,
        "executors.degraded": 0.0,
        "history.rowsBuffered": 5.0,
        "history.rowsDropped": 1.0,
    }
    # The heartbeat ages are ages for the JVM's gauges (they keep growing between lines); nothing else is.
    assert {name for name, value in figures.items() if isinstance(value, Age)} == {
        "executor.1.heartbeatAgeMs",
        "executor.2.heartbeatAgeMs",
        "executor.4.heartbeatAgeMs",
    }
    lines = encode(1, figures, "driver")  # every name is one the JVM takes
    assert "executor.1.heartbeatAgeMs=500+" in lines[0].split(" ")
    assert "executor.1.rttMs=1.25" in lines[0].split(" ")


def test_a_restarted_rms_counters_go_on_from_the_recorded_events() -> None:
    """Spark's ``events.*`` counters never go back to zero when the driver-side process restarts:
    the new process replays what the old one recorded, then counts on."""
    before = LivenessTally()
    recorded = [
        ("REGISTERED", "1"),
        ("HEARTBEAT_TIMEOUT", "1"),
        ("REREGISTERED", "1"),
        ("UNREACHABLE", "2"),
        ("SPARK_LOST", "2"),
        ("TASK_STUCK", "1"),
        ("SHUFFLE_CORRUPT", "1"),
        ("DEGRADED", "1"),
        ("DEGRADED", "3"),
        ("RECOVERED", "3"),
    ]
    for kind, executor in recorded:
        before(event(EventKind(kind), executor))
    after = LivenessTally()
    after.replay(recorded)
    assert (
        after.counts()
        == before.counts()
        == {
            "events.heartbeatTimeout": 1,
            "events.unreachable": 1,
            "events.reregistered": 1,
            "events.shuffleCorrupt": 1,
            "events.degraded": 2,
            "events.recovered": 1,
        }
    )
    assert after.degraded() == before.degraded() == 1  # executor 1, until it recovers or goes
    assert after.gone("2") and not after.gone("1")
    after(event(EventKind.HEARTBEAT_TIMEOUT, "1"))
    assert after.counts()["events.heartbeatTimeout"] == 2
    after(event(EventKind.SPARK_REMOVED, "1"))
    assert after.degraded() == 0


def test_the_gray_failure_gauges_travel_on_a_line_of_their_own() -> None:
    """A launcher jar older than them refuses the line with the DEGRADED gauges, never the rest."""
    lines = encode(3, {"executors.running": 2.0, "executors.degraded": 1.0, "events.degraded": 1.0}, "driver")
    assert lines == [
        "ARROWBEAT-METRICS 3 executors.running=2",
        "ARROWBEAT-METRICS 3 executors.degraded=1 events.degraded=1",
    ]
    assert encode(4, {"executors.running": 2.0}, "driver") == ["ARROWBEAT-METRICS 4 executors.running=2"]


def test_executor_figures_map_the_agents_shuffle_figures() -> None:
    agent = {
        "shuffle_pool_used_bytes": 4096.0,
        "shuffle_bytes_staged": 10.0,
        "shuffle_stream_wait_total_s": 0.25,
        "shuffle_outputs_corrupt": 2.0,
    }
    assert executor_figures(agent) == {
        "shuffle.poolUsedBytes": 4096.0,
        "shuffle.bytesServed": 10.0,
        "shuffle.poolWaitMs": 250.0,
        "shuffle.corruptOutputs": 2.0,
    }
    assert executor_figures({}) == {}
    encode(1, executor_figures(agent), "executor")


def test_the_reporter_numbers_snapshots_and_survives_a_failing_one() -> None:
    out = io.BytesIO()
    channel = JvmChannel(out)
    calls: Iterator[dict[str, float | None] | Exception] = iter(
        [{"executors.running": 1.0}, RuntimeError("boom"), {"executors.running": 2.0}]
    )

    def figures() -> dict[str, float | None]:
        item = next(calls)
        if isinstance(item, Exception):
            raise item
        return item

    reporter = MetricsReporter(figures, lambda n, f: channel.metrics(n, f, "driver"), 60.0)
    for _ in range(3):
        reporter.send_one()
    assert out.getvalue().decode().splitlines() == [
        f"{PREFIX} 1 executors.running=1",
        f"{PREFIX} 3 executors.running=2",
    ]


def test_the_jvm_takes_the_same_fixed_names() -> None:
    """Without a JVM: ``PluginMetrics.java``'s fixed name sets are the lists here (a name only one
    side has is refused by the JVM, or never sent)."""
    java = (Path(__file__).parents[2] / "launcher/src/main/java/arrowbeat/PluginMetrics.java").read_text()

    def names(field: str) -> set[str]:
        found = re.search(rf"Set<String> {field} =\s*Set\.of\(([^)]*)\);", java)
        assert found is not None, field
        return set(re.findall(r'"([^"]+)"', found[1]))

    assert names("EXECUTOR") == EXECUTOR_METRICS
    assert names("DRIVER") == DRIVER_METRICS
    assert "shuffle.corruptOutputs" in EXECUTOR_METRICS
