"""On the executor's agent: ending its frozen JVM (SIGKILL) when the RM timed it out (issue 37).

A JVM stopped by a signal (``SIGSTOP``: state ``T``) cannot act on the cluster manager's
SIGTERM; Spark's Worker then waits its own grace before SIGKILL, and the job waits with it. The
agent, a child process that outlives its JVM's freeze, can end it at once. It does so only when
the RM said so (``onHeartbeatTimeout=kill``, a timeout the RM trusts: ``heartbeat.rm.trust``,
sent on the registration's own authenticated stream) and only if it sees the same here:

* the JVM's pulse is stale on the agent's own clock (at least ``stale_s``: the age at which the
  agent stops answering the RM), so a JVM that pulses is never ended;
* the pid is still that JVM (its start time is the one read when the agent started);
* the JVM is stopped (state ``T``), not merely slow: a JVM in a long GC pause, swapping or
  starved of CPU runs (``R``/``S``/``D``), answers SIGTERM, and is left to Spark's kill; one a
  debugger holds (``t``, tracing stop) is left too. A pause of the agent itself cannot pass either:
  its JVM runs meanwhile.

Pure but for the two injected seams (the process view and the kill), so the decision is tested
on a fake clock without a JVM.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import psutil

log = logging.getLogger("arrowbeat.agent")


class ProcessView(Protocol):
    """What the decision reads of a process (``psutil.Process`` has both)."""

    def create_time(self) -> float: ...

    def status(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    kill: bool
    why: str


class FrozenJvm:
    """The agent's judge of its own JVM: :meth:`on_kill_host` is ``AgentThread``'s
    ``on_kill_host`` (the RM's word), :meth:`verdict` the local check it runs first."""

    def __init__(
        self,
        pid: int,
        pulse_age_s: Callable[[], float],
        stale_s: float,
        *,
        lookup: Callable[[int], ProcessView] = psutil.Process,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.pid = pid
        self._pulse_age_s = pulse_age_s
        self._stale_s = stale_s
        self._lookup = lookup
        self._kill = kill
        self._created = lookup(pid).create_time()  # the JVM that started us: raises if it is gone

    def verdict(self) -> Verdict:
        """Whether the JVM is frozen here and now, and why (or why not)."""
        age = self._pulse_age_s()
        if age < self._stale_s:
            return Verdict(False, f"its JVM pulsed {age:.2f} s ago: it runs")
        try:
            process = self._lookup(self.pid)
            created, status = process.create_time(), process.status()
        except psutil.Error as exc:
            return Verdict(False, f"its JVM (pid {self.pid}) cannot be read: {type(exc).__name__}")
        if created != self._created:
            return Verdict(False, f"pid {self.pid} is another process now")
        if status != psutil.STATUS_STOPPED:
            return Verdict(
                False,
                f"its JVM is {status}, not stopped (a GC pause or a slow JVM: Spark's own kill reaches it)",
            )
        return Verdict(True, f"its JVM (pid {self.pid}) is stopped and has not pulsed for {age:.2f} s")

    def on_kill_host(self, reason: str) -> None:
        """The RM timed this executor out (``reason``) and says its JVM may be ended if frozen."""
        verdict = self.verdict()
        if not verdict.kill:
            log.warning("the RM timed this executor out (%s); its JVM is not ended: %s", reason, verdict.why)
            return
        log.warning("the RM timed this executor out (%s) and %s: SIGKILL", reason, verdict.why)
        try:
            self._kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            log.info("the JVM (pid %d) was gone already", self.pid)


__all__ = ["FrozenJvm", "ProcessView", "Verdict"]
