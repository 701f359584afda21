"""Issue 24: an agent never stops trying silently.

Registration retries for as long as the agent lives (capped, jittered backoff, no deadline by
default), so an RM that is down or frozen for longer than the old 60 s deadline finds every agent
still trying when it answers again. The agent's clock is injected and jumped past that deadline
while the RM is away, so no test waits real minutes. The RM is a real process (``RmProcess``),
killed and restarted on its port, or SIGSTOPped and resumed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from harness.heartbeat_processes import RmProcess
from heartbeat import AgentThread, HeartbeatRpcError, ManualClock, RetryPolicy
from heartbeat.retry import retry_until_deadline

from .conftest import DEADLINE_S, FAST, SECRET

OLD_DEADLINE_S = 60.0
"""What ``RetryPolicy.deadline_s`` was: past it the agent gave up for good."""
POLICY = RetryPolicy(min_delay_s=0.05, max_delay_s=0.3, attempt_timeout_s=1.0)
"""Fast backoff and the library's default deadline (now none)."""


class SkewedClock:
    """The real clock plus an offset a test moves forward: the agent sees time pass at once."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def time(self) -> float:
        return time.time()


def wait_until(condition: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    event = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        event.wait(0.02)
    return True


@pytest.fixture
def rms() -> Iterator[list[RmProcess]]:
    started: list[RmProcess] = []
    yield started
    for rm in started:
        if rm.proc.poll() is None:
            os.kill(rm.proc.pid, signal.SIGCONT)
        rm.reap()


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_default_policy_retries_for_hours_at_the_capped_delay() -> None:
    """No deadline by default: a day of refusals on a manual clock, then it registers."""
    clock = ManualClock()
    sleeps: list[float] = []
    attempts = 0

    async def attempt(timeout_s: float) -> str:
        nonlocal attempts
        attempts += 1
        clock.jump(0.01)
        if clock.monotonic() < 24 * 3600:
            raise HeartbeatRpcError("refused")
        return "registered"

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock.jump(seconds)

    policy = RetryPolicy()
    assert policy.deadline_s is None
    result = asyncio.run(retry_until_deadline(attempt, policy, clock, "rm:1", sleep, random.Random(3)))
    assert result == "registered" and attempts > 10_000
    assert max(sleeps) <= policy.max_delay_s
    assert policy.delay(10**6) <= policy.max_delay_s  # no overflow after a week of attempts


def test_an_agent_registers_with_an_rm_restarted_after_the_old_deadline(rms: list[RmProcess]) -> None:
    clock = SkewedClock()
    rms.append(RmProcess(FAST, SECRET).wait_ready(DEADLINE_S))
    port = port_of(rms[0].address)
    agent = AgentThread(rms[0].address, SECRET, "1", services=FAST, retry_policy=POLICY, clock=clock)
    agent.start()
    try:
        assert agent.wait_registered(DEADLINE_S)
        rms[0].kill()
        assert wait_until(lambda: agent.registration is None), "the agent did not notice the RM's death"
        clock.offset += 2 * OLD_DEADLINE_S  # the RM stays away longer than the old deadline
        assert not wait_until(lambda: agent.error is not None, 1.0), f"the agent gave up: {agent.error!r}"
        rms.append(RmProcess(FAST, SECRET, port=port).wait_ready(DEADLINE_S))
        assert wait_until(lambda: agent.registrations == 2 and agent.registration is not None), (
            f"the agent did not register with the restarted RM (error: {agent.error!r})"
        )
        assert agent.registration is not None and agent.registration.epoch == rms[1].epoch
        assert agent.error is None
    finally:
        agent.stop()


def test_an_agent_registers_again_with_an_rm_frozen_past_the_old_deadline(rms: list[RmProcess]) -> None:
    clock = SkewedClock()
    rms.append(RmProcess(FAST, SECRET).wait_ready(DEADLINE_S))
    rm = rms[0]
    agent = AgentThread(rm.address, SECRET, "2", services=FAST, retry_policy=POLICY, clock=clock)
    agent.start()
    try:
        assert agent.wait_registered(DEADLINE_S)
        os.kill(rm.proc.pid, signal.SIGSTOP)  # alive, accepting connections, answering nothing
        assert wait_until(lambda: agent.registration is None), "the agent kept a frozen RM's session"
        clock.offset += 2 * OLD_DEADLINE_S
        assert not wait_until(lambda: agent.error is not None, 1.5), f"the agent gave up: {agent.error!r}"
        resumed_at = time.monotonic()
        os.kill(rm.proc.pid, signal.SIGCONT)
        assert wait_until(lambda: agent.registrations >= 2 and agent.registration is not None), (
            f"the agent did not register again with the resumed RM (error: {agent.error!r})"
        )
        # Within an attempt's timeout plus the backoff cap (and a loaded machine's slack).
        assert time.monotonic() - resumed_at < POLICY.attempt_timeout_s + POLICY.max_delay_s + 10.0
        assert agent.error is None
    finally:
        agent.stop()
