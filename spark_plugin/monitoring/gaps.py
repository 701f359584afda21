"""What a silence of the executor JVM was, from the JVM's own figures across it (issue 17).

Pure: no clock, no I/O. The executor side (``monitoring.executor_tasks``) measures a gap between
the JVM's lines and logs its cause; the driver side (``monitoring.driver_tasks``) names the same
cause in a re-registration's detail, from the figures the agent's heartbeat carried. Both classify
with :func:`explain_gap`, so the two sides always agree.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Gap:
    """The JVM's lines stopped for ``seconds``; what its own figures say happened meanwhile."""

    seconds: float
    gc_s: float
    cpu_s: float
    """Negative if unknown."""

    @property
    def cause(self) -> str:
        return explain_gap(self.seconds, self.gc_s, self.cpu_s)


def explain_gap(seconds: float, gc_s: float, cpu_s: float) -> str:
    """``garbage collection``, ``process stopped`` or ``unknown``, with the evidence.

    GC covering at least half of the gap is a GC pause; no GC and (almost) no CPU at all is a
    stopped process (``SIGSTOP``, a frozen VM or container); anything else is not known."""
    evidence = f"{gc_s:.2f}s of GC and {'?' if cpu_s < 0 else f'{cpu_s:.2f}s'} of CPU in a {seconds:.2f}s gap"
    if gc_s >= 0.5 * seconds:
        return f"garbage collection ({evidence})"
    if gc_s < 0.05 * seconds and 0 <= cpu_s < 0.05 * seconds:
        return f"process stopped: no GC, no CPU ({evidence})"
    return f"unknown ({evidence})"


__all__ = ["Gap", "explain_gap"]
