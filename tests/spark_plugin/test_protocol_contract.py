"""Both ends of the JVM <-> Python protocol against each other, for every line kind.

``launcher/.../Protocol.java`` and ``spark_plugin.jvm.protocol`` each declare every line once; here
a small Java main (``java/ProtocolCheck.java``, compiled against the launcher jar, no Spark
application) formats the lines the JVM writes from raw facts, for the Python parsers to read, and
parses the lines Python writes, for the answers to be compared. Malformed lines are refused on the
side that reads them. Needs a JDK and the launcher jar: marked ``spark``, out of ``make unit``.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm import protocol
from spark_plugin.jvm.plugin_metrics import encode
from spark_plugin.jvm.protocol import (
    MAX_METRICS_FIELDS,
    METRICS,
    Age,
    AgentDown,
    AgentNotStarted,
    AppAssigned,
    Collector,
    ExecutorAdded,
    ExecutorRemoved,
    OutputsLost,
    Pulse,
    ReplacementOutcome,
    RmMoved,
    TaskFigures,
)
from spark_plugin.jvm.sidecar import JvmLink
from spark_plugin.monitoring.driver_spark_view import agent_down_detail, parse_line
from spark_plugin.monitoring.executor_task_lines import parse_tasks_line

pytestmark = pytest.mark.spark
ROOT = Path(__file__).parents[2]
LAUNCHER_JAR = Path(
    os.environ.get("ARROWBEAT_LAUNCHER_JAR", ROOT / ".cache" / "launcher" / "arrowbeat-launcher.jar")
)
"""The shared jar, unless ``ARROWBEAT_LAUNCHER_JAR`` names another build (one being checked first)."""
Request = tuple[str, ...]
Jvm = Callable[[list[Request]], list[str]]


@pytest.fixture(scope="module")
def jvm(tmp_path_factory: pytest.TempPathFactory) -> Jvm:
    """Runs requests (a kind and its arguments) through ``ProtocolCheck``; one answer each."""
    if shutil.which("javac") is None or not LAUNCHER_JAR.exists():
        pytest.skip("needs javac and the launcher jar (make .cache/launcher/arrowbeat-launcher.jar)")
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    classpath = ":".join([str(LAUNCHER_JAR), str(jars / "*")])
    classes = tmp_path_factory.mktemp("protocol-check")
    source = Path(__file__).parent / "java" / "ProtocolCheck.java"
    subprocess.run(
        ["javac", "--release", "17", "-cp", classpath, "-d", str(classes), str(source)], check=True
    )
    command = ["java", "-Xmx64m", "-cp", f"{classes}:{classpath}", "arrowbeat.ProtocolCheck"]

    def run(requests: list[Request]) -> list[str]:
        lines = ["\t".join([kind, *(a.encode().hex() for a in args)]) for kind, *args in requests]
        done = subprocess.run(
            command, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        answers = [bytes.fromhex(line).decode() for line in done.stdout.splitlines()]
        assert len(answers) == len(requests), done.stderr
        return answers

    return run


def jvm_writes(jvm: Jvm, *requests: Request) -> list[str]:
    return jvm(list(requests))


# -- the lines the JVM writes, read by Python ---------------------------------------------------


def check_settings(jvm: Jvm) -> None:
    settings = {"spark.app.id": "app-1", "multi": "line\none\ttab\\slash", "empty": "", "é": "ü"}
    (block,) = jvm_writes(jvm, ("settings", *(x for kv in settings.items() for x in kv)))
    assert JvmLink(io.BytesIO(block.encode())).read_settings() == settings


def check_link_lines(jvm: Jvm) -> None:
    pulse, app, stop, exiting, rm, not_rm = jvm_writes(
        jvm,
        ("pulse", "3"),
        ("app", "app-20260101-0001"),
        ("stop",),
        ("exiting",),
        ("rm", "10.0.0.7:40123"),
        ("rm", "10.0.0.7:40123\nARROWBEAT-CMD kill-executor 1"),
    )
    assert protocol.parse_link_line(rm) == RmMoved("10.0.0.7:40123")
    assert not_rm == "-"  # the JVM formats no other
    assert protocol.parse_link_line("rm 10.0.0.7") is None
    assert protocol.parse_link_line(pulse) == Pulse(3)
    assert protocol.parse_link_line(app) == AppAssigned("app-20260101-0001")
    assert protocol.parse_link_line(stop) == protocol.STOP
    assert protocol.parse_link_line(exiting) == protocol.EXITING


def check_executor_lines(jvm: Jvm) -> None:
    lines = jvm_writes(
        jvm,
        ("executor-added", "3", "10.0.0.7"),
        ("executor-removed", "3", "false", "false", "Executor killed by driver."),
        ("executor-removed", "4", "true", "false", ""),
        ("executor-removed", "5", "true", "true", "bidi \u202e\nand a newline" + "x" * 500),
        ("executor-removed", "6", "false", "true", "a  b"),
        ("executor-unmonitored", "7", "interpreter-missing"),
        ("executor-outputs-lost", "8", "agent-exited", "0"),
        ("executor-replacement", "8", "ACCEPTED"),
        ("executor-replacement", "9", "REFUSED"),
        ("executor-replacement", "9", "UNAVAILABLE"),
    )
    parsed = [protocol.parse_executor_line(line) for line in lines]
    assert parsed[:2] == [
        ExecutorAdded("3", "10.0.0.7"),
        ExecutorRemoved("3", frozenset(), "Executor killed by driver."),
    ]
    assert parsed[2] == ExecutorRemoved("4", frozenset({"replaced"}), "")
    cut = parsed[3]
    assert isinstance(cut, ExecutorRemoved) and cut.facts == {"replaced", "app-end"}
    assert cut.reason.startswith("bidi \\u202e\\u000aand") and cut.reason.endswith("...(cut)")
    assert parsed[4] == ExecutorRemoved("6", frozenset({"app-end"}), "a  b")
    assert parsed[5:] == [
        AgentNotStarted("7", "interpreter-missing"),
        OutputsLost("8", "agent-exited", 0),
        ReplacementOutcome("8", "accepted"),
        ReplacementOutcome("9", "refused"),
        ReplacementOutcome("9", "unavailable"),
    ]
    # The driver's view of the same lines: one cause per removal, Spark's text made safe.
    assert [getattr(parse_line(line), "cause", None) for line in lines[1:5]] == [
        "spark",
        "replaced",
        "app-end",
        "app-end",
    ]


def check_agent_down(jvm: Jvm) -> None:
    """An executor plugin's word that its agent exited: formatted by the JVM from the raw facts,
    relayed by the driver plugin, read by the driver-side process (cause made printable, cut)."""
    signal_cause, status_cause = jvm_writes(
        jvm, ("agent-exit-cause", "137", "ignored"), ("agent-exit-cause", "3", "ERROR agent 1 stops: x")
    )
    assert signal_cause == "agent exited (killed by signal 9)"
    assert status_cause == "agent exited (status 3): ERROR agent 1 stops: x"
    lines = jvm_writes(
        jvm,
        ("executor-agent-down", "7", "4242", "0", status_cause),
        ("executor-agent-down", "8", "17", "45000", "é\n" + "x" * 400),
        ("executor-agent-down", "9", "1", "0", ""),
    )
    parsed = [protocol.parse_executor_line(line) for line in lines]
    assert parsed[0] == AgentDown("7", 4242, 0, status_cause)
    cut = parsed[1]
    assert isinstance(cut, AgentDown) and (cut.pid, cut.restart_in_ms) == (17, 45000)
    assert cut.cause.startswith("\\u00e9\\u000a") and cut.cause.endswith("...(cut)")
    assert parsed[2] == AgentDown("9", 1, 0, "-")
    relayed = jvm([("plugin-message", line) for line in lines])
    assert relayed == lines  # the driver plugin passes each on unchanged
    bad = [
        "executor-agent-down driver 1 0 x",
        "executor-agent-down 7 -1 0 x",
        "executor-agent-down 7 1 0 ",
        "executor-agent-down 7 1 0 " + "x" * 200,
        "executor-agent-down 7 1 0 tab\there",
    ]
    assert jvm([("plugin-message", line) for line in bad]) == ["-"] * len(bad)
    assert [protocol.parse_executor_line(line) for line in bad[1:4]] == [None] * 3
    assert [agent_down_detail(d) for d in parsed[:2] if isinstance(d, AgentDown)] == [
        f"{status_cause}; restarting it",
        f"{cut.cause}; restarting it in 45 s (restarts are rate-limited)",
    ]


def check_tasks(jvm: Jvm) -> None:
    collectors = [("G1 Young Generation", "7", "1200"), ("G1 Concurrent GC", "3", "900"), ("é:,%", "1", "5")]
    tasks = [("42", "3", "1", "5", "2", "870", "9100"), ("43", "3", "1", "6", "0", "-1", "10")]
    line, empty = jvm_writes(
        jvm,
        (
            "tasks",
            "5300",
            "99000",
            str(len(collectors)),
            *(x for c in collectors for x in c),
            *(x for t in tasks for x in t),
        ),
        ("tasks", "-1", "5", "0"),
    )
    raw = protocol.parse_tasks(line)
    assert raw.cpu_ms == 5300 and raw.jvm_ms == 99000
    assert raw.collectors == (
        Collector("G1 Young Generation", 7, 1200),
        Collector("G1 Concurrent GC", 3, 900),
        Collector("é:,%", 1, 5),
    )
    assert raw.tasks == (TaskFigures(42, 3, 1, 5, 2, 870, 9100), TaskFigures(43, 3, 1, 6, 0, -1, 10))
    sample = parse_tasks_line(line)  # the agent's reading: only pausing collectors count
    assert (sample.gc_count, sample.gc_s, sample.cpu_s, sample.jvm_s) == (8, 1.205, 5.3, 99.0)
    assert protocol.parse_tasks(empty) == protocol.TasksLine(-1, 5, (), ())


def check_stack(jvm: Jvm) -> None:
    text = 'JVM thread "Executor task 1" RUNNABLE\n  at a.b(C.java:1)\tand \\ a backslash'
    line, gone = jvm_writes(jvm, ("stack", "42", text), ("stack", "43"))
    assert protocol.parse_stack(line) == (42, text)
    assert protocol.parse_stack(gone) == (43, "-")


# -- the lines Python writes, read by the JVM ---------------------------------------------------


def check_ready(jvm: Jvm) -> None:
    from spark_plugin.settings import tls

    fields = {
        "address": "127.0.0.1:7077",
        "pid": 12,
        "pulse_ms": 500,
        **tls.ready_fields(tls.generate_self_signed()),
    }
    good = protocol.ready_line(fields)
    bad = [good + " x=", "ARROWBEAT-READY Bad=1", "ARROWBEAT-READY " + " ".join(f"k={i}" for i in range(17))]
    answers = jvm([("ready", line) for line in [good, *bad]])
    assert (
        answers[0]
        == "{" + ", ".join(f"{k}={v}" for k, v in sorted((k, str(v)) for k, v in fields.items())) + "}"
    )
    assert answers[1:] == ["-"] * len(bad)
    with pytest.raises(JvmCommandError):
        protocol.ready_line({f"k{i}": i for i in range(17)})


def check_commands(jvm: Jvm) -> None:
    good = [
        protocol.command_line(protocol.KILL_EXECUTOR, "3"),
        protocol.command_line(protocol.KILL_EXECUTOR, "exec-1.a_b"),
        protocol.command_line(protocol.LOST_EXECUTOR, "7"),
        protocol.command_line(protocol.DECOMMISSION_EXECUTOR, "9"),
        protocol.command_line(protocol.OUTPUTS_LOST, "files-missing"),
        protocol.command_line(protocol.JSTACK, 42),
        protocol.command_line(protocol.KILL_TASK, 10**18 - 1),
        protocol.command_line(protocol.RM_UNREACHABLE, "10.0.0.7:40123"),
        protocol.command_line(protocol.RM_UNREACHABLE, "[::1]:7077"),
    ]
    bad = [
        "ARROWBEAT-CMD kill-executor driver",
        "ARROWBEAT-CMD kill-executor ../1",
        "ARROWBEAT-CMD kill-executor 1 2",
        "ARROWBEAT-CMD lost-executor driver",
        "ARROWBEAT-CMD outputs-lost Files",
        "ARROWBEAT-CMD jstack -1",
        "ARROWBEAT-CMD kill-task " + "1" * 19,
        "ARROWBEAT-CMD reboot now",
        "ARROWBEAT-CMD rm-unreachable 10.0.0.7",
        "ARROWBEAT-CMD rm-unreachable a:1;b",
        "ARROWBEAT-CMDX kill-executor 1",
    ]
    answers = jvm([("command", line) for line in [*good, *bad]])
    assert answers[: len(good)] == [line.removeprefix("ARROWBEAT-CMD ") for line in good]
    assert answers[len(good) :] == ["-"] * len(bad)
    refused: list[tuple[str, str | int]] = [
        (protocol.KILL_EXECUTOR, "driver"),
        (protocol.KILL_EXECUTOR, "../1"),
        (protocol.LOST_EXECUTOR, "driver"),
        (protocol.DECOMMISSION_EXECUTOR, "driver"),
        (protocol.OUTPUTS_LOST, "Files"),
        (protocol.JSTACK, -1),
        (protocol.KILL_TASK, 10**18),
        (protocol.RM_UNREACHABLE, "10.0.0.7 :1"),
        ("reboot", "now"),
    ]
    for verb, argument in refused:
        with pytest.raises(JvmCommandError):
            protocol.command_line(verb, argument)


def check_metrics(jvm: Jvm) -> None:
    good = encode(
        1,
        {"executors.running": 2, "executor.7.rttMs": 1.5, "executor.7.heartbeatAgeMs": Age(10)},
        "driver",
    )
    assert "executor.7.heartbeatAgeMs=10+" in good[0] and "executor.7.rttMs=1.5 " in good[0] + " "
    bad = [
        f"{METRICS} 2 executors.running=1e3",  # numbers only, no exponent
        f"{METRICS} 2 executors.running=NaN",
        f"{METRICS} 2 executors.running=1 executors.running=2",  # a name twice
        f"{METRICS} 2 shuffle.poolUsedBytes=1",  # an executor's name on the driver
        f"{METRICS} 2 executor.7.rssBytes=1",
        f"{METRICS} 2 executor.a.b.rttMs=1",
        f"{METRICS} x executors.running=1",
        f"{METRICS} 2",
        f"{METRICS} 2 executors.running=1 ",  # an empty field
        f"{METRICS}  2 executors.running=1",
        f"{METRICS} 2 executors.running=1++",
        f"{METRICS} 2 executors.running=+1",
        f"{METRICS} 2 " + " ".join(f"executor.{i}.rttMs=1" for i in range(MAX_METRICS_FIELDS + 1)),
        "ARROWBEAT-METRICSX 2 executors.running=1",
    ]
    answers = jvm(
        [
            *(("metrics", line) for line in [*good, *bad]),
            *(("gauge", name) for name in ("executors.running", "executor.7.rttMs", "executor.0.rttMs")),
        ]
    )
    assert answers[: len(good)] == ["accepted"] * len(good)
    assert answers[len(good) : -3] == ["refused"] * len(bad)
    assert answers[-3:] == ["2.0", "1.5", "absent"]  # nothing of a refused line was applied


def check_metrics_snapshots_and_ages(jvm: Jvm) -> None:
    answers = jvm(
        [
            ("metrics", f"{METRICS} 1 executor.1.heartbeatAgeMs=100+ executor.2.heartbeatAgeMs=100+"),
            ("metrics", f"{METRICS} 2 executor.1.heartbeatAgeMs=100+"),  # snapshot 1 was complete: both stay
            ("gauge", "executor.2.heartbeatAgeMs"),
            (
                "metrics",
                f"{METRICS} 3 executor.1.heartbeatAgeMs=100+ executor.1.rttMs=100",
            ),  # executor 2 goes
            ("gauge", "executor.2.heartbeatAgeMs"),
            ("gauge", "executor.1.heartbeatAgeMs"),
            ("gauge", "executor.1.rttMs"),
        ]
    )
    assert answers[:2] == ["accepted", "accepted"]
    assert float(answers[2]) >= 100.0
    assert answers[3:5] == ["accepted", "absent"]
    assert float(answers[5]) > 100.0  # an age: the time since the line arrived is added
    assert answers[6] == "100.0"  # not an age: as sent


def check_alive(jvm: Jvm) -> None:
    """The driver-side process's answer to a pulse: the JVM reads the two figures it hands a
    restarted process (``history.gaps``), and refuses anything else."""
    good = [protocol.alive_line(1_767_225_600_123, 42), protocol.alive_line(0, 0)]
    bad = [
        f"{protocol.ALIVE} 1 2 3",
        f"{protocol.ALIVE} -1 2",
        f"{protocol.ALIVE} 1",
        f"{protocol.ALIVE} {'9' * 16} 0",
        f"{protocol.ALIVE}X 1 2",
        f"{protocol.ALIVE}  1 2",
    ]
    answers = jvm([("alive", line) for line in [*good, *bad]])
    assert answers == ["1767225600123 42", "0 0", *["-"] * len(bad)]
    for complete, unsaved in ((-1, 0), (0, 10**15), (True, 0), (1.5, 0)):
        with pytest.raises(JvmCommandError):
            protocol.alive_line(complete, unsaved)  # type: ignore[arg-type]


def check_plugin_messages(jvm: Jvm) -> None:
    """Between the two plugins (Java only): what reaches the driver-side process is a line of
    Python's grammar, and anything malformed reaches nothing."""
    sent = jvm_writes(
        jvm,
        ("executor-outputs-lost", "8", "files-missing", "12"),
        ("executor-unmonitored", "7", "start-failed"),
    )
    lost, not_started, *bad = jvm(
        [
            *(("plugin-message", line) for line in sent),
            ("plugin-message", "executor-outputs-lost driver files-missing 1"),
            ("plugin-message", "executor-outputs-lost 8 files-missing"),
            ("plugin-message", "executor-outputs-lost 8 Files 1"),
            ("plugin-message", "executor-unmonitored 7 start failed"),
            ("plugin-message", "ARROWBEAT-CMD kill-executor 1"),
        ]
    )
    assert protocol.parse_executor_line(lost) == OutputsLost("8", "files-missing", 12)
    assert protocol.parse_executor_line(not_started) == AgentNotStarted("7", "start-failed")
    assert bad == ["-"] * 5


