"""The decisions the JVM launcher used to take, now on the Python side and on a fake clock: the
lost-output replacement budget, the cause of a Spark removal, which collectors pause the
application, which metrics are ages. The JVM reports facts and executes what is decided here."""

from __future__ import annotations

import logging

import pytest

from arrowbeat_base.clock import ManualClock
from heartbeat import EventKind
from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm import protocol
from spark_plugin.jvm.protocol import OutputsLost, ReplacementOutcome
from spark_plugin.monitoring.driver_lost_outputs import MAX_REPLACEMENTS, WINDOW_S, LostOutputs
from spark_plugin.monitoring.driver_spark_view import SparkView, removal_cause
from spark_plugin.monitoring.executor_task_lines import parse_tasks_line, pauses_the_application


class Kills:
    """A fake ``JvmChannel.kill_executor``: records the ids, refuses those the JVM would."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, executor_id: str) -> None:
        protocol.command_line(protocol.KILL_EXECUTOR, executor_id)  # raises as the channel does
        self.asked.append(executor_id)


def lost(executor_id: str, reason: str = "files-missing", tasks_started: int = 3) -> OutputsLost:
    return OutputsLost(executor_id, reason, tasks_started)


def test_the_budget_is_five_replacements_per_ten_minutes() -> None:
    assert (MAX_REPLACEMENTS, WINDOW_S) == (5, 600.0)  # the launcher's numbers, unchanged
    clock, kills = ManualClock(start=1000.0), Kills()
    policy = LostOutputs(kills, clock)
    for n in range(5):
        assert policy.on_lost(lost(str(n)))
        clock.jump(10.0)
    assert not policy.on_lost(lost("5"))  # the sixth within 600 s: refused
    assert kills.asked == ["0", "1", "2", "3", "4"]
    clock.set(1000.0 + WINDOW_S)  # the first charge is exactly 600 s old: it still counts
    assert not policy.on_lost(lost("5"))
    clock.jump(0.001)  # older than the window: its room is free again
    assert policy.on_lost(lost("5")) and kills.asked[-1] == "5"
    assert policy.charged() == 5


def test_only_replacements_spark_accepted_use_up_the_budget() -> None:
    clock, kills = ManualClock(start=0.0), Kills()
    policy = LostOutputs(kills, clock)
    for n in range(5):
        assert policy.on_lost(lost(str(n)))
    policy.on_outcome(ReplacementOutcome("0", "refused"))
    policy.on_outcome(ReplacementOutcome("1", "unavailable"))
    policy.on_outcome(ReplacementOutcome("2", "accepted"))
    policy.on_outcome(ReplacementOutcome("7", "refused"))  # a heartbeat-timeout kill: not ours
    policy.on_outcome(ReplacementOutcome("0", "refused"))  # a second outcome gives nothing back
    assert policy.charged() == 3
    assert policy.on_lost(lost("5")) and policy.on_lost(lost("6"))
    assert not policy.on_lost(lost("8"))


def test_a_loss_is_taken_once_per_executor_and_a_refused_one_may_ask_again() -> None:
    clock, kills = ManualClock(start=0.0), Kills()
    policy = LostOutputs(kills, clock, max_replacements=1)
    assert policy.on_lost(lost("1", "files-missing"))
    assert not policy.on_lost(lost("1", "agent-exited"))  # already being replaced
    policy.on_outcome(ReplacementOutcome("1", "refused"))  # the budget is given back, not the loss
    assert not policy.on_lost(lost("1", "agent-exited"))
    assert policy.charged() == 0 and kills.asked == ["1"]
    assert policy.on_lost(lost("2"))
    assert not policy.on_lost(lost("3"))  # over budget: not taken...
    clock.jump(WINDOW_S + 1)
    assert policy.on_lost(lost("3"))  # ...so a later loss of the same executor asks again
    policy.forget("1")  # Spark removed executor 1: a loss reported after that is a new one
    clock.jump(WINDOW_S + 1)
    assert policy.on_lost(lost("1"))
    assert kills.asked == ["1", "2", "3", "1"]


def test_an_executor_that_never_ran_a_task_loses_no_outputs(caplog: pytest.LogCaptureFixture) -> None:
    kills = Kills()
    policy = LostOutputs(kills, ManualClock(start=0.0))
    with caplog.at_level(logging.ERROR, "arrowbeat.lost_outputs"):
        assert not policy.on_lost(lost("1", "agent-exited", tasks_started=0))
    assert kills.asked == [] and policy.charged() == 0
    assert "no task ran there" in caplog.text
    assert policy.on_lost(lost("1", "agent-exited", tasks_started=1))


def test_an_id_the_jvm_would_refuse_charges_nothing() -> None:
    def refuse(executor_id: str) -> None:
        raise JvmCommandError("not a Spark id")

    policy = LostOutputs(refuse, ManualClock(start=0.0))
    assert not policy.on_lost(lost("driver"))
    assert policy.charged() == 0


def test_the_budget_exhausted_is_logged_with_its_numbers(caplog: pytest.LogCaptureFixture) -> None:
    policy = LostOutputs(Kills(), ManualClock(start=0.0), max_replacements=2)
    policy.on_lost(lost("1"))
    policy.on_lost(lost("2"))
    with caplog.at_level(logging.ERROR, "arrowbeat.lost_outputs"):
        assert not policy.on_lost(lost("3", "agent-exited"))
    assert (
        "executor 3 lost its map outputs (agent-exited), but 2 executors were already replaced" in caplog.text
    )
    assert "in the last 600 s; not replacing it" in caplog.text


class FakeRm:
    def __init__(self) -> None:
        self.removed: list[tuple[str, EventKind, str]] = []

    def executor_started(self, executor_id: str, host: str, within_s: float) -> None:
        pass

    def agent_not_started(self, executor_id: str, reason: str) -> None:
        pass

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None:
        pass

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None:
        self.removed.append((executor_id, kind, detail))


def test_the_view_hands_losses_and_outcomes_to_the_policy_and_forgets_removed_executors() -> None:
    clock, kills, rm = ManualClock(start=0.0), Kills(), FakeRm()
    policy = LostOutputs(kills, clock, max_replacements=1)
    view = SparkView(rm, 30.0, dynamic_allocation=False, lost_outputs=policy)
    view("executor-outputs-lost 4 files-missing 2")
    view("executor-outputs-lost 4 agent-exited 2")
    assert kills.asked == ["4"]
    view("executor-replacement 4 unavailable")
    assert policy.charged() == 0
    view("executor-removed 4 replaced Executor killed by driver.")
    assert rm.removed == [
        (
            "4",
            EventKind.SPARK_REMOVED,
            "replaced by Spark at arrowbeat's request: Executor killed by driver.",
        )
    ]
    view("executor-outputs-lost 4 files-missing 2")  # forgotten with its removal
    assert kills.asked == ["4", "4"]


@pytest.mark.parametrize(
    ("facts", "cause"),
    [
        (frozenset(), "spark"),
        (frozenset({"replaced"}), "replaced"),
        (frozenset({"app-end"}), "app-end"),
        (frozenset({"replaced", "app-end"}), "app-end"),  # the application's end comes first
    ],
)
def test_the_cause_of_a_removal_comes_from_the_jvms_facts(facts: frozenset[str], cause: str) -> None:
    assert removal_cause(facts) == cause


def test_a_replaced_executor_removed_while_the_application_ends_is_recorded_as_the_end() -> None:
    rm = FakeRm()
    SparkView(rm, 30.0, dynamic_allocation=False)("executor-removed 2 replaced,app-end Executor lost")
    assert rm.removed == [
        ("2", EventKind.SPARK_REMOVED, "removed by Spark (the application is stopping): Executor lost")
    ]


@pytest.mark.parametrize(
    ("collector", "pauses"),
    [
        ("G1 Young Generation", True),
        ("G1 Old Generation", True),
        ("G1 Concurrent GC", False),
        ("ZGC Cycles", False),
        ("ZGC Pauses", True),
        ("ZGC Minor Cycles", False),
        ("ZGC Major Pauses", True),
        ("Shenandoah Cycles", False),
        ("Shenandoah Pauses", True),
        ("PS Scavenge", True),
        ("PS MarkSweep", True),
        ("Copy", True),
        ("MarkSweepCompact", True),
    ],
)
def test_only_collectors_that_stop_the_application_count_as_pauses(collector: str, pauses: bool) -> None:
    assert pauses_the_application(collector) is pauses


def test_a_gaps_gc_time_sums_the_pausing_collectors_only() -> None:
    line = "tasks 10 2000 ZGC%20Cycles:4:9000,ZGC%20Pauses:4:12,ZGC%20Minor%20Cycles:2:500,Copy:1:3"
    sample = parse_tasks_line(line)
    assert (sample.gc_count, sample.gc_s) == (5, 0.015)
    assert parse_tasks_line("tasks 10 2000 -").gc_count == 0


def test_a_late_refusal_is_logged_and_taken_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 36, item 4: the answer to a replacement came after the budget window (its charge had
    left it already): logged and taken, where ``deque.remove`` raised ValueError on the JVM link's
    thread. The budget is whole again and the executor's loss stays taken."""
    clock, kills = ManualClock(start=0.0), Kills()
    policy = LostOutputs(kills, clock, max_replacements=1)
    assert policy.on_lost(lost("1"))
    clock.jump(WINDOW_S + 1.0)
    assert policy.on_lost(lost("2"))  # prunes executor 1's charge from the window
    clock.jump(5.0)
    with caplog.at_level(logging.WARNING, "arrowbeat.lost_outputs"):
        policy.on_outcome(ReplacementOutcome("1", "refused"))
    assert policy.charged() == 1  # executor 2's, untouched
    assert any(
        "replacing executor 1 was refused 606 s after it was asked for" in r.getMessage()
        for r in caplog.records
    ), caplog.text
    policy.on_outcome(ReplacementOutcome("2", "refused"))  # in time: its charge is given back
    assert policy.charged() == 0
