"""On the executor's agent: whether to answer the RM, in the fast (phi) detection mode (issue 37).

The agent answers the RM's heartbeat requests only while its executor JVM is alive: a frozen JVM
must look dead to the RM although the agent runs. With the ``timeout`` detector the test is the
JVM's pulse alone (pulsed within one heartbeat interval), and the RM waits a whole timeout
before it reports the silence, which absorbs a JVM's garbage-collection pauses. The ``phi``
detector reports a silence a few hundred milliseconds after the executor's usual rhythm breaks,
so the agent must not fall silent for a pause that ends by itself. It tells the two apart here,
from what it can see of its JVM:

* pulsed within ``fresh_s`` (one interval; pulses come every half interval): alive, answer;
* a stale pulse and the JVM stopped by a signal (``SIGSTOP``: state ``T``), traced by a debugger
  (``t``), a zombie, gone, or the pid now another process: frozen, stay silent at once;
* a stale pulse but the JVM running, sleeping or in disk wait (``R``/``S``/``D``): a
  stop-the-world GC, a JVM starved of CPU or swapping: alive, answer, up to ``bound_s`` (the
  heartbeat timeout) without a pulse, after which it is silent whatever its state, as with the
  ``timeout`` detector (a JVM that never pulses again is hung);
* the agent's own pause cannot make it silent: after its own stall the pulse looks stale, but the
  JVM is not stopped.

One read of ``/proc/<pid>/stat`` (through psutil) per heartbeat request while the pulse is stale,
none while it is fresh. Pure but for the injected process view, so the rule is tested on a fake
clock (``tests/spark_plugin/test_jvm_health.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil

from spark_plugin.monitoring.executor_frozen_jvm import ProcessView

log = logging.getLogger("arrowbeat.agent")

NOT_RUNNING = frozenset(
    {psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD}
)
"""States of a JVM that runs nothing: stopped by a signal, held by a debugger, ended."""


class JvmHealth:
    """The agent's ``is_healthy`` in the ``phi`` detection mode (see the module doc)."""

    def __init__(
        self,
        pid: int,
        pulse_age_s: Callable[[], float],
        fresh_s: float,
        bound_s: float,
        *,
        lookup: Callable[[int], ProcessView] = psutil.Process,
    ) -> None:
        if not 0 < fresh_s <= bound_s:
            raise ValueError(f"expected 0 < fresh_s ({fresh_s}) <= bound_s ({bound_s})")
        self.pid = pid
        self._pulse_age_s = pulse_age_s
        self._fresh_s = fresh_s
        self._bound_s = bound_s
        self._lookup = lookup
        self._created = lookup(pid).create_time()  # the JVM that started us: raises if it is gone
        self.paused_answers = 0
        """Requests answered while the pulse was stale but the JVM ran (a GC pause, a slow JVM)."""

    def healthy(self) -> bool:
        """Whether the agent should answer the RM now."""
        age = self._pulse_age_s()
        if age < self._fresh_s:
            return True
        if age >= self._bound_s:
            return False
        try:
            process = self._lookup(self.pid)
            created, status = process.create_time(), process.status()
        except psutil.Error:
            return False  # gone: nothing of it runs
        if created != self._created or status in NOT_RUNNING:
            return False
        self.paused_answers += 1
        return True


__all__ = ["NOT_RUNNING", "JvmHealth"]
