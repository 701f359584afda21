"""The executor JVM's ``tasks`` lines as the agent reads them: one per pulse, with each running
task's thread CPU time and the JVM's GC and process CPU totals (``TaskWatch.java`` writes them;
``jvm.protocol.parse_tasks`` checks their form). Parsed here into samples; what they mean is
``executor_tasks``'.
"""

from __future__ import annotations

from dataclasses import dataclass

from spark_plugin.jvm.protocol import parse_tasks


@dataclass(frozen=True, slots=True)
class TaskSample:
    task_id: int
    stage: int
    stage_attempt: int
    partition: int
    attempt: int
    jvm_cpu_s: float
    """CPU time of the task's JVM thread; negative if unknown."""
    running_s: float

    @property
    def label(self) -> str:
        return (
            f"stage {self.stage}.{self.stage_attempt} partition {self.partition} "
            f"attempt {self.attempt} (task {self.task_id})"
        )


@dataclass(frozen=True, slots=True)
class JvmSample:
    gc_count: int
    gc_s: float
    cpu_s: float
    """Process CPU time; negative if unknown."""
    jvm_s: float
    """The JVM's monotonic clock when it wrote the line: gaps are measured on it."""
    tasks: tuple[TaskSample, ...]


def pauses_the_application(collector: str) -> bool:
    """Whether a garbage collector's time stops the application (and so explains a gap in the
    JVM's lines): a concurrent collector's cycles (``ZGC Cycles``, ``G1 Concurrent GC``,
    ``Shenandoah Cycles``) run beside the application and stop nothing."""
    return "Cycles" not in collector and "Concurrent" not in collector


def parse_tasks_line(line: str) -> JvmSample:
    """A ``tasks ...`` line (``protocol.parse_tasks``) as a sample, the GC totals summed over the
    collectors that pause the application; ``ValueError`` if it is not one."""
    raw = parse_tasks(line)
    pausing = [c for c in raw.collectors if pauses_the_application(c.name)]
    tasks = tuple(
        TaskSample(
            t.task_id,
            t.stage,
            t.stage_attempt,
            t.partition,
            t.attempt,
            t.cpu_ms / 1000.0 if t.cpu_ms >= 0 else -1.0,
            t.running_ms / 1000.0,
        )
        for t in raw.tasks
    )
    cpu_s = raw.cpu_ms / 1000.0 if raw.cpu_ms >= 0 else -1.0
    gc_count, gc_ms = sum(c.count for c in pausing), sum(c.ms for c in pausing)
    return JvmSample(gc_count, gc_ms / 1000.0, cpu_s, raw.jvm_ms / 1000.0, tasks)
