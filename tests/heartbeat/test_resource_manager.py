"""The RM core without transport: registration, fencing, RTT, timeouts, unreachable, events."""

from __future__ import annotations

import pytest

from heartbeat import (
    EventKind,
    ExecutorEvent,
    HeartbeatServices,
    MalformedMessageError,
    ManualScheduler,
    Payload,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from heartbeat.rm.resource_manager import ResourceManagerCore

from .fakes import EventList, FakeLink

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=3.0, rpc_failure_threshold=2)


class Rm:
    def __init__(self, known: tuple[str, ...] = (), max_ended: int = 100) -> None:
        self.scheduler = ManualScheduler()
        self.events = EventList()
        self.core = ResourceManagerCore(
            SERVICES,
            self.scheduler.clock,
            self.scheduler,
            self.events,
            known_executors=known,
            spread=1,
            max_ended=max_ended,
        )
        self.core.start()

    def answer_all(self, executor_id: str, link: FakeLink, instance_id: str, payload: Payload) -> None:
        for epoch, instance, seq in link.sent:
            self.core.receive_heartbeat(executor_id, epoch, instance, seq, payload)
        link.sent.clear()


def test_register_then_heartbeats_carry_payload_and_rtt() -> None:
    rm = Rm()
    link = FakeLink()
    reg = rm.core.register("1", "host-a", link)
    assert reg.epoch == rm.core.epoch and not reg.resumed
    rm.scheduler.advance(0.0)
    assert link.sent == [(rm.core.epoch, reg.instance_id, 1)]
    rm.scheduler.advance(0.025)
    rm.answer_all("1", link, reg.instance_id, Payload(slots_total=4))
    [record] = rm.events.records()
    assert record.rtt_ms == pytest.approx(25.0)
    assert record.payload.slots_total == 4 and record.host == "host-a"
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]
    [info] = rm.core.executors()
    assert info.state == "RUNNING" and info.last_rtt_ms == pytest.approx(25.0)


def test_recorded_timestamps_are_the_clocks_wall_time() -> None:
    """Timeouts and RTTs run on ``monotonic()``; what is written down is ``time()`` of one clock."""
    rm = Rm()
    wall_start = rm.scheduler.clock.time()
    rm.scheduler.advance(5.0)
    link = FakeLink()
    reg = rm.core.register("1", "h", link)
    rm.scheduler.advance(1.25)  # the next sweep, at 6.0, sends the request answered now
    rm.answer_all("1", link, reg.instance_id, Payload())
    [event] = [e for e in rm.events.events if isinstance(e, ExecutorEvent)]
    [record] = rm.events.records()
    [info] = rm.core.executors()
    assert event.ts == info.registered_at == pytest.approx(wall_start + 5.0)
    assert record.ts == info.last_heartbeat == pytest.approx(wall_start + 6.25)
    assert record.rtt_ms == pytest.approx(250.0)


def test_silent_executor_times_out_once_and_its_late_answer_is_refused() -> None:
    rm = Rm()
    link = FakeLink()
    reg = rm.core.register("1", "h", link)
    rm.scheduler.advance(2.999)
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]
    rm.scheduler.advance(0.001)
    assert rm.events.kinds()[-1] == (EventKind.HEARTBEAT_TIMEOUT, "1")
    assert link.closed is not None and link.closed[0] == "NOT_FOUND"
    rm.scheduler.advance(10.0)
    assert [k for k, _ in rm.events.kinds()].count(EventKind.HEARTBEAT_TIMEOUT) == 1
    with pytest.raises(UnknownExecutorError):
        rm.core.receive_heartbeat("1", reg.epoch, reg.instance_id, 1, Payload())
    assert rm.events.records() == []
    rm.core.register("1", "h", FakeLink())
    assert rm.events.kinds()[-1] == (EventKind.REREGISTERED, "1")


