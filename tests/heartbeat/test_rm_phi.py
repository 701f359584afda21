"""The RM with the phi detector (issue 37, item 2), on a manual clock: a silent agent is suspected
long before the timeout, through the same trust checks as a timeout; a jittery one never is."""

from __future__ import annotations

import random

from heartbeat import EventKind, ExecutorEvent, HeartbeatServices, ManualScheduler, Payload
from heartbeat.phi_accrual import PhiSettings
from heartbeat.rm.resource_manager import ResourceManagerCore

from .fakes import EventList, FakeLink

INTERVAL, TIMEOUT = 0.1, 2.0
SERVICES = HeartbeatServices(
    interval_s=INTERVAL, timeout_s=TIMEOUT, rpc_failure_threshold=3, phi=PhiSettings.for_interval(INTERVAL)
)


class Rm:
    def __init__(self, services: HeartbeatServices = SERVICES) -> None:
        self.scheduler = ManualScheduler()
        self.events = EventList()
        self.core = ResourceManagerCore(
            services, self.scheduler.clock, self.scheduler, self.events, spread=1, kill_frozen_hosts=True
        )
        self.core.start()
        self.link = FakeLink()
        self.reg = self.core.register("1", "h", self.link)

    def answer(self) -> None:
        for epoch, instance, seq in self.link.sent:
            self.core.receive_heartbeat("1", epoch, instance, seq, Payload())
        self.link.sent.clear()

    def run_answering(self, seconds: float, step: float = 0.01) -> None:
        """The agent answers each request ``step`` after it was sent, for ``seconds``."""
        for _ in range(round(seconds / step)):
            self.scheduler.advance(step)
            self.answer()

    def losses(self) -> list[ExecutorEvent]:
        return [
            e
            for e in self.events.events
            if isinstance(e, ExecutorEvent) and e.kind in (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE)
        ]


def test_a_silent_agent_is_suspected_within_half_a_second_trusted_and_its_host_may_be_ended() -> None:
    rm = Rm()
    rm.run_answering(3.0)
    assert rm.losses() == []
    rm.scheduler.advance(0.5)  # silent from here; the timeout is 2 s away
    [event] = rm.losses()
    assert event.kind is EventKind.HEARTBEAT_TIMEOUT
    assert event.detail.startswith("phi 8") and "without a heartbeat" in event.detail
    assert rm.link.kill_asked == [(rm.core.epoch, rm.reg.instance_id, event.detail)]
    assert rm.link.closed is not None and rm.link.closed[0] == "NOT_FOUND"
    [info] = rm.core.executors()
    assert info.state == "TIMEOUT"


def test_the_timeout_detector_waits_the_whole_timeout() -> None:
    plain = HeartbeatServices(interval_s=INTERVAL, timeout_s=TIMEOUT, rpc_failure_threshold=3)
    rm = Rm(plain)
    rm.run_answering(3.0)
    rm.scheduler.advance(TIMEOUT - 0.2)  # the last answer came up to 0.1 s before
    assert rm.losses() == []
    rm.scheduler.advance(0.2)
    [event] = rm.losses()
    assert event.detail == f"no heartbeat for {TIMEOUT:g} s"


def test_a_jittery_agent_is_never_suspected() -> None:
    rng = random.Random(7)
    rm = Rm()
    for _ in range(600):  # a minute of answers 0-250 ms late, now and then 300 ms
        rm.scheduler.advance(0.3 if rng.random() < 0.02 else rng.uniform(0.0, 0.25))
        rm.answer()
    assert rm.losses() == []


def test_a_suspicion_during_the_rms_own_stall_judges_nothing_then_a_steady_silence_counts() -> None:
    """The RM sent nothing for 0.3 s (its loop stalled) but its check came on time: ``rm.trust``
    vetoes that window; the agent's silence counts from then, and a later check judges it."""
    rm = Rm()
    rm.run_answering(3.0)
    monitor = rm.core._sender.monitor("1")
    assert monitor is not None
    rm.scheduler.clock.jump(0.3)  # nothing ran, no request went out
    rm.scheduler.advance(0.15)  # the overdue sweeps run; the check comes on time, at ~0.43 s
    assert rm.losses() == [], "vetoed: the RM's own stall explains the silence"
    assert getattr(monitor, "checks_skipped", 0) == 1
    rm.scheduler.advance(0.5)  # the agent stays silent while the RM asks steadily
    [event] = rm.losses()
    assert event.detail.startswith("phi")


def test_a_check_that_runs_late_in_a_long_rm_pause_judges_nothing() -> None:
    rm = Rm()
    rm.run_answering(3.0)
    rm.scheduler.clock.jump(1.0)  # the RM paused for a second (less than the timeout)
    rm.scheduler.advance(0.0)  # its timers run late, at once
    rm.answer()  # the answer that waited behind the pause
    rm.run_answering(1.0)
    assert rm.losses() == []
