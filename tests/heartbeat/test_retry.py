"""Registration retries: backoff, cap, jitter and the overall deadline, on a manual clock."""

from __future__ import annotations

import asyncio
import random

import pytest

from heartbeat import (
    HeartbeatAuthenticationError,
    HeartbeatRpcError,
    ManualClock,
    ProtocolVersionError,
    RegistrationReplacedError,
    RegistrationTimeoutError,
    RetryPolicy,
)
from heartbeat.retry import retry_until_deadline


class Driver:
    """Fails a given number of times; its sleep moves the manual clock instead of waiting."""

    def __init__(self, clock: ManualClock, failures: int, error: Exception | None = None) -> None:
        self.clock = clock
        self.failures = failures
        self.error = error or HeartbeatRpcError("refused")
        self.timeouts: list[float] = []
        self.sleeps: list[float] = []

    async def attempt(self, timeout_s: float) -> str:
        self.timeouts.append(timeout_s)
        self.clock.jump(0.01)
        if len(self.timeouts) <= self.failures:
            raise self.error
        return "registered"

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.clock.jump(seconds)


def test_backoff_grows_to_the_cap_within_jitter_bounds() -> None:
    policy = RetryPolicy(min_delay_s=0.1, max_delay_s=1.0, multiplier=2.0, jitter=0.5)
    rng = random.Random(7)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        for _ in range(50):
            delay = policy.delay(attempt, rng)
            assert base * 0.5 <= delay <= base


def test_succeeds_after_failures_with_growing_delays() -> None:
    clock = ManualClock()
    driver = Driver(clock, failures=3)
    policy = RetryPolicy(min_delay_s=0.1, max_delay_s=10.0, jitter=0.0, deadline_s=60.0)
    result = asyncio.run(retry_until_deadline(driver.attempt, policy, clock, "rm:1", driver.sleep))
    assert result == "registered"
    assert driver.sleeps == pytest.approx([0.1, 0.2, 0.4])


def test_deadline_raises_a_clear_registration_timeout() -> None:
    clock = ManualClock()
    driver = Driver(clock, failures=10**6)
    policy = RetryPolicy(min_delay_s=0.5, max_delay_s=2.0, jitter=0.0, deadline_s=10.0, attempt_timeout_s=3.0)
    with pytest.raises(RegistrationTimeoutError) as info:
        asyncio.run(retry_until_deadline(driver.attempt, policy, clock, "rm:1", driver.sleep))
    assert clock.monotonic() == pytest.approx(10.0)
    assert info.value.attempts == len(driver.timeouts)
    assert isinstance(info.value.last_error, HeartbeatRpcError)
    assert "rm:1" in str(info.value) and "10.0 s" in str(info.value)
    assert max(driver.timeouts) <= 3.0
    assert driver.timeouts[-1] <= 10.0 - sum(driver.sleeps[:-1]), "the last attempt fits in the deadline"


def test_non_retryable_error_escapes_at_once() -> None:
    clock = ManualClock()
    driver = Driver(clock, failures=5, error=RegistrationReplacedError("a newer agent won"))
    with pytest.raises(RegistrationReplacedError):
        asyncio.run(retry_until_deadline(driver.attempt, RetryPolicy(), clock, "rm:1", driver.sleep))
    assert len(driver.timeouts) == 1 and driver.sleeps == []


@pytest.mark.parametrize(
    "error",
    [HeartbeatAuthenticationError("no proof"), ProtocolVersionError("protocol version mismatch: 3 vs 2")],
)
def test_an_unproven_refusal_is_retried_until_the_deadline(error: Exception) -> None:
    """A port squatter can send these: the agent must still be trying when the real RM is back."""
    clock = ManualClock()
    driver = Driver(clock, failures=3, error=error)
    assert asyncio.run(retry_until_deadline(driver.attempt, RetryPolicy(), clock, "rm:1", driver.sleep))
    assert len(driver.timeouts) == 4
    stuck = Driver(ManualClock(), failures=10**6, error=error)
    policy = RetryPolicy(deadline_s=5.0)
    with pytest.raises(RegistrationTimeoutError) as info:
        asyncio.run(retry_until_deadline(stuck.attempt, policy, stuck.clock, "rm:1", stuck.sleep))
    assert info.value.last_error is error and type(error).__name__ in str(info.value)


def test_an_attempt_cut_short_by_the_deadline_does_not_hide_the_refusal_before_it() -> None:
    clock = ManualClock()
    refusal = HeartbeatAuthenticationError("the RM refused our proof")
    calls: list[float] = []

    async def attempt(timeout_s: float) -> str:  # refused at once with time left, else times out
        calls.append(timeout_s)
        if timeout_s >= 2.0:
            clock.jump(0.01)
            raise refusal
        clock.jump(timeout_s)
        raise TimeoutError()

    async def sleep(seconds: float) -> None:
        clock.jump(seconds)

    policy = RetryPolicy(min_delay_s=1.0, max_delay_s=1.0, jitter=0.0, deadline_s=3.5, attempt_timeout_s=2.0)
    with pytest.raises(RegistrationTimeoutError) as info:
        asyncio.run(retry_until_deadline(attempt, policy, clock, "rm:1", sleep))
    assert calls[-1] < 2.0, "the last attempt had less than its full timeout"
    assert info.value.last_error is refusal
