"""Time sources. Everything that measures time takes a ``Clock`` so tests can jump it."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds; only differences are meaningful."""

    def now(self) -> float: ...


class MonotonicClock:
    """The real clock (``time.monotonic``)."""

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to (trio's ``MockClock.jump``), for sleep-free tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def set(self, value: float) -> None:
        """Move to ``value``; going backwards would break monotonicity, so it is refused."""
        with self._lock:
            if value < self._now:
                raise ValueError(f"a monotonic clock cannot go back from {self._now} to {value}")
            self._now = value

    def jump(self, seconds: float) -> None:
        self.set(self.now() + seconds)
