"""``RateLog``: at most one log line per key every ``every_s``, and a count of the rest.

Why: a peer sending garbage, a folder full of planted files or a flood of malformed HTTP requests
must not fill a log, and one cause must not hide another. So every place of arrowbeat that logs
what a peer or the disk did to it logs through one of these, keyed by cause (or path): the
engine's accept loops and the agent's path checks, the RM's refusals, the live page's HTTP log.
Each keeps its own line format; the rate, the counts and the bound on keys are this one's.

Time is ``monotonic()`` of an injected ``arrowbeat_base.clock.Clock``, so a test moves a
``ManualClock`` across the interval instead of waiting a minute. It sits beside the clock in the
base layer (``tests/test_architecture.py``): the engine, the heartbeat library and the plugin may
all import it, and it imports nothing but the clock (no gRPC, no pyspark).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

MORE_LIKE_IT = " ({} more like it not logged)"
"""The default mark of a line after left-out ones (``{}``: how many)."""


@dataclass
class _Key:
    logged_at: float
    unlogged: int = 0
    total: int = 0


class RateLog:
    """Logs an event of a key unless one of the same key was logged within ``every_s``; counts
    every event and those left out. At most ``max_keys`` keys are kept (the oldest is forgotten
    first), so keys that come from outside cannot grow it without bound."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        every_s: float = 60.0,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_keys: int = 256,
        more: str = MORE_LIKE_IT,
    ) -> None:
        """``logger``: where ``log``/``warning`` write (``None`` for a user of ``admit`` only).
        ``more``: appended to a line that follows left-out ones, ``{}`` replaced by their number."""
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._max_keys = max_keys
        self._more = more
        self._lock = threading.Lock()
        self._keys: dict[str, _Key] = {}

    def admit(self, key: str) -> int | None:
        """Count an event of ``key``. ``None`` if it is to be left out (one of ``key`` was logged
        within ``every_s``); else it may be logged, and the number of events of ``key`` left out
        since its last line is returned."""
        now = self._clock.monotonic()
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None and now - entry.logged_at < self._every_s:
                entry.unlogged += 1
                entry.total += 1
                return None
            if entry is None:
                if len(self._keys) >= self._max_keys:
                    self._keys.pop(next(iter(self._keys)))
                entry = self._keys[key] = _Key(now)
            unlogged, entry.unlogged, entry.logged_at = entry.unlogged, 0, now
            entry.total += 1
            return unlogged

    def log(self, key: str, level: int, message: str, *args: object, exc_info: bool = False) -> bool:
        """``message % args`` at ``level`` (marked with ``more`` after left-out ones) unless
        ``key`` was logged within ``every_s``; whether it was logged."""
        unlogged = self.admit(key)
        if unlogged is None:
            return False
        if self._logger is None:
            raise ValueError("this RateLog has no logger: use admit()")
        suffix = self._more.format(unlogged) if unlogged else ""
        self._logger.log(level, message + suffix, *args, exc_info=exc_info)
        return True

    def warning(self, key: str, message: str, *args: object) -> bool:
        """``log`` at WARNING."""
        return self.log(key, logging.WARNING, message, *args)

    def counts(self) -> dict[str, int]:
        """Events so far per key (of the keys kept), logged or not."""
        with self._lock:
            return {key: entry.total for key, entry in self._keys.items()}

    def __len__(self) -> int:
        """How many keys are kept."""
        with self._lock:
            return len(self._keys)
