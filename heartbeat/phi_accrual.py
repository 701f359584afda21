"""Phi accrual: how unlikely a target's silence is, given its own heartbeat history.

Hayashibara et al.'s accrual failure detector, with the semantics of Akka's (Pekko's)
``PhiAccrualFailureDetector``: the intervals between a target's heartbeats are kept in a
sliding window; the silence since the last one is judged against a normal distribution of
that window's mean and standard deviation, shifted by an acceptable pause and with a floor
on the deviation, and ``phi = -log10(1 - CDF(silence))``. A phi of 8 means a chance of about
1e-8 that a target behaving as it did so far is still alive. The threshold is therefore per
target: a steady target is suspected soon after its rhythm breaks, a jittery one (a loaded
host, a busy loop) only after a silence its own jitter does not explain.

The CDF is Akka's logistic approximation (error under 0.01 %); ``suspect_after_s`` turns the
threshold into the silence at which phi reaches it (``mean + pause + y * std``, with ``y`` solved
once per threshold), so a monitor arms one timer instead of polling phi. Pure, O(1) per
heartbeat (running sums): no clock here, the caller passes its readings.
"""

from __future__ import annotations

import collections
import functools
import math
from dataclasses import dataclass

from heartbeat.errors import HeartbeatConfigError

_A, _B = 1.5976, 0.070566  # Akka's logistic approximation of the normal CDF
_LN10 = math.log(10.0)


def phi_of(y: float) -> float:
    """Phi of a silence ``y`` standard deviations past the (pause-shifted) mean."""
    if y <= -10.0:  # far inside the usual interval (and exp() would overflow below)
        return 0.0
    exponent = y * (_A + _B * y * y)  # e = exp(-exponent)
    if y > 0:
        # -log10(e / (1 + e)) written so that a long silence does not underflow e to 0.
        return exponent / _LN10 + math.log1p(math.exp(-exponent)) / _LN10
    return -math.log10(1.0 - 1.0 / (1.0 + math.exp(-exponent)))


@functools.lru_cache(maxsize=64)
def deviations_for(threshold: float) -> float:
    """The ``y`` at which :func:`phi_of` reaches ``threshold`` (it rises with ``y``): bisection."""
    low, high = -10.0, 50.0
    for _ in range(100):
        middle = (low + high) / 2.0
        if phi_of(middle) < threshold:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True)
class PhiSettings:
    """How a phi accrual monitor judges; validated on construction.

    ``threshold``: phi at which a target is suspected (Akka's default 8: about 1e-8 of a
    false suspicion for a target as steady as its history). ``acceptable_pause_s``: a silence
    this much longer than usual is not counted (the margin for a late answer, a short pause).
    ``min_std_s``: the deviation never counts as below this (a perfectly steady history must not
    make the next late answer a suspicion). ``first_interval_s``: the expected interval, which
    seeds the history so a new target is judged from its first heartbeat. ``window``: how many
    intervals the history keeps. ``late_check_s``: a check that runs this much later than planned
    judges nothing (the observer itself was paused: the silence may be its own).
    """

    threshold: float = 8.0
    acceptable_pause_s: float = 0.2
    min_std_s: float = 0.025
    first_interval_s: float = 0.1
    window: int = 200
    late_check_s: float = 0.1

    def __post_init__(self) -> None:
        positive = {
            "threshold": self.threshold,
            "min_std_s": self.min_std_s,
            "first_interval_s": self.first_interval_s,
            "late_check_s": self.late_check_s,
        }
        for name, value in positive.items():
            if not (_is_number(value) and math.isfinite(value) and value > 0):
                raise HeartbeatConfigError(name, value, "a finite number > 0")
        pause = self.acceptable_pause_s
        if not (_is_number(pause) and math.isfinite(pause) and pause >= 0):
            raise HeartbeatConfigError("acceptable_pause_s", pause, "a finite number >= 0 (seconds)")
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise HeartbeatConfigError("window", self.window, "an integer >= 2")

    @classmethod
    def for_interval(
        cls, interval_s: float, threshold: float = 8.0, acceptable_pause_s: float = 0.2
    ) -> PhiSettings:
        """The settings for heartbeats every ``interval_s``: a deviation floor of a quarter
        interval (Akka's is a tenth at 1 s; a shorter interval is relatively noisier), a late
        check bound of one interval (at least 50 ms) and the history of the last 200 intervals."""
        return cls(
            threshold=threshold,
            acceptable_pause_s=acceptable_pause_s,
            min_std_s=interval_s / 4.0,
            first_interval_s=interval_s,
            window=200,
            late_check_s=max(0.05, interval_s),
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class PhiAccrual:
    """One target's interval history and the phi of a silence against it."""

    def __init__(self, settings: PhiSettings) -> None:
        self.settings = settings
        self._intervals: collections.deque[float] = collections.deque()
        self._sum = 0.0
        self._squares = 0.0
        self._y = deviations_for(settings.threshold)
        # Akka's seed: the expected interval +- a quarter of it, so the first silence is judged.
        first = settings.first_interval_s
        for seed in (first - first / 4.0, first + first / 4.0):
            self._add(seed)

    def _add(self, interval: float) -> None:
        self._intervals.append(interval)
        self._sum += interval
        self._squares += interval * interval
        if len(self._intervals) > self.settings.window:
            old = self._intervals.popleft()
            self._sum -= old
            self._squares -= old * old

    def add_interval(self, interval_s: float) -> None:
        """The time between two heartbeats (a negative one, from a clock's rounding, counts as 0)."""
        self._add(max(0.0, interval_s))

    @property
    def samples(self) -> int:
        return len(self._intervals)

    @property
    def mean_s(self) -> float:
        return self._sum / len(self._intervals)

    @property
    def std_s(self) -> float:
        """The window's standard deviation, never below ``min_std_s``."""
        n = len(self._intervals)
        variance = max(0.0, self._squares / n - (self._sum / n) ** 2)
        return max(math.sqrt(variance), self.settings.min_std_s)

    def phi(self, silent_s: float) -> float:
        """Phi of a silence of ``silent_s`` since the last heartbeat."""
        shifted_mean = self.mean_s + self.settings.acceptable_pause_s
        return phi_of((silent_s - shifted_mean) / self.std_s)

    def suspect_after_s(self) -> float:
        """The silence at which phi reaches the threshold, for the history as it stands."""
        return self.mean_s + self.settings.acceptable_pause_s + self._y * self.std_s


__all__ = ["PhiAccrual", "PhiSettings", "deviations_for", "phi_of"]
