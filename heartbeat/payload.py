"""Heartbeat payload and the pluggable providers that fill it.

A provider is any callable returning a mapping of figure names to numbers. The well-known names
(``PAYLOAD_FIELDS``) land in their typed fields; every other name goes to ``metrics`` (e.g.
shuffle buffer-pool figures). A provider may instead return a sequence of ``WorkProgress``: the
units of work the executor runs (Spark task attempts) and whether each advances, so the RM side
can tell a stuck one from a slow one, and ``Notice``s: one-line findings of the agent that the
driver side records as executor events (``notices.NoticeBoard`` carries each in several payloads,
the driver records it once). A provider that raises is logged once and skipped, so a broken
metric never silences the heartbeat that proves liveness.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkProgress:
    """One unit of work running on the executor (a task attempt) and its progress."""

    id: str
    label: str
    """What it is, for people: ``stage 3.0 partition 5 attempt 0 (task 42)``."""
    running_s: float
    idle_s: float
    """Seconds since it last progressed (its threads' CPU time advanced)."""
    stuck: bool = False
    """Idle past the executor's stuck-task timeout."""
    where: str = ""
    """Where it is stuck (a one-line stack excerpt, or why none could be taken), when stuck."""


NOTICE_KINDS = frozenset({"SHUFFLE_CORRUPT"})
"""The kinds a notice may have: each is the name of the ``events.EventKind`` it is recorded as. A
closed set, so a peer cannot invent event kinds; the wire drops a notice of any other kind."""
MAX_NOTICES = 32
"""Notices one payload carries at most (``wire.codec``), so also the most a ``NoticeBoard`` keeps."""
MAX_NOTICE_DETAIL_CHARS = 1024
"""A notice's detail at most (the history table keeps its first 512; the driver's log all of it)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A finding of the agent to be recorded once on the driver side as an executor event."""

    id: str
    """Unique within the agent process's life and across its restarts (``NoticeBoard``): the
    driver records each ``(executor, id)`` once however many payloads carry it."""
    kind: str
    """One of ``NOTICE_KINDS``."""
    detail: str
    """One printable line, at most ``MAX_NOTICE_DETAIL_CHARS``."""


PayloadProvider = Callable[[], Mapping[str, float | int | None] | Sequence[WorkProgress | Notice]]

PAYLOAD_FIELDS = ("slots_total", "slots_busy", "running_tasks", "rss_bytes", "jvm_pulse_age_ms")


@dataclass(frozen=True, slots=True)
class Payload:
    """What an agent reports with each heartbeat; None means "unknown"."""

    slots_total: int | None = None
    slots_busy: int | None = None
    running_tasks: int | None = None
    rss_bytes: int | None = None
    jvm_pulse_age_ms: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    work: tuple[WorkProgress, ...] = ()
    notices: tuple[Notice, ...] = ()


def collect_payload(providers: Sequence[PayloadProvider], failed: set[int] | None = None) -> Payload:
    """Merge every provider's figures; later providers win on a clash."""
    typed: dict[str, int] = {}
    metrics: dict[str, float] = {}
    work: list[WorkProgress] = []
    notices: list[Notice] = []
    for index, provider in enumerate(providers):
        try:
            figures = provider()
        except Exception:
            if failed is None or index not in failed:
                log.warning("heartbeat payload provider %r failed; skipping it", provider, exc_info=True)
                if failed is not None:
                    failed.add(index)
            continue
        if not isinstance(figures, Mapping):
            for item in figures:
                if isinstance(item, Notice):
                    notices.append(item)
                else:
                    work.append(item)
            continue
        for name, value in figures.items():
            if value is None:
                continue
            if name in PAYLOAD_FIELDS:
                typed[name] = int(value)
            else:
                metrics[name] = float(value)
    return Payload(metrics=metrics, work=tuple(work), notices=tuple(notices), **typed)


def slots_provider(total: int, busy: Callable[[], int] | None = None) -> PayloadProvider:
    """Slots total (fixed) and busy (sampled each heartbeat); busy doubles as running tasks."""

    def provide() -> Mapping[str, float | int | None]:
        used = busy() if busy is not None else 0
        return {"slots_total": total, "slots_busy": used, "running_tasks": used}

    return provide


def rss_provider(pid: int | None = None) -> PayloadProvider:
    """Resident set size of ``pid`` (default: this process), via psutil imported on first use."""
    import psutil

    process = psutil.Process(pid or os.getpid())

    def provide() -> Mapping[str, float | int | None]:
        return {"rss_bytes": process.memory_info().rss}

    return provide


def pulse_file_provider(path: str, clock: Clock = SYSTEM_CLOCK) -> PayloadProvider:
    """Age of the last liveness pulse of the hosting process, as the mtime of a file it touches.

    A host process touches ``path``; a frozen one stops touching it, so the age grows even while
    this agent keeps answering. A missing file reports unknown (None). The age is a file age, so
    it is measured on the wall clock (``clock.time()``, the reading an mtime compares with).
    """

    def provide() -> Mapping[str, float | int | None]:
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return {"jvm_pulse_age_ms": None}
        return {"jvm_pulse_age_ms": max(0, int((clock.time() - mtime) * 1000))}

    return provide


def static_provider(figures: Mapping[str, float | int | None]) -> PayloadProvider:
    """Fixed figures, e.g. for tests and the benchmark."""
    frozen = dict(figures)
    return lambda: frozen
