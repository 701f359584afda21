"""Whether the RM may act on a heartbeat timeout: the silence must be the agent's, not the RM's.

The RM is the heartbeat sender: an agent can only answer the requests it was sent. If the RM's
own loop stalled (its process was paused, starved of CPU, or blocked), it sent nothing for a
while and its monitors' timers fire late: every agent then looks silent. Such a silence judges
nothing: the monitor's vetting (``HeartbeatMonitor.set_vetting``) vetoes it, the agent keeps its
registration and its silence counts again from then, so one that really stopped is timed out a
timeout later, on evidence of its own. That vetting is the one judge: a timeout the RM records is
one it trusts. Pure: the times are readings of the RM's monotonic clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable


def own_stall_s(sent: Iterable[float], since: float, now: float) -> float:
    """The longest stretch of ``(since, now]`` in which the RM sent no request to the agent:
    between its last answer (``since``), each unanswered request, and the timeout's check."""
    points = sorted(t for t in sent if since < t <= now)
    edges = [since, *points, now]
    return max(later - earlier for earlier, later in itertools.pairwise(edges))


def stall_bound_s(interval_s: float, timeout_s: float) -> float:
    """The longest gap between two of the RM's own requests that is not its stall: one missed
    sweep (two intervals), or half the timeout if that is longer."""
    return max(2.0 * interval_s, timeout_s / 2.0)


def trusted_timeout(
    sent: Iterable[float], since: float | None, now: float, interval_s: float, timeout_s: float
) -> tuple[bool, float]:
    """``(trusted, stall)``: the timeout is the agent's silence only if the RM asked it steadily
    over the timeout's window (``since``, the last answer, or a timeout ago if none or older).
    ``stall`` is the RM's own longest silence in that window, for the record."""
    start = now - timeout_s if since is None else max(since, now - timeout_s)
    stall = own_stall_s(sent, start, now)
    return stall <= stall_bound_s(interval_s, timeout_s), stall


__all__ = ["own_stall_s", "stall_bound_s", "trusted_timeout"]
