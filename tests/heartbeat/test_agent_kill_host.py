"""The RM's word that the agent may end its frozen host reaches the host's judge only for the
registration being served and only while the host is unhealthy (issue 37)."""

from __future__ import annotations

from heartbeat import AgentCore, HeartbeatServices, ManualScheduler

from .fakes import FakeRmLink

EPOCH, INSTANCE = "epoch-1", "instance-1"


def serving(healthy: list[bool], asked: list[str]) -> AgentCore:
    scheduler = ManualScheduler()
    core = AgentCore(
        "exec-1",
        services=HeartbeatServices(interval_s=0.5, timeout_s=2.0),
        clock=scheduler.clock,
        is_healthy=lambda: healthy[0],
        on_kill_host=asked.append,
    )
    core.registered(EPOCH, INSTANCE, 500, 2000)
    core.start_session(FakeRmLink(), scheduler)
    return core


def test_the_kill_goes_to_the_judge_for_our_registration_of_an_unhealthy_host() -> None:
    healthy: list[bool] = [False]
    asked: list[str] = []
    core = serving(healthy, asked)
    assert core.on_kill_host(EPOCH, INSTANCE, "no heartbeat for 2 s\nforged")
    assert asked == ["no heartbeat for 2 s\\nforged"], "one line, escaped"


def test_a_kill_for_another_registration_a_healthy_host_or_no_session_is_ignored() -> None:
    healthy: list[bool] = [False]
    asked: list[str] = []
    core = serving(healthy, asked)
    assert not core.on_kill_host("epoch-0", INSTANCE, "stale epoch")
    assert not core.on_kill_host(EPOCH, "instance-0", "an older registration")
    healthy[0] = True  # the JVM pulses again: the RM's verdict is stale
    assert not core.on_kill_host(EPOCH, INSTANCE, "late")
    core.end_session()
    healthy[0] = False
    assert not core.on_kill_host(EPOCH, INSTANCE, "after the session")
    assert asked == []
