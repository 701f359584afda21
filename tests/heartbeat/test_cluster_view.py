"""The RM core's view of what the cluster manager (Spark) runs: an executor without an agent is
listed and reported UNMONITORED after a bound on the injected clock, and a removal on purpose is
recorded as such, also in the agent's own end. Time moves only through a ManualScheduler."""

from __future__ import annotations

import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatServices, ResourceManagerServer
from heartbeat.rm.admin import list_executors

from .conftest import DEADLINE_S, SECRET
from .fakes import Collector, FakeLink, ManualRm

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=3.0, rpc_failure_threshold=2)
WITHIN_S = 10.0
GrpcRm = tuple[ResourceManagerServer, str, Collector]


class Rm(ManualRm):
    def __init__(self) -> None:
        super().__init__(SERVICES)

    def executor_events(self) -> list[ExecutorEvent]:
        return [e for e in self.events.events if isinstance(e, ExecutorEvent)]

    def states(self) -> dict[str, str]:
        return {i.executor_id: i.state for i in self.core.executors()}


def test_an_executor_without_an_agent_becomes_unmonitored_at_the_bound_once() -> None:
    rm = Rm()
    added_at = rm.scheduler.clock.time()
    rm.core.expect("7", "host-b", WITHIN_S)
    rm.scheduler.advance(WITHIN_S - 0.01)
    assert rm.executor_events() == [] and rm.core.executors() == []  # not missing yet: starting
    rm.scheduler.advance(0.01)
    [event] = rm.executor_events()
    assert (event.kind, event.executor_id, event.host, event.instance_id) == (
        EventKind.UNMONITORED,
        "7",
        "host-b",
        "",
    )
    assert "no agent registered within 10 s" in event.detail
    [info] = rm.core.executors()
    assert (info.state, info.host, info.instance_id, info.last_heartbeat) == (
        "UNMONITORED",
        "host-b",
        "",
        None,
    )
    assert info.registered_at == pytest.approx(added_at)  # when Spark added it
    rm.scheduler.advance(100.0)
    rm.core.expect("7", "host-b", WITHIN_S)  # Spark's word again (a replay): no second report
    rm.scheduler.advance(100.0)
    assert len(rm.executor_events()) == 1


def test_an_agent_registering_in_time_cancels_the_bound() -> None:
    rm = Rm()
    rm.core.expect("1", "h", WITHIN_S)
    rm.scheduler.advance(WITHIN_S / 2)
    rm.core.register("1", "h", FakeLink())
    assert rm.states() == {"1": "RUNNING"}
    rm.scheduler.advance(WITHIN_S)  # the silent fake agent times out; unmonitored it never was
    assert EventKind.UNMONITORED not in [e.kind for e in rm.executor_events()]


def test_spark_word_arriving_after_the_registration_changes_nothing() -> None:
    rm = Rm()
    rm.core.register("1", "h", FakeLink())
    rm.core.expect("1", "h", WITHIN_S)
    rm.scheduler.advance(10 * WITHIN_S)
    # No "no agent registered within" bound for a registered executor; only the silent fake
    # agent's timeout, then the grace after it (issue 24: never TIMEOUT for good).
    details = [e.detail for e in rm.executor_events() if e.kind is EventKind.UNMONITORED]
    assert [d.split(" after ")[0] for d in details] == ["no agent registered again within 10 s"]


def test_a_late_agent_replaces_the_unmonitored_entry_and_says_so() -> None:
    rm = Rm()
    rm.core.expect("2", "h", WITHIN_S)
    rm.scheduler.advance(WITHIN_S)
    rm.core.register("2", "h", FakeLink())
    kinds = [(e.kind, e.detail) for e in rm.executor_events()]
    assert kinds[0][0] is EventKind.UNMONITORED
    assert kinds[1] == (
        EventKind.REGISTERED,
        "its agent registered after the executor was reported unmonitored",
    )
    assert rm.states() == {"2": "RUNNING"}


def test_an_agent_that_did_not_start_is_unmonitored_at_once_with_its_reason() -> None:
    rm = Rm()
    rm.core.expect("3", "h", WITHIN_S)
    rm.core.agent_not_started("3", "interpreter-missing")
    rm.core.agent_not_started("3", "interpreter-missing")  # once
    rm.scheduler.advance(10 * WITHIN_S)  # and not again at the bound
    [event] = rm.executor_events()
    assert (event.kind, event.detail) == (
        EventKind.UNMONITORED,
        "its agent did not start: interpreter-missing",
    )
    assert rm.states() == {"3": "UNMONITORED"}


def test_spark_removing_an_unmonitored_executor_records_it_and_lists_it_no_more() -> None:
    rm = Rm()
    rm.core.expect("4", "host-c", WITHIN_S)
    rm.scheduler.advance(WITHIN_S)
    rm.core.cluster_removed("4", EventKind.SPARK_REMOVED, "removed by Spark (idle, dynamic allocation): x")
    assert [(e.kind, e.host) for e in rm.executor_events()] == [
        (EventKind.UNMONITORED, "host-c"),
        (EventKind.SPARK_REMOVED, "host-c"),
    ]
    assert rm.core.executors() == []