CHECKS: dict[str, Callable[[Jvm], None]] = {
    "settings": check_settings,
    "pulse": check_link_lines,
    "app": check_link_lines,
    "rm": check_link_lines,
    "stop": check_link_lines,
    "exiting": check_link_lines,
    "executor-added": check_executor_lines,
    "executor-removed": check_executor_lines,
    "executor-unmonitored": check_executor_lines,
    "executor-agent-down": check_agent_down,
    "executor-outputs-lost": check_executor_lines,
    "executor-replacement": check_executor_lines,
    "tasks": check_tasks,
    "stack": check_stack,
    "ready": check_ready,
    "command": check_commands,
    "metrics": check_metrics,
    "alive": check_alive,
    "plugin-message": check_plugin_messages,
}


def _name(check: object) -> str:
    return getattr(check, "__name__", str(check))


def test_every_line_kind_of_both_sides_has_a_check(jvm: Jvm) -> None:
    (kinds,) = jvm([("kinds",)])
    assert set(kinds.split(" ")) == set(CHECKS) == protocol.KINDS | {"plugin-message"}


@pytest.mark.parametrize("check", sorted(set(CHECKS.values()), key=_name), ids=_name)
def test_both_ends_agree(jvm: Jvm, check: Callable[[Jvm], None]) -> None:
    check(jvm)


def test_metric_snapshots_and_ages_on_the_jvm(jvm: Jvm) -> None:
    check_metrics_snapshots_and_ages(jvm)
