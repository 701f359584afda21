"""A heartbeat timeout the RM may act on, and a silence its own stall explains (issue 37): on a
manual clock, a silence counts only when the RM sent its requests steadily over it (the monitor's
vetting, the one judge); one its stall explains is watched again, the registration kept."""

from __future__ import annotations

import logging

import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatServices, ManualScheduler, Payload
from heartbeat.rm.resource_manager import ResourceManagerCore, _AgentTarget
from heartbeat.rm.trust import own_stall_s, trusted_timeout

from .fakes import EventList, FakeLink

SERVICES = HeartbeatServices(interval_s=0.5, timeout_s=2.0, rpc_failure_threshold=3)


def test_the_stall_is_the_longest_stretch_without_a_request() -> None:
    assert own_stall_s([1.0, 1.5, 2.0], since=0.6, now=2.6) == pytest.approx(0.6)
    assert own_stall_s([], since=0.6, now=2.6) == pytest.approx(2.0)
    assert own_stall_s([0.1, 9.0], since=0.6, now=2.6) == pytest.approx(2.0), "outside the window"
    trusted, stall = trusted_timeout([1.0, 1.5, 2.0, 2.5], 0.5, 2.5, 0.5, 2.0)
    assert trusted and stall == pytest.approx(0.5)
    trusted, stall = trusted_timeout([2.5], 0.5, 2.6, 0.5, 2.0)
    assert not trusted and stall == pytest.approx(1.9)


class Rm:
    def __init__(self, kill_frozen_hosts: bool = True, services: HeartbeatServices = SERVICES) -> None:
        self.scheduler = ManualScheduler()
        self.events = EventList()
        self.core = ResourceManagerCore(
            services,
            self.scheduler.clock,
            self.scheduler,
            self.events,
            spread=1,
            kill_frozen_hosts=kill_frozen_hosts,
        )
        self.core.start()
        self.link = FakeLink()
        self.reg = self.core.register("1", "h", self.link)
        self.scheduler.advance(0.0)
        self.answer()

    def answer(self) -> None:
        for epoch, instance, seq in self.link.sent:
            self.core.receive_heartbeat("1", epoch, instance, seq, Payload())
        self.link.sent.clear()

    def timeouts(self) -> list[ExecutorEvent]:
        return [
            e
            for e in self.events.events
            if isinstance(e, ExecutorEvent) and e.kind is EventKind.HEARTBEAT_TIMEOUT
        ]

    def timeout(self) -> ExecutorEvent:
        [event] = self.timeouts()
        return event


def test_a_silent_agent_asked_steadily_is_timed_out_trusted_and_asked_to_end_its_host() -> None:
    rm = Rm()
    rm.scheduler.advance(1.0)
    rm.answer()
    rm.scheduler.advance(2.0)  # the agent answers no more; the RM asks every 0.5 s
    event = rm.timeout()
    assert "not acted on" not in event.detail
    assert rm.link.kill_asked == [(rm.core.epoch, rm.reg.instance_id, "no heartbeat for 2 s")]
    assert rm.link.closed is not None and rm.link.closed[0] == "NOT_FOUND"


def test_a_silence_the_rms_own_stall_explains_is_not_judged_and_the_agent_keeps_its_registration() -> None:
    rm = Rm()
    rm.scheduler.advance(1.0)
    rm.answer()
    rm.scheduler.clock.jump(2.5)  # the RM's loop ran nothing for 2.5 s: no request went out
    rm.scheduler.advance(0.0)  # its overdue sweeps and the monitor's timer run late, at once
    assert not rm.timeouts() and rm.link.kill_asked == [] and rm.link.closed is None
    assert [(e.executor_id, e.state) for e in rm.core.executors()] == [("1", "RUNNING")]
    for _ in range(8):  # the agent answers the RM's requests again: nothing is ever judged
        rm.scheduler.advance(0.5)
        rm.answer()
    assert not rm.timeouts() and [e.state for e in rm.core.executors()] == ["RUNNING"]


def test_an_agent_still_silent_after_the_rms_stall_is_timed_out_trusted_one_timeout_later() -> None:
    """The silence counts again from the late check (3.5 s), so the trusted timeout comes at 5.5 s
    (the timeout is 2 s), and is acted on."""
    rm = Rm()
    rm.scheduler.advance(1.0)
    rm.answer()
    rm.scheduler.clock.jump(2.5)
    rm.scheduler.advance(0.0)
    rm.scheduler.advance(1.9)  # the RM asks steadily now; the agent answers nothing
    assert not rm.timeouts()
    rm.scheduler.advance(0.2)
    event = rm.timeout()
    assert "not acted on" not in event.detail
    # its detail is the silence since its last answer (1 s), not the timeout's 2 s
    assert rm.link.kill_asked == [(rm.core.epoch, rm.reg.instance_id, "no heartbeat for 4.5 s")]


