"""Monitoring gaps: the intervals in which the RM kept no history, recorded so that a reader of the
tables never mistakes a hole for health.

The JVM restarts a driver-side process that died or hung (``ArrowBeatDriverPlugin``). The process
it replaces cannot say what it lost, so every answer it gave the JVM's pulse said how far its
history was complete (``complete_until``: every row recorded before that wall-clock time is
committed) and how many rows it held uncommitted. The JVM hands the last answer it got to the
restarted process (the ``arrowbeat.rm.restart.*`` settings, :func:`carried_gap`), which records
one ``MONITORING_GAP`` event in ``executor_events``:

* ``ts``: where the gap starts (the old process's ``complete_until``; history before it is
  complete), the detail (:func:`gap_detail`): ``from=<ISO> to=<ISO> lost_rows=<n> cause=<text>``,
  ``to`` being when the restarted RM began serving (history after it is kept again);
* ``lost_rows``: rows the old process had recorded but not committed at its last answer, lost in
  flight. The flusher commits once per flush interval, so they are at most one interval's rows
  (more only while commits were failing, which the rows' retry keeps buffered). Rows recorded
  after the last answer (at most one pulse interval's, and none for a frozen process) are not
  counted: the number is a lower bound;
* ``executor_id`` empty (the gap is every executor's), ``instance_id`` the restarted RM's epoch.

Until the restarted process's own first complete commit (which carries the gap event), its answers
pass the carried gap on (:class:`GapBook`): a process that dies before committing it does not lose
the gap; the next one records it, from the same start, with the rows lost in between added.
Pure bookkeeping: clock readings and the writer's figures are passed in.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from arrowbeat_base.clock import Clock

KIND = "MONITORING_GAP"
"""The ``event`` of a gap's row (``heartbeat.EventKind.MONITORING_GAP``)."""

FROM_MS = "arrowbeat.rm.restart.fromMs"
UNSAVED_ROWS = "arrowbeat.rm.restart.unsavedRows"
CAUSE = "arrowbeat.rm.restart.cause"
"""Settings the JVM adds when it restarts the driver-side process (``ArrowBeatDriverPlugin``):
the last answer of the process it replaces (or the one before, if that one never answered) and
why it was replaced."""
MAX_CAUSE_CHARS = 300

_DETAIL = re.compile(r"from=(\S+) to=(\S+) lost_rows=(\d+) cause=(.*)", re.DOTALL)


@dataclass(frozen=True)
class CarriedGap:
    """What the JVM handed a restarted process: where its predecessor's complete history ended
    (wall-clock seconds; None if unknown: it kept no history), its rows lost in flight, and why
    it was replaced."""

    start: float | None
    lost_rows: int
    cause: str


@dataclass(frozen=True)
class MonitoringGap:
    """An interval without history: ``start`` to ``end`` (wall-clock seconds; ``start`` None if
    unknown), why, and how many rows were lost in flight (a lower bound, see the module doc)."""

    start: float | None
    end: float
    cause: str
    lost_rows: int

    @property
    def seconds(self) -> float | None:
        return None if self.start is None else max(0.0, self.end - self.start)


def carried_gap(settings: Mapping[str, str]) -> CarriedGap | None:
    """The gap the JVM handed over (this process replaces one that died or hung), or None for a
    first start. A malformed number reads as unknown (0): the gap is still recorded."""
    cause = settings.get(CAUSE)
    if cause is None:
        return None
    from_ms, lost = _count(settings.get(FROM_MS, "")), _count(settings.get(UNSAVED_ROWS, ""))
    return CarriedGap(from_ms / 1000.0 if from_ms > 0 else None, lost, cause[:MAX_CAUSE_CHARS] or "unknown")


def _count(text: str) -> int:
    return int(text) if text.isdigit() and len(text) <= 15 else 0


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def gap_detail(gap: MonitoringGap) -> str:
    """The ``detail`` of a gap's row: ``from=<ISO|unknown> to=<ISO> lost_rows=<n> cause=<text>``
    (:func:`parse_gap` reads it back; SQL readers can ``regexp_extract`` it)."""
    start = "unknown" if gap.start is None else _iso(gap.start)
    cause = " ".join(gap.cause.split())[:MAX_CAUSE_CHARS]
    return f"from={start} to={_iso(gap.end)} lost_rows={gap.lost_rows} cause={cause}"


def parse_gap(detail: str | None) -> MonitoringGap | None:
    """A gap's row detail read back; None if it is not one."""
    found = _DETAIL.fullmatch(detail or "")
    if found is None:
        return None
    try:
        start = None if found[1] == "unknown" else _parse_iso(found[1])
        end = _parse_iso(found[2])
    except ValueError:
        return None
    return MonitoringGap(start, end, found[4], int(found[3]))


def _parse_iso(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def describe(gap: MonitoringGap) -> str:
    """One line for people (the CLI, the log): which interval has no history, and why."""
    start = "an unknown time" if gap.start is None else _iso(gap.start)
    span = "" if gap.seconds is None else f" ({gap.seconds:.1f} s)"
    return (
        f"no history from {start} to {_iso(gap.end)}{span}: {gap.cause}; "
        f"{gap.lost_rows} rows lost in flight (at least)"
    )


class GapBook:
    """The driver-side process's answers to the JVM's pulses, and the gap it records at start.

    ``complete_until`` and ``unsaved_rows`` are the history writer's (``HistoryWriter``), or None
    without history. While this process carries a gap whose row it has not committed yet, its
    answers pass that gap on (its start, its lost rows plus ours), see the module doc."""

    def __init__(
        self,
        clock: Clock,
        carried: CarriedGap | None,
        complete_until: Callable[[], float] | None,
        unsaved_rows: Callable[[], int],
    ) -> None:
        self._clock = clock
        self._carried = carried
        self._complete_until = complete_until
        self._unsaved_rows = unsaved_rows
        self._recorded_at: float | None = None

    def gap(self) -> MonitoringGap | None:
        """The gap to record now (the RM serves from now on), once; None on a first start."""
        if self._carried is None or self._recorded_at is not None:
            return None
        now, carried = self._clock.time(), self._carried
        start = None if carried.start is None else min(carried.start, now)
        return MonitoringGap(start, now, carried.cause, carried.lost_rows)

    def recorded(self) -> None:
        """The gap's row was handed to the writer (call right after ``append``)."""
        self._recorded_at = self._clock.time()

    def answer(self) -> tuple[int, int]:
        """``(complete_until_ms, unsaved_rows)`` for :func:`protocol.alive_line`: ``(0, 0)``
        without history (a restart then records a gap of unknown start)."""
        if self._complete_until is None:
            return 0, 0
        complete, unsaved = self._complete_until(), self._unsaved_rows()
        carried = self._carried
        if carried is not None and (self._recorded_at is None or complete <= self._recorded_at):
            # round, not floor: the JVM recognises the start it handed over, to the millisecond
            start = 0 if carried.start is None else round(carried.start * 1000)
            return start, carried.lost_rows + unsaved
        return _ms(complete), unsaved


def _ms(ts: float) -> int:
    return max(0, math.floor(ts * 1000))


__all__ = [
    "CAUSE",
    "FROM_MS",
    "KIND",
    "UNSAVED_ROWS",
    "CarriedGap",
    "GapBook",
    "MonitoringGap",
    "carried_gap",
    "describe",
    "gap_detail",
    "parse_gap",
]
