"""``RmOutage``: what an agent says while it cannot reach its RM (transport-free, clock injected).

Why: an agent logged each failed registration attempt at DEBUG only, so an executor's log could
show nothing for hours while its executor was unmonitored. Now the agent says it at WARNING when
it loses the RM (or first fails to reach it), then once a minute (``every_s``) with how long it
has been without it and how many attempts failed since the last line, and once more when it is
registered again. The per-attempt DEBUG line stays (``retry``).

The minute is a ``RateLog`` keyed by the outage (one key at a time), so each outage starts its
own schedule; time is ``monotonic()`` of an injected ``arrowbeat_base.clock.Clock``, so a test moves
a ``ManualClock`` instead of waiting. Called on the agent's loop only (no lock of its own).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog
from heartbeat.wire.text import one_line

log = logging.getLogger("heartbeat.agent.async_agent")

EVERY_S = 60.0
"""How often a continuing outage is logged again."""


class RmOutage:
    """One agent's view of its RM's reachability, as log lines; ``address()`` is the RM it dials
    now (it may change: a restarted RM on another port)."""

    def __init__(
        self,
        executor_id: str,
        address: Callable[[], str],
        clock: Clock = SYSTEM_CLOCK,
        every_s: float = EVERY_S,
        logger: logging.Logger = log,
    ) -> None:
        self._executor_id = executor_id
        self._address = address
        self._clock = clock
        self._log = logger
        self._every_s = every_s
        self._rate = RateLog(None, every_s, clock, max_keys=1)
        self._since: float | None = None
        self._number = 0
        self._failed = 0

    @property
    def since(self) -> float | None:
        """When the current outage began (``clock.monotonic()``), or None while the RM is reached."""
        return self._since

    def lost(self, why: str) -> None:
        """A registered session ended and the agent registers again: a WARNING at once."""
        if self._since is not None:
            return
        self._begin()
        self._rate.admit(self._key())  # this line opens the outage's minute
        self._log.warning(
            "agent %s lost the RM at %s (%s); registering again, and saying so every %g s while it lasts",
            self._executor_id,
            self._address(),
            one_line(why, 300),
            self._every_s,
        )

    def failed(self, attempt: int, error: BaseException) -> None:
        """A registration attempt failed: a WARNING for the first of an outage, then once a minute."""
        if self._since is None:
            self._begin()
        self._failed += 1
        unlogged = self._rate.admit(self._key())
        if unlogged is None:
            return
        assert self._since is not None
        self._log.warning(
            "agent %s has had no RM for %.0f s: %d registration attempts with %s failed, the last: %s",
            self._executor_id,
            self._clock.monotonic() - self._since,
            self._failed,
            self._address(),
            one_line(repr(error), 300),
        )

    def registered(self) -> None:
        """The RM accepted a registration: the outage (if any) is over, said once."""
        if self._since is None:
            return
        self._log.warning(
            "agent %s registered with the RM at %s again after %.1f s without it (%d attempts failed)",
            self._executor_id,
            self._address(),
            self._clock.monotonic() - self._since,
            self._failed,
        )
        self._since = None

    def _begin(self) -> None:
        self._since = self._clock.monotonic()
        self._number += 1
        self._failed = 0

    def _key(self) -> str:
        return f"outage-{self._number}"