def test_answering_keeps_an_executor_alive_past_many_timeouts() -> None:
    rm = Rm()
    link = FakeLink()
    reg = rm.core.register("1", "h", link)
    for _ in range(10):
        rm.scheduler.advance(1.0)
        rm.answer_all("1", link, reg.instance_id, Payload())
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]
    assert rm.core.last_heartbeat_from("1") == pytest.approx(10.0)


def test_broken_link_becomes_unreachable_before_the_timeout() -> None:
    rm = Rm()
    link = FakeLink()
    rm.core.register("1", "h", link)
    rm.scheduler.advance(0.0)
    link.broken = True
    rm.scheduler.advance(1.0)
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]
    rm.scheduler.advance(1.0)
    assert rm.events.kinds()[-1] == (EventKind.UNREACHABLE, "1")
    rm.scheduler.advance(5.0)
    assert len(rm.events.kinds()) == 2, "no HEARTBEAT_TIMEOUT after UNREACHABLE"


def test_second_registration_makes_the_first_stale() -> None:
    rm = Rm()
    old_link, new_link = FakeLink(), FakeLink()
    old = rm.core.register("1", "h", old_link)
    new = rm.core.register("1", "h2", new_link, pid=4242)
    assert new.instance_id != old.instance_id
    assert old_link.closed is not None and old_link.closed[0] == "ALREADY_EXISTS", "final: no re-register"
    assert all(part in old_link.closed[1] for part in (old.instance_id, new.instance_id, "h2", "4242"))
    with pytest.raises(StaleInstanceError):
        rm.core.receive_heartbeat("1", rm.core.epoch, old.instance_id, 1, Payload(slots_total=9))
    with pytest.raises(StaleInstanceError):
        rm.core.unregister("1", rm.core.epoch, old.instance_id)
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1"), (EventKind.REREGISTERED, "1")]
    assert rm.core.executors()[0].payload is None, "the stale heartbeat was not applied"


def test_resuming_a_replaced_instance_is_refused_while_the_newer_one_runs() -> None:
    """The replaced agent may not have heard why (its stream ended another way) and registers
    again resuming its instance: it must not replace the newer one back. Once the newer one has
    ended, the same request registers: nobody is displaced."""
    rm = Rm()
    old = rm.core.register("1", "h", FakeLink())
    new_link = FakeLink()
    new = rm.core.register("1", "h2", new_link, pid=4242)
    with pytest.raises(
        StaleInstanceError, match=f"{old.instance_id}.*replaced by a newer one.*{new.instance_id}"
    ):
        rm.core.register("1", "h", FakeLink(), rm.core.epoch, old.instance_id)
    assert new_link.closed is None
    [running] = rm.core.executors()
    assert running.instance_id == new.instance_id and running.state == "RUNNING"
    # A third agent replaces the second: resuming either earlier instance is refused.
    third = rm.core.register("1", "h3", FakeLink())
    for resumed in (old.instance_id, new.instance_id):
        with pytest.raises(StaleInstanceError):
            rm.core.register("1", "h", FakeLink(), rm.core.epoch, resumed)
    # An unknown instance is a new registration, as before (an agent that outlived an RM restart).
    assert not rm.core.register("2", "h", FakeLink(), rm.core.epoch, "some-other-instance").resumed
    # The third one times out and comes back resuming it: what it had replaced stays refused.
    rm.scheduler.advance(SERVICES.timeout_s * 3)
    assert rm.core.executors()[0].state != "RUNNING"
    fourth = rm.core.register("1", "h3", FakeLink(), rm.core.epoch, third.instance_id)
    assert not fourth.resumed
    with pytest.raises(StaleInstanceError):
        rm.core.register("1", "h", FakeLink(), rm.core.epoch, new.instance_id)
    rm.core.unregister("1", rm.core.epoch, fourth.instance_id)
    back = rm.core.register("1", "h", FakeLink(), rm.core.epoch, old.instance_id)
    assert not back.resumed and back.instance_id not in (old.instance_id, new.instance_id)
    assert [k for k, _ in rm.events.kinds()].count(EventKind.REREGISTERED) == 4


