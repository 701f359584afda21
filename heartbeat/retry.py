"""``RetryPolicy`` and the retrying registration loop (Flink's ``RetryingRegistration``).

Delays grow exponentially from ``min_delay_s`` up to ``max_delay_s`` with "full jitter" (each
delay drawn uniformly from [(1 - jitter) * d, d]) so many agents restarting together do not
retry in lockstep. By default the loop never gives up (``deadline_s=None``): an agent that
stopped trying would leave its executor silently unmonitored while the RM is down, frozen or
restarting, however long that lasts, so it keeps trying at the capped delay. A caller that keeps a
deadline gets ``RegistrationTimeoutError`` past it and must end loudly (Flink's TaskExecutor exits
when ``taskmanager.registration.timeout`` passes).

A failed proof of the secret and a version refusal are retried by default: before the RM has
proved itself, the agent cannot tell them from a process squatting the RM's port (e.g. in the
gap while the RM restarts), and the real RM must find the agent still trying when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from arrowbeat_base.clock import Clock
from heartbeat.errors import (
    HeartbeatAuthenticationError,
    HeartbeatConfigError,
    HeartbeatRpcError,
    ProtocolVersionError,
    RegistrationTimeoutError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff; ``retry_on`` lists the errors worth another attempt.

    ``deadline_s=None`` (the default) retries for as long as the caller lives."""

    min_delay_s: float = 0.1
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    deadline_s: float | None = None
    attempt_timeout_s: float = 5.0
    retry_on: tuple[type[BaseException], ...] = field(
        default=(
            HeartbeatRpcError,
            UnknownExecutorError,
            StaleEpochError,
            StaleInstanceError,
            HeartbeatAuthenticationError,
            ProtocolVersionError,
            OSError,
        )
    )

    def __post_init__(self) -> None:
        checks: list[tuple[str, float, bool, str]] = [
            ("min_delay_s", self.min_delay_s, self.min_delay_s >= 0, ">= 0"),
            ("max_delay_s", self.max_delay_s, self.max_delay_s >= self.min_delay_s, ">= min_delay_s"),
            ("multiplier", self.multiplier, self.multiplier >= 1, ">= 1"),
            ("jitter", self.jitter, 0 <= self.jitter <= 1, "in [0, 1]"),
            ("attempt_timeout_s", self.attempt_timeout_s, self.attempt_timeout_s > 0, "> 0"),
        ]
        if self.deadline_s is not None:
            checks.append(
                ("deadline_s", self.deadline_s, self.deadline_s > 0, "> 0, or None for no deadline")
            )
        for name, value, ok, allowed in checks:
            if not (ok and math.isfinite(value)):
                raise HeartbeatConfigError(f"RetryPolicy.{name}", value, allowed)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Backoff before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        try:
            grown = self.min_delay_s * self.multiplier ** max(0, attempt - 1)
        except OverflowError:  # a registration retried for hours: long at the cap
            grown = math.inf
        base = min(self.max_delay_s, grown)
        draw = (rng or random).random()
        return base * (1.0 - self.jitter * draw)

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, self.retry_on)


async def retry_until_deadline(
    attempt: Callable[[float], Awaitable[T]],
    policy: RetryPolicy,
    clock: Clock,
    address: str,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
    on_failure: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Run ``attempt(timeout_s)`` until it succeeds, a non-retryable error escapes, or the policy's
    deadline (if it has one) passes.

    ``clock`` and ``sleep`` are injected so tests run the whole schedule without real waiting.
    ``on_failure(number, error)`` hears each retryable failure (the agent's ``RmOutage`` says at
    WARNING, rate-limited, how long the RM has been out of reach; here it is DEBUG only).
    """
    start = clock.monotonic()
    deadline = policy.deadline_s
    last_error: BaseException | None = None
    number = 0
    while True:
        number += 1
        remaining = math.inf if deadline is None else deadline - (clock.monotonic() - start)
        if deadline is not None and remaining <= 0:
            raise RegistrationTimeoutError(address, deadline, number - 1, last_error)
        timeout_s = min(policy.attempt_timeout_s, remaining)
        try:
            return await attempt(timeout_s)
        except Exception as exc:
            if not policy.is_retryable(exc):
                raise
            # An attempt the deadline cut short says less than the refusal before it.
            cut_short = isinstance(exc, TimeoutError) and timeout_s < policy.attempt_timeout_s
            if not (cut_short and last_error is not None):
                last_error = exc
            log.debug("registration attempt %d with %s failed: %r", number, address, exc)
            if on_failure is not None:
                on_failure(number, exc)
        remaining = math.inf if deadline is None else deadline - (clock.monotonic() - start)
        if deadline is not None and remaining <= 0:
            raise RegistrationTimeoutError(address, deadline, number, last_error)
        await sleep(min(policy.delay(number, rng), remaining))
