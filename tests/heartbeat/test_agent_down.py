"""Issue 24: every executor the cluster manager runs is listed RUNNING, or UNMONITORED with the
reason, never TIMEOUT for good. An agent its JVM saw exit is UNMONITORED at once with the cause
(``agent_down``); an executor whose registration ended any other way gets the grace of a new one
to have an agent again. Time moves only through a ManualScheduler."""

from __future__ import annotations

from heartbeat import EventKind, ExecutorEvent, HeartbeatServices
from heartbeat.rm.admin import list_executors

from .conftest import DEADLINE_S, SECRET
from .fakes import Collector, FakeLink, ManualRm

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=3.0, rpc_failure_threshold=2)
GRACE_S = 10.0
EXITED = "agent exited (killed by signal 9); restarting it"


class Rm(ManualRm):
    def __init__(self) -> None:
        super().__init__(SERVICES)

    def kinds(self) -> list[tuple[EventKind, str]]:
        return [(e.kind, e.detail) for e in self.events.events if isinstance(e, ExecutorEvent)]

    def listed(self) -> dict[str, tuple[str, str]]:
        return {i.executor_id: (i.state, i.detail) for i in self.core.executors()}


def test_an_exited_agent_is_unmonitored_at_once_with_its_cause_and_never_times_out() -> None:
    rm = Rm()
    rm.core.expect("1", "h", GRACE_S)
    rm.core.register("1", "h", FakeLink(), pid=4242)
    rm.core.agent_down("1", 4242, EXITED)
    assert rm.listed() == {"1": ("UNMONITORED", EXITED)}
    rm.scheduler.advance(10 * GRACE_S)  # the dead agent's registration is not watched any more
    assert rm.kinds() == [(EventKind.REGISTERED, ""), (EventKind.UNMONITORED, EXITED)]
    rm.core.register("1", "h", FakeLink(), pid=4343)  # the restarted agent
    assert rm.listed() == {"1": ("RUNNING", "")}
    assert rm.kinds()[-1] == (
        EventKind.REREGISTERED,
        "its agent registered after the executor was reported unmonitored",
    )


def test_a_late_report_of_an_older_agent_leaves_the_newer_registration_alone() -> None:
    rm = Rm()
    rm.core.expect("2", "h", GRACE_S)
    rm.core.register("2", "h", FakeLink(), pid=20)
    rm.core.agent_down("2", 19, "agent exited (status 3): an older one")
    assert rm.listed() == {"2": ("RUNNING", "")}
    assert [k for k, _ in rm.kinds()] == [EventKind.REGISTERED]


def test_each_report_is_recorded_and_the_latest_cause_listed() -> None:
    rm = Rm()
    rm.core.expect("3", "h", GRACE_S)
    rm.core.register("3", "h", FakeLink(), pid=30)
    rm.core.agent_down("3", 30, EXITED)
    rm.core.agent_down("3", 30, "agent restart failed: no ready line; restarting it in 2 s")
    assert rm.listed() == {"3": ("UNMONITORED", "agent restart failed: no ready line; restarting it in 2 s")}
    assert [k for k, _ in rm.kinds()].count(EventKind.UNMONITORED) == 2


def test_a_timed_out_executor_that_spark_still_runs_is_unmonitored_after_the_grace() -> None:
    rm = Rm()
    rm.core.expect("4", "h", GRACE_S)
    rm.core.register("4", "h", FakeLink())  # a silent agent: it times out
    while rm.listed()["4"][0] != "TIMEOUT":
        rm.scheduler.advance(0.1)
    rm.scheduler.advance(GRACE_S - 0.2)
    assert rm.listed()["4"][0] == "TIMEOUT"  # within the grace: an agent may come back
    rm.scheduler.advance(0.3)
    state, detail = rm.listed()["4"]
    assert state == "UNMONITORED"
    assert detail.startswith("no agent registered again within 10 s after HEARTBEAT_TIMEOUT (no heartbeat")
    rm.core.register("4", "h", FakeLink())
    assert rm.listed() == {"4": ("RUNNING", "")}


def test_a_removal_within_the_grace_reports_nothing() -> None:
    rm = Rm()
    rm.core.expect("6", "h", GRACE_S)
    rm.core.register("6", "h", FakeLink())
    rm.scheduler.advance(SERVICES.timeout_s + 1.0)
    rm.core.cluster_removed("6", EventKind.SPARK_LOST, "lost (crash): exit 1")
    rm.scheduler.advance(10 * GRACE_S)
    assert EventKind.UNMONITORED not in [k for k, _ in rm.kinds()]
    assert rm.core._expected == {} and rm.core._in_cluster == {}
    rm.core.agent_down("6", 0, EXITED)  # a late word about a removed executor changes nothing
    assert EventKind.UNMONITORED not in [k for k, _ in rm.kinds()]


def test_the_reason_is_listed_over_grpc(rm: tuple[object, str, Collector]) -> None:
    server, address, events = rm
    server.executor_started("11", "host-x", 60.0)  # type: ignore[attr-defined]
    server.agent_down("11", 0, EXITED)  # type: ignore[attr-defined]
    events.wait_event(EventKind.UNMONITORED, "11", DEADLINE_S)
    [status] = list_executors(address, SECRET)
    assert (status.executor_id, status.state, status.detail) == ("11", "UNMONITORED", EXITED)
