"""The project's one clock abstraction, shared by the heartbeat library, the shuffle engine and the
plugin's processes.

Two readings, for two different jobs: ``monotonic()`` for every interval, deadline and timeout
(it never jumps when the system time is set), ``time()`` only for timestamps that are recorded
(history rows, file ages). Everything that measures time takes a ``Clock``, so tests move a
``ManualClock`` instead of sleeping (trio's ``MockClock.jump``).
"""

from __future__ import annotations

import threading
import time as _time
from typing import Protocol


class Clock(Protocol):
    """A source of time: ``monotonic()`` for durations, ``time()`` for recorded timestamps."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin; only differences are meaningful."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the Unix epoch, for timestamps that are written down."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` and ``time.time``."""

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()


SYSTEM_CLOCK = SystemClock()
"""The shared real clock; the default wherever a ``Clock`` is optional."""


class ManualClock:
    """A clock that only moves when told to, for sleep-free tests.

    Both readings move together: ``jump(2)`` adds two seconds to ``monotonic()`` and to ``time()``.
    """

    def __init__(self, start: float = 0.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._wall_offset = wall_start - start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def set(self, value: float) -> None:
        """Move ``monotonic()`` to ``value``; going backwards is refused."""
        with self._lock:
            if value < self._now:
                raise ValueError(f"a monotonic clock cannot go back from {self._now} to {value}")
            self._now = value

    def jump(self, seconds: float) -> None:
        """Move both readings forward by ``seconds``."""
        self.set(self.monotonic() + seconds)
