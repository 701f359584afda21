"""A heartbeat timeout the RM may act on, and one its own stall explains (issue 37): on a manual
clock, the RM asks the agent to end its frozen host only when it sent requests steadily."""

from __future__ import annotations

import pytest

from heartbeat import EventKind, ExecutorEvent, HeartbeatServices, ManualScheduler, Payload
from heartbeat.rm.resource_manager import ResourceManagerCore
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
    def __init__(self, kill_frozen_hosts: bool = True) -> None:
        self.scheduler = ManualScheduler()
        self.events = EventList()
        self.core = ResourceManagerCore(
            SERVICES,
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
    assert event.trusted and "not acted on" not in event.detail
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
    assert event.trusted and "not acted on" not in event.detail
    assert rm.link.kill_asked == [(rm.core.epoch, rm.reg.instance_id, "no heartbeat for 2 s")]


def test_without_kill_mode_a_trusted_timeout_asks_nothing_of_the_agent() -> None:
    rm = Rm(kill_frozen_hosts=False)
    rm.scheduler.advance(3.0)
    assert rm.timeout().trusted and rm.link.kill_asked == []
