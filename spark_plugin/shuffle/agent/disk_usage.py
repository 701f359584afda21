"""``DiskUsage``: the agent's map-output disk figure, walked off the heartbeat loop (agent side).

Why: every heartbeat payload carried ``shuffle_disk_bytes``, computed by walking the whole shuffle
directory on the loop that answers the RM (80 ms over 20,000 files warm); a hung disk blocked
heartbeats, and then the JVM's hang check killed and restarted the agent, over and over. Now one
background thread walks every ``every_s`` and keeps the last total; a payload reads it and never
waits. While a walk hangs, payloads carry the last total, and a WARNING (rate-limited) says how
long the walk has taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog

log = logging.getLogger("arrowbeat.agent")

SLOW_WALK_S = 60.0
"""A walk still running after this long is logged (at most once a minute)."""


class DiskUsage:
    """The last total of ``walk()`` (None before the first), refreshed by a daemon thread every
    ``every_s`` (a walk at a time; the first at :meth:`start`)."""

    def __init__(self, walk: Callable[[], int], every_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._walk = walk
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._bytes: int | None = None
        self._walking_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._slow = RateLog(log, 60.0, clock, max_keys=1)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shuffle-disk-usage", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the refreshes; a walk that hangs is left to its daemon thread."""
        self._stop.set()

    def bytes(self) -> int | None:
        """The last walked total, at once; says (rate-limited) when the walk in progress is slow."""
        with self._lock:
            total, since = self._bytes, self._walking_since
        if since is not None and self._clock.monotonic() - since > SLOW_WALK_S:
            self._slow.warning(
                "slow",
                "the shuffle directory's disk use has been walked for %.0f s (a slow or hung disk?); "
                "heartbeats carry the last total meanwhile",
                self._clock.monotonic() - since,
            )
        return total

    def refresh(self) -> None:
        """One walk, here and now (the thread's work; a test may call it)."""
        with self._lock:
            self._walking_since = self._clock.monotonic()
        try:
            total = self._walk()
        except OSError as exc:
            log.warning("walking the shuffle directory for its disk use failed: %s", exc)
            total = None
        with self._lock:
            self._walking_since = None
            if total is not None:
                self._bytes = total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._every_s)