def test_a_dead_agent_is_timed_out_when_the_timeout_spans_more_requests_than_the_rm_keeps() -> None:
    """A 15 s timeout at 0.1 s intervals: 150 unanswered requests, of which the RM keeps the
    newest 64. Those it let go were sent too, so the silence is the agent's, timed out once."""
    rm = Rm(services=HeartbeatServices(interval_s=0.1, timeout_s=15.0, rpc_failure_threshold=3))
    rm.scheduler.advance(14.9)
    assert not rm.timeouts()
    rm.scheduler.advance(0.2)
    assert len(rm.timeouts()) == 1 and len(rm.link.kill_asked) == 1


def test_a_frozen_agent_is_acted_on_when_the_rm_stalled_under_its_bound_near_the_end() -> None:
    """Spark's defaults (1 s / 5 s): the agent freezes at 3 s, the RM's loop runs nothing from 6 s
    to 8.8 s (under half of the 5.8 s silence): the one judge, the monitor's vetting, trusts it,
    and the timeout is acted on."""
    rm = Rm(services=HeartbeatServices(interval_s=1.0, timeout_s=5.0, rpc_failure_threshold=3))
    for _ in range(3):
        rm.scheduler.advance(1.0)
        rm.answer()
    rm.scheduler.advance(3.0)  # frozen: the RM asks at 4, 5 and 6 s
    rm.scheduler.clock.jump(2.8)
    rm.scheduler.advance(0.0)
    assert len(rm.timeouts()) == 1 and len(rm.link.kill_asked) == 1
    assert [e.state for e in rm.core.executors()] == ["TIMEOUT"]


def test_a_stall_early_in_a_long_silence_stays_in_view_of_the_trust_check() -> None:
    """0.1 s / 60 s: 600 requests to a timeout, all kept (two timeouts' worth). The RM stalls for
    40 s inside the agent's silence, more than half of it: not judged at 60 s, judged at 120 s."""
    rm = Rm(services=HeartbeatServices(interval_s=0.1, timeout_s=60.0, rpc_failure_threshold=3))
    rm.scheduler.advance(5.0)  # silent from 0 s
    rm.scheduler.clock.jump(40.0)
    rm.scheduler.advance(0.0)
    rm.scheduler.advance(16.0)  # 61 s
    assert not rm.timeouts() and rm.link.kill_asked == []
    rm.scheduler.advance(59.9)  # 120.9 s: a whole timeout of requests since the veto
    [event] = rm.timeouts()
    assert event.detail.startswith("no heartbeat for 12"), event.detail  # the silence, not 60 s


def test_requests_dropped_past_the_bound_still_count_as_the_rm_sending() -> None:
    clock = ManualScheduler().clock
    target = _AgentTarget(FakeLink(), "e", "i", clock, keep=4)
    for _ in range(10):
        clock.jump(1.0)
        target.request_heartbeat("rm", None)
    assert list(target.sent.values()) == [7.0, 8.0, 9.0, 10.0] and target.dropped_at == 6.0


def test_a_request_that_raises_stops_no_other_request_and_counts_as_a_failed_rpc() -> None:
    class Raising(FakeLink):
        def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
            raise RuntimeError("a bug in one link")

    scheduler, events = ManualScheduler(), EventList()
    core = ResourceManagerCore(SERVICES, scheduler.clock, scheduler, events, spread=1)
    core.start()
    good, bad = FakeLink(), Raising()
    core.register("good", "h", good)
    core.register("bad", "h", bad)
    for _ in range(4):
        scheduler.advance(0.5)
        for epoch, instance, seq in good.sent:
            core.receive_heartbeat("good", epoch, instance, seq, Payload())
        good.sent.clear()
    assert {e.executor_id: e.state for e in core.executors()} == {"good": "RUNNING", "bad": "UNREACHABLE"}


def test_one_warning_tells_of_a_stall_however_many_silences_it_vetoes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler, events = ManualScheduler(), EventList()
    core = ResourceManagerCore(SERVICES, scheduler.clock, scheduler, events, spread=1)
    core.start()
    links = {str(i): FakeLink() for i in range(20)}
    for executor_id, link in links.items():
        core.register(executor_id, "h", link)
    scheduler.clock.jump(2.5)
    with caplog.at_level(logging.DEBUG, logger="heartbeat.rm.resource_manager"):
        scheduler.advance(0.0)
    vetoed = [r for r in caplog.records if "not judged" in r.getMessage()]
    assert len(vetoed) == 20 and [r.levelno for r in vetoed].count(logging.WARNING) == 1
    assert [e.state for e in core.executors()] == ["RUNNING"] * 20


def test_without_kill_mode_a_trusted_timeout_asks_nothing_of_the_agent() -> None:
    rm = Rm(kill_frozen_hosts=False)
    rm.scheduler.advance(3.0)
    assert rm.timeout() and rm.link.kill_asked == []
