"""Spark's view of its executors without Spark: the JVM's lines parsed strictly, Spark 4.0's
removal reasons classified, the view applied to a fake RM, and the JVM link routing the lines."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from harness.procs import wait_until
from heartbeat import EventKind
from spark_plugin.jvm.sidecar import JvmLink
from spark_plugin.monitoring.driver_spark_view import (
    AgentNotStarted,
    ExecutorAdded,
    ExecutorRemoved,
    SparkView,
    classify,
    parse_line,
)
from spark_plugin.processes.driver import dynamic_allocation


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("executor-added 3 10.0.0.7", ExecutorAdded("3", "10.0.0.7")),
        ("executor-added driver localhost", ExecutorAdded("driver", "localhost")),
        ("executor-added 1 [::1]", ExecutorAdded("1", "[::1]")),
        (
            "executor-removed 2 spark Executor killed by driver.",
            ExecutorRemoved("2", "spark", "Executor killed by driver."),
        ),
        ("executor-removed 2 replaced", ExecutorRemoved("2", "replaced", "")),
        ("executor-removed 2 app-end a  b", ExecutorRemoved("2", "app-end", "a  b")),
        ("executor-unmonitored 4 interpreter-missing", AgentNotStarted("4", "interpreter-missing")),
    ],
)
def test_well_formed_lines_parse(line: str, parsed: object) -> None:
    assert parse_line(line) == parsed


@pytest.mark.parametrize(
    "line",
    [
        "executor-added",
        "executor-added 3",
        "executor-added 3 host extra",
        "executor-added ../3 host",
        "executor-added 3 ho\u202est",
        "executor-added 3 host;rm",
        "executor-removed 3",
        "executor-removed 3 crashed because",
        "executor-removed -3 spark x",
        "executor-removed " + "9" * 65 + " spark x",
        "executor-unmonitored 4 Interpreter",
        "executor-unmonitored 4",
        "executor-removed 3 spark " + "x" * 1100,
        "executor-gone 3",
        "p 1",
    ],
)
def test_anything_else_is_refused(line: str) -> None:
    assert parse_line(line) is None


def test_a_reason_from_spark_is_one_bounded_printable_line() -> None:
    parsed = parse_line("executor-removed 3 spark " + "bidi \u202e and " + "x" * 900)
    assert isinstance(parsed, ExecutorRemoved)
    assert parsed.reason.isprintable() and "\\u202e" in parsed.reason and len(parsed.reason) <= 520


# Spark 4.0's reason texts (ExecutorLossReason and its subclasses, HeartbeatReceiver, the
# coarse-grained backend's disconnect), and what the JVM knows beyond them (the cause).
@pytest.mark.parametrize(
    ("cause", "reason", "dyn", "kind", "detail"),
    [
        (
            "spark",
            "Executor killed by driver.",
            True,
            EventKind.SPARK_REMOVED,
            "removed by Spark (idle, dynamic allocation): Executor killed by driver.",
        ),
        (
            "spark",
            "Executor killed by driver.",
            False,
            EventKind.SPARK_REMOVED,
            "removed by Spark (killed by the driver): Executor killed by driver.",
        ),
        (
            "spark",
            "Executor decommission: worker decommissioned",
            True,
            EventKind.SPARK_REMOVED,
            "removed by Spark (decommissioned): Executor decommission: worker decommissioned",
        ),
        (
            "replaced",
            "Remote RPC client disassociated.",
            False,
            EventKind.SPARK_REMOVED,
            "replaced by Spark at arrowbeat's request: Remote RPC client disassociated.",
        ),
        (
            "app-end",
            "Remote RPC client disassociated.",
            True,
            EventKind.SPARK_REMOVED,
            "removed by Spark (the application is stopping): Remote RPC client disassociated.",
        ),
        (
            "spark",
            "Command exited with code 137",
            True,
            EventKind.SPARK_LOST,
            "lost (crash): Command exited with code 137",
        ),
        (
            "spark",
            "Remote RPC client disassociated. Likely due to containers exceeding thresholds, or "
            "network issues. Check driver logs for WARN messages.",
            True,
            EventKind.SPARK_LOST,
            "lost (crash): Remote RPC client disassociated. Likely due to containers exceeding "
            "thresholds, or network issues. Check driver logs for WARN messages.",
        ),
        (
            "spark",
            "Executor heartbeat timed out after 130023 ms",
            False,
            EventKind.SPARK_LOST,
            "lost (no heartbeat reached Spark): Executor heartbeat timed out after 130023 ms",
        ),
        (
            "spark",
            "Worker lost",
            False,
            EventKind.SPARK_LOST,
            "lost (its host's Worker was lost): Worker lost",
        ),
        ("spark", "", False, EventKind.SPARK_LOST, "lost (crash): (Spark gave no reason)"),
    ],
)
def test_removals_are_classified(cause: str, reason: str, dyn: bool, kind: EventKind, detail: str) -> None:
    assert classify(ExecutorRemoved("1", cause, reason), dyn) == (kind, detail)


@dataclass
class FakeRm:
    calls: list[tuple[object, ...]] = field(default_factory=list)

    def executor_started(self, executor_id: str, host: str, within_s: float) -> None:
        self.calls.append(("started", executor_id, host, within_s))

    def agent_not_started(self, executor_id: str, reason: str) -> None:
        self.calls.append(("not-started", executor_id, reason))

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None:
        self.calls.append(("agent-down", executor_id, pid, detail))

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None:
        self.calls.append(("removed", executor_id, kind, detail))


def test_the_view_drives_the_rm_and_logs_a_malformed_line(caplog: pytest.LogCaptureFixture) -> None:
    rm = FakeRm()
    view = SparkView(rm, register_within_s=32.0, dynamic_allocation=True)
    view("executor-added 1 h1")
    view("executor-removed 1 spark Executor killed by driver.")
    view("executor-unmonitored 2 start-failed")
    view("executor-added 1 h1\nARROWBEAT-CMD kill-executor 2")
    assert rm.calls == [
        ("started", "1", "h1", 32.0),
        (
            "removed",
            "1",
            EventKind.SPARK_REMOVED,
            "removed by Spark (idle, dynamic allocation): Executor killed by driver.",
        ),
        ("not-started", "2", "start-failed"),
    ]
    [record] = [r for r in caplog.records if "malformed Spark-view line" in r.getMessage()]
    assert "\n" not in record.getMessage()


def test_dynamic_allocation_comes_from_the_setting_the_driver_plugin_hands_over() -> None:
    assert dynamic_allocation({"spark.dynamicAllocation.enabled": "True"})
    assert not dynamic_allocation({"spark.dynamicAllocation.enabled": "false"})
    assert not dynamic_allocation({})


def test_the_link_hands_executor_lines_to_the_view_and_pulses_on() -> None:
    seen: list[str] = []
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as writer:
        link = JvmLink(reader)
        link.on_executor_lines(seen.append)
        link.start()
        writer.write(b"executor-added 1 h\np 3\nexecutor-removed 1 spark Executor killed by driver.\n")
        assert wait_until(lambda: len(seen) == 2 and link.running_tasks() == 3, timeout_s=10)
    assert link.gone.wait(10.0)
    assert seen == ["executor-added 1 h", "executor-removed 1 spark Executor killed by driver."]


def test_a_failing_view_does_not_end_the_link() -> None:
    def broken(line: str) -> None:
        raise RuntimeError("a bug in the view")

    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb", buffering=0) as writer:
        link = JvmLink(reader)
        link.on_executor_lines(broken)
        link.start()
        writer.write(b"executor-added 1 h\np 5\n")
        assert wait_until(lambda: link.running_tasks() == 5, timeout_s=10)
        assert not link.gone.is_set()
