"""The agent's measure of its executor JVM's pace, for the driver's peer comparison
(``monitoring.driver_degraded``: an executor consistently slower than its peers is ``DEGRADED``).

Fed with the JVM's ``tasks ...`` lines (``TaskWatch.java``, one per pulse interval, stamped with the
JVM's own monotonic clock), it keeps cumulative figures that go out in every heartbeat payload:

- ``jvm_pace_lines`` and ``jvm_pace_late_ms``: lines seen and how late they came in all. A line is
  written by a thread that sleeps one pulse interval between lines, so the time between two
  stamps beyond the interval is time the JVM could not run: stopped, starved of CPU, throttled.
  The JVM's pausing garbage collections in between are taken off (a busier JVM collects more; GC
  is its own figure, ``jvm_gc_s``), and each line counts at most one interval late (one long
  pause, which the heartbeat timeout or ``TaskWatch``'s gap account covers, does not swamp the
  figure). It does not grow with the number of tasks: a thread that wakes is on time in a busy
  JVM that runs.
- ``task_cpu_s.<stage>`` and ``task_wall_s.<stage>``: CPU seconds of the stage's running tasks,
  and the seconds they ran, for the newest ``MAX_STAGES`` stages: their ratio is a task's CPU
  share, which the driver compares between tasks of one stage only (a larger partition takes
  longer at the same share). With ``TaskWatch`` feeding :meth:`add_task_cpu`, a task's CPU is its
  JVM thread's and its labelled Python worker's; alone, its JVM thread's from the lines (GC
  pauses taken off its running time).

Cumulative counters, so a lost heartbeat loses nothing; the driver differences them. Fed on the
link's thread, read on the heartbeat loop's: one lock.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from spark_plugin.monitoring.executor_task_lines import JvmSample, parse_tasks_line

log = logging.getLogger("arrowbeat.agent.pace")

MAX_STAGES = 8
"""Stages whose task figures are reported (the newest active): a payload stays small."""


class JvmPace:
    """Cumulative lateness of the JVM's lines and per-stage task CPU, from its ``tasks`` lines."""

    def __init__(
        self, pulse_interval_s: float, max_stages: int = MAX_STAGES, *, task_cpu_from_lines: bool = True
    ) -> None:
        """``task_cpu_from_lines``: False when ``TaskWatch`` feeds :meth:`add_task_cpu` instead."""
        if pulse_interval_s <= 0:
            raise ValueError(f"the pulse interval must be positive, got {pulse_interval_s}")
        self._interval = pulse_interval_s
        self._max_stages = max_stages
        self._from_lines = task_cpu_from_lines
        self._lock = threading.Lock()
        self._last: JvmSample | None = None
        self._lines = 0
        self._late_s = 0.0
        self._stages: OrderedDict[int, list[float]] = OrderedDict()
        """Stage -> [task CPU seconds, task wall seconds], newest active last."""

    def on_line(self, line: str) -> None:
        """A ``tasks ...`` line; anything else is ignored (``TaskWatch`` logs malformed ones)."""
        try:
            sample = parse_tasks_line(line)
        except ValueError:
            return
        self.on_sample(sample)

    def on_sample(self, sample: JvmSample) -> None:
        with self._lock:
            previous, self._last = self._last, sample
            if previous is None:
                return
            elapsed = sample.jvm_s - previous.jvm_s
            if elapsed <= 0:
                return
            gc = max(0.0, sample.gc_s - previous.gc_s)
            self._lines += 1
            self._late_s += min(self._interval, max(0.0, elapsed - self._interval - gc))
            if not self._from_lines:
                return
            ran = max(0.0, elapsed - gc)
            before = {t.task_id: t for t in previous.tasks}
            for task in sample.tasks:
                was = before.get(task.task_id)
                if was is None or task.jvm_cpu_s < 0 or was.jvm_cpu_s < 0 or ran <= 0:
                    continue
                self._add(task.stage, min(ran, max(0.0, task.jvm_cpu_s - was.jvm_cpu_s)), ran)

    def add_task_cpu(self, stage: int, cpu_s: float, elapsed_s: float) -> None:
        """One task's CPU over ``elapsed_s`` (``TaskWatch``'s ``on_task_cpu``)."""
        if elapsed_s <= 0:
            return
        with self._lock:
            self._add(stage, min(max(0.0, cpu_s), 1.5 * elapsed_s), elapsed_s)

    def _add(self, stage: int, cpu_s: float, wall_s: float) -> None:
        figures = self._stages.get(stage)
        if figures is None:
            figures = self._stages[stage] = [0.0, 0.0]
        self._stages.move_to_end(stage)
        figures[0] += cpu_s
        figures[1] += wall_s
        while len(self._stages) > self._max_stages:
            self._stages.popitem(last=False)

    def metrics(self) -> dict[str, float]:
        """The payload's figures (a ``PayloadProvider``); empty before the second line."""
        with self._lock:
            if self._lines == 0 and not self._stages:
                return {}
            figures = {
                "jvm_pace_lines": float(self._lines),
                "jvm_pace_late_ms": round(self._late_s * 1000.0, 3),
            }
            for stage, (cpu, wall) in self._stages.items():
                figures[f"task_cpu_s.{stage}"] = round(cpu, 6)
                figures[f"task_wall_s.{stage}"] = round(wall, 6)
            return figures
