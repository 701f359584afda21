"""Whether Spark replaces an executor whose arrowbeat map outputs are lost (driver side).

An executor's agent died, or the files of its map outputs vanished: Spark still lists them as
that executor's outputs, so their readers would fail until their retries run out. Killing and
replacing the executor (what Spark itself does with one whose heartbeats time out) makes Spark
forget what it ran there and recompute exactly those map partitions. The executor's JVM plugin
reports the loss as a fact (``protocol.OutputsLost``, relayed by the driver's JVM); this module
decides, and the driver's JVM executes the ``kill-executor`` it is asked for and says what became
of it (``protocol.ReplacementOutcome``).

The rules (the numbers are the launcher's of before, unchanged):

* an executor that never started a task holds no map outputs: its agent's end loses nothing;
* once per executor: a loss already taken is not taken again (a refused one may ask again later);
* at most :data:`MAX_REPLACEMENTS` per :data:`WINDOW_S` seconds, so an agent that dies on every
  new executor cannot make Spark replace executors forever; only replacements Spark accepted use
  up the budget (a refused or impossible one is given back when its outcome arrives).

Time is ``clock.monotonic()`` of an injected ``arrowbeat_base.clock.Clock``, so tests move a
``ManualClock``. Called on the JVM link's thread only (``SparkView``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm.protocol import OutputsLost, ReplacementOutcome

log = logging.getLogger("arrowbeat.lost_outputs")

MAX_REPLACEMENTS = 5
WINDOW_S = 600.0


class LostOutputs:
    """The budget and the once-per-executor rule; ``kill(executor_id)`` asks the JVM to have Spark
    kill and replace the executor (``JvmChannel.kill_executor``)."""

    def __init__(
        self,
        kill: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
        max_replacements: int = MAX_REPLACEMENTS,
        window_s: float = WINDOW_S,
    ) -> None:
        self._kill = kill
        self._clock = clock
        self._max = max_replacements
        self._window_s = window_s
        self._charged: deque[float] = deque()
        """When each replacement that counts against the budget was asked for, oldest first."""
        self._pending: dict[str, float] = {}
        """Replacements asked for whose outcome has not arrived: executor id to its charge."""
        self._taken: set[str] = set()
        """Executors whose loss was taken, until Spark removes them (their ids are never reused)."""

    def on_lost(self, lost: OutputsLost) -> bool:
        """Decides on one reported loss; True if Spark was asked to replace the executor."""
        executor = lost.executor_id
        if lost.tasks_started == 0:
            log.error(
                "arrowbeat map outputs of executor %s reported lost (%s), but no task ran there, so no "
                "map outputs are lost; the executor runs on without its agent",
                executor,
                lost.reason,
            )
            return False
        if executor in self._taken:
            log.info(
                "executor %s lost its map outputs again (%s): its replacement is asked for",
                executor,
                lost.reason,
            )
            return False
        now = self._clock.monotonic()
        while self._charged and now - self._charged[0] > self._window_s:
            self._charged.popleft()
        if len(self._charged) >= self._max:
            log.error(
                "arrowbeat: executor %s lost its map outputs (%s), but %d executors were already replaced "
                "for that in the last %g s; not replacing it (readers of its outputs will fail)",
                executor,
                lost.reason,
                len(self._charged),
                self._window_s,
            )
            return False
        try:
            self._kill(executor)
        except JvmCommandError as exc:  # an id the JVM would refuse: nothing was asked
            log.warning(
                "arrowbeat: executor %s lost its map outputs, but cannot be replaced: %s", executor, exc
            )
            return False
        self._charged.append(now)
        self._pending[executor] = now
        self._taken.add(executor)
        log.warning(
            "arrowbeat: executor %s lost its map outputs (%s); asked Spark to replace it, so that their "
            "map partitions are recomputed",
            executor,
            lost.reason,
        )
        return True

    def on_outcome(self, outcome: ReplacementOutcome) -> None:
        """What became of a replacement: one Spark did not accept gives its charge back. An outcome
        may come late (the JVM's kill waited on the cluster manager past the budget window, whose
        charge has left it already): it is logged and taken, never an error on the JVM link's
        thread. An answer for a kill this budget did not ask for (a heartbeat timeout's) is not ours."""
        charged = self._pending.pop(outcome.executor_id, None)
        if charged is None:  # a heartbeat-timeout kill (not this budget's), or a second answer
            log.debug(
                "arrowbeat: Spark's answer to a replacement of executor %s (%s) is not for this budget",
                outcome.executor_id,
                outcome.outcome,
            )
            return
        late_s = self._clock.monotonic() - charged
        if outcome.outcome == "accepted":
            if late_s > self._window_s:
                log.warning(
                    "arrowbeat: Spark accepted replacing executor %s %.0f s after it was asked for",
                    outcome.executor_id,
                    late_s,
                )
            return
        try:
            self._charged.remove(charged)
        except ValueError:  # already out of the window: nothing to give back
            log.warning(
                "arrowbeat: replacing executor %s was %s %.0f s after it was asked for, past the %g s "
                "budget window its charge had left already",
                outcome.executor_id,
                outcome.outcome,
                late_s,
                self._window_s,
            )

    def forget(self, executor_id: str) -> None:
        """Spark removed the executor: its id will not come back."""
        self._taken.discard(executor_id)

    def charged(self) -> int:
        """Replacements counting against the budget now (for tests and the log)."""
        now = self._clock.monotonic()
        return sum(1 for at in self._charged if now - at <= self._window_s)


__all__ = ["MAX_REPLACEMENTS", "WINDOW_S", "LostOutputs"]
