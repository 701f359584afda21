"""The agent's view of its executor's running tasks: does each progress, where is a stuck one, and
what was a gap in the JVM's lines (issue 17).

Facts come from the executor JVM (``TaskWatch.java``: one ``tasks ...`` line per pulse with each
running task's thread CPU time, and the JVM's GC and process CPU totals) and from the Python
workers, which arrowbeat's worker daemon labels with the task they run (``worker_label``). A task
*progresses* while the CPU time of its JVM thread or of its Python worker advances (more than
``MIN_PROGRESS_CPU_S`` or ``MIN_PROGRESS_SHARE`` of the elapsed time, so a thread that only polls
does not count); a slow but busy task always does. One idle for ``timeout_s`` is *stuck*: its
stacks are taken once, off the link thread (the Python one by ``SIGUSR2`` to its labelled worker,
whose ``faulthandler`` writes a private file; the JVM one by asking the JVM, ``jstack <task>``),
and the heartbeat payload carries it (``WorkProgress``); the driver side records ``TASK_STUCK``.

A gap between lines (the JVM paused: GC, ``SIGSTOP``, a frozen VM) is explained from the JVM's own
figures across it, and is not idle time beyond the one interval the JVM had to write its next line:
a paused executor is not a stuck task, and a JVM starved of CPU, whose lines all come late, still
has its stuck tasks found (all of each gap taken off, their idle time never grew).

Time is ``clock.monotonic()`` of an injected ``arrowbeat_base.clock.Clock`` (only the waits for a stack,
real I/O, are on real time); processes are looked up through an injectable ``workers`` function,
so the decisions are tested without Spark.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat import WorkProgress, one_line
from spark_plugin.jvm.protocol import parse_stack
from spark_plugin.monitoring.executor_stacks import (
    MAX_WHERE_CHARS,
    compact_jvm_stack,
    compact_python_stack,
    handles_stack_signal,
)
from spark_plugin.monitoring.executor_task_lines import JvmSample, TaskSample, parse_tasks_line
from spark_plugin.monitoring.executor_workers import ProcessCpu, WorkerScan
from spark_plugin.monitoring.gaps import Gap
from spark_plugin.python_worker.worker_label import STACK_SIGNAL, stack_path

log = logging.getLogger("arrowbeat.agent.tasks")


MIN_PROGRESS_CPU_S = 0.005


MIN_PROGRESS_SHARE = 0.02
"""A task progressed over a sample if its CPU time grew by more than both (5 ms, 2% of the time
between samples): a busy task grows by nearly all of it, a blocked one by nothing or a poll's
worth."""


MAX_REPORTED = 64
"""Most tasks one payload lists (stuck ones and the idlest first); the rest are counted."""


STACK_CPU_ALLOWANCE_S = 0.05
"""What writing a stack may cost a worker (``faulthandler``: a few ms; five 10 ms ticks)."""


STACK_WAIT_S = 2.0
"""How long a stack may take to arrive (Python: the signal handler's file; JVM: the reply)."""


@dataclass
class _Task:
    sample: TaskSample
    cpu_s: float
    """JVM thread CPU plus Python worker CPU when last compared."""
    last_progress: float
    seen: float
    stuck: bool = False
    where: str = ""
    inspecting: bool = False


@dataclass
class _StackCost:
    """CPU a worker asked for its stack may use writing it without that counting as its task's
    progress: counted, it would clear the very idleness being reported (a 10 ms tick is charged
    for a few ms of writing). Anything beyond the allowance is progress (a task that resumed
    while its stack was taken is not reported stuck)."""

    allowance_s: float = STACK_CPU_ALLOWANCE_S
    last_scan: float = float("inf")
    """The last scan it applies to: ``inf`` while the stack is written, then the first scan
    begun after (the one before may have seen only part of the writing)."""


class TaskWatch:
    """Progress of the executor's running tasks, fed by the JVM's lines (on the link's thread)."""

    def __init__(
        self,
        timeout_s: float,
        interval_s: float,
        workers: WorkerScan,
        ask_jvm_stack: Callable[[int], None] | None = None,
        local_dir: str = "",
        clock: Clock = SYSTEM_CLOCK,
        on_task_cpu: Callable[[int, float, float], None] | None = None,
    ) -> None:
        """``timeout_s``: idle time after which a task is stuck (0: never). ``interval_s``: the
        JVM's line interval; a gap is a silence longer than twice that. ``ask_jvm_stack(task)``
        sends ``jstack <task>`` to the JVM (its reply comes to :meth:`on_stack_line`).
        ``local_dir``: the executor's first Spark local dir (where workers put stack files).
        ``on_task_cpu(stage, cpu_s, elapsed_s)``: each running task's CPU (its JVM thread and its
        labelled Python worker) over the time since its last line, outside the lock
        (``executor_pace``: the task CPU share the driver compares within a stage)."""
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self._workers = workers
        self._ask_jvm_stack = ask_jvm_stack
        self._local_dir = local_dir
        self._clock = clock
        self._lock = threading.Lock()
        self._tasks: dict[int, _Task] = {}
        self._last: JvmSample | None = None
        self._cpu_rate = 0.0
        """The JVM's CPU seconds per second between its last two lines (before a gap)."""
        self._process_cpu: dict[int, float] = {}
        self._scans = 0
        """Scans of the workers started so far (numbers them)."""
        self._signalled: dict[int, _StackCost] = {}
        """Workers asked for their stack, and what writing it may still take off their CPU."""
        self._jvm_stacks: dict[int, str] = {}
        self._stack_arrived = threading.Condition(self._lock)
        self.last_gap: Gap | None = None
        self.gaps = 0
        self._on_task_cpu = on_task_cpu

    # -- fed by the link ------------------------------------------------------------------------
    def on_line(self, line: str) -> None:
        """A ``tasks ...`` line from the JVM; a malformed one is logged and skipped."""
        try:
            sample = parse_tasks_line(line)
        except ValueError as exc:
            log.warning("ignoring a line from the JVM: %s", exc)
            return
        now = self._clock.monotonic()
        processes, scan = None, 0
        if sample.tasks and self.timeout_s > 0:
            self._scans += 1
            scan = self._scans
            processes = self._scan()
        to_inspect: list[tuple[_Task, int | None]] = []
        used: list[tuple[int, float, float]] = []
        with self._lock:
            gap = self._gap(sample)
            running = {t.task_id for t in sample.tasks}
            grew, labelled, others = self._python_progress(processes, running, scan)
            for tid in list(self._tasks):
                if tid not in running:
                    del self._tasks[tid]
            for task_sample in sample.tasks:
                task = self._tasks.get(task_sample.task_id)
                jvm_cpu = max(task_sample.jvm_cpu_s, 0.0)
                if task is None:
                    self._tasks[task_sample.task_id] = _Task(task_sample, jvm_cpu, now, now)
                    continue
                if gap is not None:  # a paused executor is not a stuck task: the pause is not idle time
                    task.last_progress += max(0.0, gap.seconds - self.interval_s)
                # A task without a labelled worker may be served by an unlabelled one (PySpark's
                # own daemon): any CPU of the unlabelled processes counts for it.
                python = grew.get(task_sample.task_id, 0.0) if task_sample.task_id in labelled else others
                elapsed = now - task.seen
                unknown = processes is None and self.timeout_s > 0  # the scan failed: no verdict
                if processes is not None and elapsed > 0:  # a labelled worker's CPU is this task's alone
                    own = grew.get(task_sample.task_id, 0.0) if task_sample.task_id in labelled else 0.0
                    used.append((task_sample.stage, max(0.0, jvm_cpu - task.cpu_s) + own, elapsed))
                if unknown or (jvm_cpu - task.cpu_s) + python > max(
                    MIN_PROGRESS_CPU_S, MIN_PROGRESS_SHARE * elapsed
                ):
                    task.last_progress = now
                    task.stuck, task.where = False, ""
                task.sample, task.cpu_s, task.seen = task_sample, jvm_cpu, now
                if (
                    self.timeout_s > 0
                    and not task.stuck
                    and not task.inspecting
                    and now - task.last_progress >= self.timeout_s
                ):
                    task.inspecting = True
                    to_inspect.append((task, labelled.get(task_sample.task_id)))
            self._last = sample
        if self._on_task_cpu is not None:
            try:
                for stage, cpu_s, elapsed_s in used:
                    self._on_task_cpu(stage, cpu_s, elapsed_s)
            except Exception:  # evidence only: the watch of stuck tasks goes on
                log.exception("handing a task's CPU on failed")
        for task, worker in to_inspect:
            threading.Thread(
                target=self._inspect, args=(task, worker), name="stuck-task", daemon=True
            ).start()

    def _python_progress(
        self, processes: list[ProcessCpu] | None, running: set[int], scan: int
    ) -> tuple[dict[int, float], dict[int, int], float]:
        """CPU seconds each task's Python processes used since the last scan (only processes seen
        in both: one that appears or goes is no progress), the labelled worker of each task, and
        the CPU the unlabelled processes used. A worker still labelled with a task that no longer
        runs counts as unlabelled: a reused worker keeps its last task's label until the next
        task's first message reaches it, and the CPU it spends on that start is the next task's.
        A worker writing the stack we asked for (``_signalled``) grows by what it used beyond
        ``STACK_CPU_ALLOWANCE_S`` while it wrote (the scans until one begun after it finished)."""
        if processes is None:
            return {}, {}, 0.0
        for pid in [pid for pid, cost in self._signalled.items() if scan > cost.last_scan]:
            del self._signalled[pid]
        grew: dict[int, float] = {}
        labelled: dict[int, int] = {}
        others = 0.0
        for proc in processes:
            before = self._process_cpu.get(proc.pid)
            delta = 0.0 if before is None else max(0.0, proc.cpu_s - before)
            writing = self._signalled.get(proc.pid)
            if writing is not None:
                excused = min(delta, writing.allowance_s)
                writing.allowance_s -= excused
                delta -= excused
            if proc.task is None or proc.task not in running:
                others += delta
                continue
            grew[proc.task] = grew.get(proc.task, 0.0) + delta
            if proc.labelled:
                labelled[proc.task] = proc.pid
        self._process_cpu = {proc.pid: proc.cpu_s for proc in processes}
        return grew, labelled, others

    def on_stack_line(self, line: str) -> None:
        """The JVM's reply ``stack <task> <escaped text>`` (``-`` when the task is not running)."""
        parsed = parse_stack(line)
        if parsed is None:
            log.warning("ignoring a malformed stack line from the JVM")
            return
        with self._lock:
            self._jvm_stacks[parsed[0]] = parsed[1]
            self._stack_arrived.notify_all()

    def _gap(self, sample: JvmSample) -> Gap | None:
        """The gap before ``sample`` if the JVM's lines stopped for more than two intervals, on the
        JVM's own clock (an agent that read them late saw no gap of the JVM's). The CPU of one
        normal interval is taken off: the work done between the last line and the pause."""
        previous = self._last
        if previous is None:
            return None
        elapsed = sample.jvm_s - previous.jvm_s
        known = sample.cpu_s >= 0 and previous.cpu_s >= 0
        if elapsed <= 2 * self.interval_s:
            if known and elapsed > 0:
                self._cpu_rate = max(0.0, sample.cpu_s - previous.cpu_s) / elapsed
            return None
        cpu = max(0.0, sample.cpu_s - previous.cpu_s - self._cpu_rate * self.interval_s) if known else -1.0
        gap = Gap(elapsed, max(0.0, sample.gc_s - previous.gc_s), cpu)
        self.last_gap = gap
        self.gaps += 1
        log.info("executor JVM was silent: %s", gap.cause)
        return gap

    def _scan(self) -> list[ProcessCpu] | None:
        try:
            return self._workers()
        except Exception:  # a scan that fails leaves the JVM's figures to judge by
            log.debug("scanning the Python workers failed", exc_info=True)
            return None

    # -- a stuck task ---------------------------------------------------------------------------
    def _inspect(self, task: _Task, worker: int | None) -> None:
        """Take the stuck task's stacks; if it ended or moved on meanwhile, nothing is recorded."""
        tid = task.sample.task_id
        if worker is None:  # labelled since the line's scan (a worker that was slow to start)?
            worker = next((p.pid for p in self._scan() or [] if p.labelled and p.task == tid), None)
        python = (
            self._python_stack(worker, tid)
            if worker is not None
            else (
                "Python stack unavailable: no Python worker labelled with this task (a JVM-only task, or "
                "the workers do not run arrowbeat's daemon, spark.python.daemon.module)"
            )
        )
        jvm = self._jvm_stack(tid)
        where = one_line(f"{python}; {jvm}", MAX_WHERE_CHARS)  # any character a thread name may hold
        with self._lock:
            task.inspecting = False
            current = self._tasks.get(tid)
            if current is not task or self._clock.monotonic() - task.last_progress < self.timeout_s:
                return  # ended, or progressed while we looked: no event
            task.stuck, task.where = True, where
        log.warning("task %s makes no progress: %s", task.sample.label, where)

    def _python_stack(self, pid: int, task_id: int) -> str:
        if not self._local_dir:
            return "Python stack unavailable: the executor's local dirs are unknown"
        path = stack_path(self._local_dir, pid)
        try:
            start = os.stat(path).st_size
        except OSError as exc:
            return f"Python stack unavailable: no stack file for worker {pid} ({exc.strerror})"
        if not handles_stack_signal(pid, task_id):  # a pid reused since the scan: never signal it
            return f"Python stack unavailable: worker {pid} no longer serves the task"
        with self._lock:
            self._signalled[pid] = _StackCost()
        try:
            try:
                os.kill(pid, STACK_SIGNAL)
            except OSError as exc:
                return f"Python stack unavailable: worker {pid} cannot be signalled ({exc.strerror})"
            return self._read_stack(pid, path, start)
        finally:
            with self._lock:  # scans begun before now saw part of the writing; the next one rebases
                cost = self._signalled.get(pid)
                if cost is not None:
                    cost.last_scan = self._scans + 1

    @staticmethod
    def _read_stack(pid: int, path: str, start: int) -> str:
        deadline = time.monotonic() + STACK_WAIT_S  # real waiting on a real file, whatever the clock
        text, size = "", start
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                now_size = os.stat(path).st_size
                if now_size > start and now_size == size:  # written and no longer growing
                    with open(path, encoding="utf-8", errors="replace") as f:
                        f.seek(start)
                        text = f.read(1 << 16)
                    break
                size = now_size
            threading.Event().wait(0.05)
        if not text:
            return f"Python stack unavailable: worker {pid} wrote none within {STACK_WAIT_S:g}s"
        return "Python: " + compact_python_stack(text)

    def _jvm_stack(self, task_id: int) -> str:
        if self._ask_jvm_stack is None:
            return "JVM stack unavailable: no link to the JVM"
        with self._lock:
            self._jvm_stacks.pop(task_id, None)
        try:
            self._ask_jvm_stack(task_id)
        except Exception as exc:
            return f"JVM stack unavailable: {exc}"
        with self._lock:
            self._stack_arrived.wait_for(lambda: task_id in self._jvm_stacks, timeout=STACK_WAIT_S)
            text = self._jvm_stacks.pop(task_id, None)
        if text is None:
            return f"JVM stack unavailable: no answer within {STACK_WAIT_S:g}s"
        if text == "-":
            return "JVM stack unavailable: the task ended"
        return "JVM: " + compact_jvm_stack(text)

    # -- for the heartbeat payload --------------------------------------------------------------
    def work(self) -> list[WorkProgress]:
        """The running tasks for the payload: stuck ones and the idlest first, at most
        ``MAX_REPORTED`` (the rest counted in :meth:`metrics`)."""
        now = self._clock.monotonic()
        with self._lock:
            tasks = sorted(self._tasks.values(), key=lambda t: (not t.stuck, t.last_progress))
            return [
                WorkProgress(
                    str(t.sample.task_id),
                    t.sample.label,
                    round(t.sample.running_s + (now - t.seen), 3),
                    round(max(0.0, now - t.last_progress), 3),
                    t.stuck,
                    t.where,
                )
                for t in tasks[:MAX_REPORTED]
            ]

    def metrics(self) -> dict[str, float]:
        """The JVM's GC and CPU totals and the last gap, for the payload's metrics."""
        with self._lock:
            last, tasks = self._last, len(self._tasks)
        figures: dict[str, float] = {"tasks_unreported": float(max(0, tasks - MAX_REPORTED))}
        if last is not None:
            figures["jvm_gc_count"] = float(last.gc_count)
            figures["jvm_gc_s"] = last.gc_s
            if last.cpu_s >= 0:
                figures["jvm_cpu_s"] = last.cpu_s
        gap = self.last_gap
        if gap is not None:
            figures.update(
                jvm_gaps=float(self.gaps),
                jvm_gap_s=gap.seconds,
                jvm_gap_gc_s=gap.gc_s,
                jvm_gap_cpu_s=gap.cpu_s,
            )
        return figures