def test_stale_epoch_and_unknown_executor_are_rejected() -> None:
    rm = Rm()
    reg = rm.core.register("1", "h", FakeLink())
    with pytest.raises(StaleEpochError):
        rm.core.receive_heartbeat("1", "an-older-epoch", reg.instance_id, 1, Payload())
    with pytest.raises(UnknownExecutorError):
        rm.core.receive_heartbeat("2", rm.core.epoch, reg.instance_id, 1, Payload())
    assert rm.events.records() == []


def test_resume_reattaches_without_a_new_instance_or_event() -> None:
    rm = Rm()
    first, second = FakeLink(), FakeLink()
    reg = rm.core.register("1", "h", first)
    again = rm.core.register("1", "h", second, rm.core.epoch, reg.instance_id)
    assert again.resumed and again.instance_id == reg.instance_id
    rm.scheduler.advance(0.0)
    assert second.sent and not first.sent
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]
    wrong_epoch = rm.core.register("1", "h", FakeLink(), "old-epoch", reg.instance_id)
    assert not wrong_epoch.resumed


def test_known_executors_come_back_as_reregistered() -> None:
    rm = Rm(known=("7",))
    rm.core.register("7", "h", FakeLink())
    rm.core.register("8", "h", FakeLink())
    assert rm.events.kinds() == [(EventKind.REREGISTERED, "7"), (EventKind.REGISTERED, "8")]


def test_unregister_emits_and_stops_monitoring() -> None:
    rm = Rm()
    link = FakeLink()
    reg = rm.core.register("1", "h", link)
    rm.core.unregister("1", reg.epoch, reg.instance_id, "bye")
    rm.scheduler.advance(10.0)
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1"), (EventKind.UNREGISTERED, "1")]
    assert rm.core.executors()[0].state == "UNREGISTERED"


def test_stopped_core_emits_nothing() -> None:
    rm = Rm()
    rm.core.register("1", "h", FakeLink())
    rm.core.stop()
    rm.scheduler.advance(10.0)
    assert rm.events.kinds() == [(EventKind.REGISTERED, "1")]


@pytest.mark.parametrize("executor_id", ["", "x" * 257, "bad\nid"])
def test_malformed_ids_are_refused(executor_id: str) -> None:
    rm = Rm()
    with pytest.raises(MalformedMessageError):
        rm.core.register(executor_id, "h", FakeLink())
    assert rm.core.executors() == []


def test_ended_entries_are_forgotten_beyond_the_limit_but_remembered_as_seen() -> None:
    rm = Rm(max_ended=2)
    for name in ("a", "b", "c"):
        reg = rm.core.register(name, "h", FakeLink())
        rm.core.unregister(name, reg.epoch, reg.instance_id)
    rm.core.register("d", "h", FakeLink())
    assert sorted(i.executor_id for i in rm.core.executors()) == ["b", "c", "d"]
    rm.core.register("a", "h", FakeLink())
    assert rm.events.kinds()[-1] == (EventKind.REREGISTERED, "a")


def test_the_ids_seen_stay_bounded_under_churn() -> None:
    """Issue 24: an application of months runs 100,000s of executors; the ids the core
    remembers (for ``REREGISTERED``) stay within the table and as many forgotten ones."""
    rm = Rm(max_ended=5)
    for n in range(100):
        reg = rm.core.register(str(n), "h", FakeLink())
        rm.core.unregister(str(n), reg.epoch, reg.instance_id)
    assert len(rm.core.executors()) == 5
    assert len(rm.core._seen) + len(rm.core._forgotten) == 10
    rm.core.register("93", "h", FakeLink())  # forgotten from the table, still remembered
    rm.core.register("0", "h", FakeLink())  # forgotten long ago
    assert rm.events.kinds()[-2:] == [(EventKind.REREGISTERED, "93"), (EventKind.REGISTERED, "0")]
