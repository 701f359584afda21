"""The Python end of the protocol's grammar (``spark_plugin.jvm.protocol``) without a JVM: what it
reads and what it refuses. ``test_protocol_contract.py`` runs it against the JVM's end."""

from __future__ import annotations

import pytest

from spark_plugin.jvm import protocol
from spark_plugin.jvm.protocol import (
    AppAssigned,
    Collector,
    ExecutorRemoved,
    OutputsLost,
    Pulse,
    ReplacementOutcome,
)


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("p 0", Pulse(0)),
        ("p 12", Pulse(12)),
        ("app app-1", AppAssigned("app-1")),
        ("stop", protocol.STOP),
        ("exiting", protocol.EXITING),
        ("p -1", None),
        ("p", None),
        ("app", None),
        ("stop now", None),
        ("garbage", None),
    ],
)
def test_link_lines(line: str, parsed: object) -> None:
    assert protocol.parse_link_line(line) == parsed


@pytest.mark.parametrize(
    ("line", "parsed"),
    [
        ("executor-removed 1 spark", ExecutorRemoved("1", frozenset(), "")),
        (
            "executor-removed 1 app-end,replaced x",
            ExecutorRemoved("1", frozenset({"app-end", "replaced"}), "x"),
        ),
        ("executor-removed 1 replaced,replaced x", None),
        ("executor-removed 1 spark,replaced x", None),
        ("executor-removed 1 , x", None),
        ("executor-removed 1  x", None),
        ("executor-outputs-lost 2 files-missing 0", OutputsLost("2", "files-missing", 0)),
        ("executor-outputs-lost 2 files-missing", None),
        ("executor-outputs-lost 2 files-missing -1", None),
        ("executor-outputs-lost 2 Files 1", None),
        ("executor-outputs-lost 2 files-missing 1 x", None),
        ("executor-replacement 2 accepted", ReplacementOutcome("2", "accepted")),
        ("executor-replacement 2 ACCEPTED", None),
        ("executor-replacement 2 accepted x", None),
        ("executor-replacement ../2 refused", None),
    ],
)
def test_executor_lines(line: str, parsed: object) -> None:
    assert protocol.parse_executor_line(line) == parsed


def test_a_tasks_line_names_every_collector_percent_encoded() -> None:
    raw = protocol.parse_tasks("tasks 1 2 G1%20Young%20Generation:3:4,%C3%A9:1:0 7:1:0:2:0:-1:5")
    assert raw.collectors == (Collector("G1 Young Generation", 3, 4), Collector("é", 1, 0))
    assert raw.tasks[0].cpu_ms == -1 and raw.tasks[0].running_ms == 5
    for bad in ("tasks 1 2", "tasks 1 2 G1 Young:1:2", "tasks 1 2 a:1", "tasks 1 2 - 1:2:3", "ticks 1 2 -"):
        with pytest.raises(ValueError):
            protocol.parse_tasks(bad)


def test_a_stack_line_is_unescaped() -> None:
    assert protocol.parse_stack("stack 4 a\\nb\\tc\\\\d") == (4, "a\nb\tc\\d")
    assert protocol.parse_stack("stack x a") is None and protocol.parse_stack("stack 4") is None


def test_a_settings_line_without_a_tab_is_none() -> None:
    assert protocol.parse_setting("k\\tx\tv\\n") == ("k\tx", "v\n")
    assert protocol.parse_setting("no tab") is None
