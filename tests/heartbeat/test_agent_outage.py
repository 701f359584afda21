"""Issue 36, item 4: an agent without its RM says so at WARNING, then once a minute with how long,
instead of a DEBUG line per attempt; and an agent told that its RM moved (a restarted RM on
another port) registers there. The log schedule runs on a ``ManualClock``; the move against a
real RM on loopback, the first address a closed port."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from heartbeat import AgentThread, HeartbeatRpcError, ManualClock, RetryPolicy
from heartbeat.agent.outage import RmOutage

from .conftest import DEADLINE_S, FAST, SECRET
from .fakes import ServedRm


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_a_lost_rm_is_a_warning_at_once_then_one_a_minute_with_how_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    outage = RmOutage("7", lambda: "rm:1", clock)
    caplog.set_level(logging.DEBUG, "heartbeat.agent.async_agent")
    outage.lost("the RM ended the stream")
    assert warnings(caplog) == [
        "agent 7 lost the RM at rm:1 (the RM ended the stream); registering again, and saying so every "
        "60 s while it lasts"
    ]
    for attempt in range(1, 121):  # an attempt every second for two minutes
        clock.jump(1.0)
        outage.failed(attempt, HeartbeatRpcError("connection refused"))
    lines = warnings(caplog)
    assert len(lines) == 3, lines  # the loss, then at 60 s and at 120 s
    assert lines[1].startswith("agent 7 has had no RM for 60 s: 60 registration attempts with rm:1 failed")
    assert lines[2].startswith("agent 7 has had no RM for 120 s: 120 registration attempts")
    assert "connection refused" in lines[2]
    outage.registered()
    assert warnings(caplog)[-1] == (
        "agent 7 registered with the RM at rm:1 again after 120.0 s without it (120 attempts failed)"
    )
    assert outage.since is None


def test_a_first_failure_is_a_warning_and_each_outage_has_its_own_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    outage = RmOutage("7", lambda: "rm:1", clock)
    caplog.set_level(logging.WARNING, "heartbeat.agent.async_agent")
    outage.failed(1, OSError("refused"))  # never registered: the first attempt says it
    assert warnings(caplog) == [
        "agent 7 has had no RM for 0 s: 1 registration attempts with rm:1 failed, the last: "
        "OSError('refused')"
    ]
    clock.jump(5.0)
    outage.registered()
    clock.jump(10.0)
    outage.lost("no heartbeat request from the RM for 3 s")  # 15 s after the first line: a new outage
    clock.jump(1.0)
    outage.failed(1, OSError("refused"))  # inside the new outage's minute
    lines = warnings(caplog)
    assert len(lines) == 3 and lines[2].startswith("agent 7 lost the RM at rm:1"), lines


def test_an_agent_dials_the_address_it_is_told_and_hears_each_failure(
    rm: ServedRm, caplog: pytest.LogCaptureFixture
) -> None:
    """The first address is a closed port: every failed attempt reaches ``on_rm_unreachable``
    with it, and a WARNING says the RM is out of reach (none existed at DEBUG only); told the real
    address, the agent registers there without waiting out its backoff (60 s here)."""
    _, address, _ = rm
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    asked: list[str] = []
    told = threading.Event()

    def unreachable(where: str) -> None:
        asked.append(where)
        told.set()

    caplog.set_level(logging.WARNING, "heartbeat.agent.async_agent")
    agent = AgentThread(
        dead,
        SECRET,
        executor_id="moved",
        services=FAST,
        retry_policy=RetryPolicy(min_delay_s=60.0, max_delay_s=60.0, jitter=0.0, attempt_timeout_s=2.0),
        on_rm_unreachable=unreachable,
    )
    agent.start()
    try:
        assert told.wait(DEADLINE_S)
        assert asked[0] == dead
        assert any(
            m.startswith(f"agent moved has had no RM for 0 s: 1 registration attempts with {dead}")
            for m in warnings(caplog)
        ), warnings(caplog)
        moved_at = time.monotonic()
        agent.set_rm_address(address)
        assert agent.wait_registered(DEADLINE_S), agent.error
        assert time.monotonic() - moved_at < 30.0  # not after the 60 s backoff
        assert any(
            m.startswith(f"agent moved registered with the RM at {address} again") for m in warnings(caplog)
        )
    finally:
        agent.stop()


def test_a_restarted_rm_whose_port_is_taken_serves_on_another() -> None:
    """``any_port_if_taken`` (what the JVM asks of a restart): the port taken by another socket,
    the RM serves on a free one and says where it was asked to; without it, start fails as before."""
    from heartbeat import HeartbeatError, ResourceManagerServer

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        strict = ResourceManagerServer(FAST, SECRET, port=taken)
        with pytest.raises(HeartbeatError, match=f"could not bind 127.0.0.1:{taken}"):
            strict.start()
        strict.stop()
        moved = ResourceManagerServer(FAST, SECRET, port=taken, any_port_if_taken=True)
        try:
            address = moved.start()
            assert address != f"127.0.0.1:{taken}" and moved.moved_from == taken
            agent = AgentThread(address, SECRET, executor_id="after-move", services=FAST)
            agent.start()
            assert agent.wait_registered(DEADLINE_S), agent.error
            agent.stop()
        finally:
            moved.stop()