def test_spark_removing_an_executor_before_the_bound_cancels_it() -> None:
    rm = Rm()
    rm.core.expect("5", "h", WITHIN_S)
    rm.core.cluster_removed("5", EventKind.SPARK_LOST, "lost (crash): Command exited with code 1")
    rm.scheduler.advance(10 * WITHIN_S)
    assert [e.kind for e in rm.executor_events()] == [EventKind.SPARK_LOST]


@pytest.mark.parametrize("spark_first", [True, False])
def test_an_agent_leaving_after_an_idle_removal_does_not_read_as_a_crash(spark_first: bool) -> None:
    """Either order: Spark's removal is its own row with its reason; when it came first, the
    agent's UNREGISTERED row carries it too (when it came second, it is the last word)."""
    rm = Rm()
    link = FakeLink()
    reg = rm.core.register("6", "h", link)
    removal = "removed by Spark (idle, dynamic allocation): Executor killed by driver."
    if spark_first:
        rm.core.cluster_removed("6", EventKind.SPARK_REMOVED, removal)
    rm.core.unregister("6", reg.epoch, reg.instance_id, "the JVM exited unexpectedly")
    if not spark_first:
        rm.core.cluster_removed("6", EventKind.SPARK_REMOVED, removal)
    rows = {e.kind: e for e in rm.executor_events()}
    assert rows[EventKind.SPARK_REMOVED].detail == removal
    assert rows[EventKind.SPARK_REMOVED].instance_id == reg.instance_id
    unregistered = rows[EventKind.UNREGISTERED].detail
    if spark_first:
        assert unregistered == f"the JVM exited unexpectedly; the executor was {removal}"
    else:
        assert unregistered == "the JVM exited unexpectedly"
        assert rm.executor_events()[-1].kind is EventKind.SPARK_REMOVED


def test_a_timeout_after_an_idle_removal_says_so_but_a_crash_adds_nothing() -> None:
    rm = Rm()
    rm.core.register("8", "h", FakeLink())
    rm.core.register("9", "h", FakeLink())
    rm.core.cluster_removed("8", EventKind.SPARK_REMOVED, "removed by Spark (decommissioned): d")
    rm.core.cluster_removed("9", EventKind.SPARK_LOST, "lost (crash): Command exited with code 137")
    rm.scheduler.advance(SERVICES.timeout_s + 1.0)
    timeouts = {
        e.executor_id: e.detail for e in rm.executor_events() if e.kind is EventKind.HEARTBEAT_TIMEOUT
    }
    assert timeouts == {
        "8": "no heartbeat for 3 s; the executor was removed by Spark (decommissioned): d",
        "9": "no heartbeat for 3 s",
    }


def test_removals_are_only_removed_or_lost_and_their_detail_is_cut() -> None:
    rm = Rm()
    with pytest.raises(ValueError):
        rm.core.cluster_removed("1", EventKind.UNREGISTERED, "x")
    rm.core.cluster_removed("1", EventKind.SPARK_LOST, "lost (crash): " + "x\n" * 1000)
    [event] = rm.executor_events()
    assert len(event.detail) <= 512 and event.detail.isprintable()


def test_remembered_removals_are_bounded() -> None:
    rm = Rm()  # max_ended=3
    for n in range(10):
        rm.core.cluster_removed(str(n), EventKind.SPARK_REMOVED, f"removed {n}")
    assert len(rm.core._removed_on_purpose) == 3


def test_a_stopped_core_takes_no_expectation_and_reports_nothing() -> None:
    rm = Rm()
    rm.core.expect("1", "h", WITHIN_S)
    rm.core.stop()
    rm.core.expect("2", "h", WITHIN_S)
    rm.scheduler.advance(10 * WITHIN_S)
    assert rm.executor_events() == [] and rm.scheduler.pending() == 0


def test_list_executors_shows_an_executor_without_an_agent_over_grpc(rm: GrpcRm) -> None:
    """The thread-safe server entry points the driver plugin calls, through to ``ListExecutors``."""
    server, address, events = rm
    server.executor_started("11", "host-x", 0.2)
    server.executor_removed("12", EventKind.SPARK_LOST, "lost (crash): Command exited with code 137")
    events.wait_event(EventKind.UNMONITORED, "11", DEADLINE_S)
    events.wait_event(EventKind.SPARK_LOST, "12", DEADLINE_S)
    [status] = list_executors(address, SECRET)
    assert (status.executor_id, status.host, status.state) == ("11", "host-x", "UNMONITORED")


def test_a_late_word_that_a_removed_executors_agent_did_not_start_lists_nothing() -> None:
    """Issue 24 (months): the executor side's message can come after Spark's removal (two
    channels); before, the executor stayed listed UNMONITORED for the application's life."""
    rm = Rm()
    rm.core.expect("9", "host-b", WITHIN_S)
    rm.core.cluster_removed("9", EventKind.SPARK_LOST, "lost (crash): exit 1")
    rm.core.agent_not_started("9", "interpreter-missing")
    rm.scheduler.advance(WITHIN_S)
    assert rm.states() == {} and rm.core._expected == {}
    assert [e.kind for e in rm.executor_events()] == [EventKind.SPARK_LOST]
