"""``NoticeBoard``: the agent's findings, carried to the driver side in its heartbeat payloads.

Why a board and not one payload: a payload answered just before the RM died, or on a stream
that broke, is lost with it, and a finding (a damaged map output: ``SHUFFLE_CORRUPT``) must not
be. So each notice rides in every payload until it has been in ``carry_payloads`` of them *and*
``carry_s`` seconds (on the injected clock) have passed since the first; the driver side records
each ``(executor, notice id)`` once (``spark_plugin.monitoring.driver_notices``). While no
heartbeat is asked for (the RM is down), nothing is carried, so nothing is used up.

Bounded however many findings come: at most ``max_pending`` notices wait (the oldest, carried
the most, go first, counted in ``dropped`` and logged), each detail one printable line of at
most ``payload.MAX_NOTICE_DETAIL_CHARS``, and a kind outside ``payload.NOTICE_KINDS`` is refused.
``add`` may be called from any thread; the heartbeat loop calls the board (a payload provider).
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
from dataclasses import dataclass

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.payload import MAX_NOTICE_DETAIL_CHARS, MAX_NOTICES, NOTICE_KINDS, Notice
from heartbeat.wire.text import one_line

log = logging.getLogger(__name__)

CARRY_PAYLOADS = 3
"""Payloads a notice rides in at least: two lost answers in a row still leave one."""
CARRY_S = 30.0
"""Seconds a notice rides at least after its first payload (heartbeat intervals may be short)."""
_CUT = "...(cut)"


@dataclass
class _Carried:
    notice: Notice
    carried: int = 0
    first_s: float | None = None


class NoticeBoard:
    """Notices waiting to reach the driver side; call the board for a payload's share of them."""

    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_pending: int = MAX_NOTICES,
        carry_payloads: int = CARRY_PAYLOADS,
        carry_s: float = CARRY_S,
    ) -> None:
        if not 1 <= max_pending <= MAX_NOTICES:
            raise ValueError(f"max_pending must be 1-{MAX_NOTICES}, got {max_pending}")
        if carry_payloads < 1 or carry_s < 0:
            raise ValueError("a notice is carried in at least one payload, for a non-negative time")
        self._clock = clock
        self._max = max_pending
        self._carry_payloads = carry_payloads
        self._carry_s = carry_s
        # A restarted agent's board must not reuse its predecessor's ids: the driver would take
        # a new finding for one it has recorded already.
        self._prefix = secrets.token_hex(4)
        self._seq = 0
        self._lock = threading.Lock()
        self._pending: collections.deque[_Carried] = collections.deque()
        self.dropped = 0
        """Notices dropped before they were carried long enough (more than ``max_pending`` came)."""

    def add(self, kind: str, detail: str) -> Notice:
        """Posts a notice (any thread); ``ValueError`` for a kind outside ``NOTICE_KINDS``."""
        if kind not in NOTICE_KINDS:
            raise ValueError(f"no notice kind {one_line(kind, 40)!r}; known: {sorted(NOTICE_KINDS)}")
        text = one_line(detail, MAX_NOTICE_DETAIL_CHARS - len(_CUT))
        with self._lock:
            self._seq += 1
            notice = Notice(f"{self._prefix}-{self._seq}", kind, text)
            self._pending.append(_Carried(notice))
            dropped = 0
            while len(self._pending) > self._max:
                self._pending.popleft()
                dropped += 1
            self.dropped += dropped
            total = self.dropped
        if dropped:  # outside the lock; at most one line per notice added
            log.warning(
                "%d notice(s) dropped before the driver surely had them (%d in all; more than %d came "
                "within a few heartbeats); the agent's log has each finding",
                dropped,
                total,
                self._max,
            )
        return notice

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def __call__(self) -> list[Notice]:
        """The notices for the payload being built (a ``PayloadProvider``): each one carried
        long enough is left out from now on."""
        now = self._clock.monotonic()
        with self._lock:
            kept = [c for c in self._pending if not self._done(c, now)]
            self._pending = collections.deque(kept)
            for carried in kept:
                carried.carried += 1
                if carried.first_s is None:
                    carried.first_s = now
            return [c.notice for c in kept]

    def _done(self, carried: _Carried, now: float) -> bool:
        return (
            carried.first_s is not None
            and carried.carried >= self._carry_payloads
            and now - carried.first_s >= self._carry_s
        )
