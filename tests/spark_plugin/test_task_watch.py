"""The agent's judgement of its executor's tasks (``monitoring.executor_tasks``), without Spark: a
``ManualClock`` stands for time, lines are what ``TaskWatch.java`` writes, and the Python worker
of the last test is a real process labelled the way arrowbeat's worker daemon labels one."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from spark_plugin.monitoring.executor_stacks import (
    compact_jvm_stack,
    compact_python_stack,
    handles_stack_signal,
)
from spark_plugin.monitoring.executor_task_lines import parse_tasks_line
from spark_plugin.monitoring.executor_tasks import MAX_REPORTED, TaskWatch
from spark_plugin.monitoring.executor_workers import ProcessCpu, labelled_workers
from spark_plugin.monitoring.gaps import explain_gap
from spark_plugin.python_worker.worker_label import STACKS_FOLDER

INTERVAL = 0.25


JVM_CLOCK: list[ManualClock] = []


PAUSING = "G1%20Young%20Generation"
"""A collector that stops the application, as the JVM's ``tasks`` line names it."""


def line(gc_ms: int, cpu_ms: int, *tasks: tuple[int, int, int]) -> str:
    """``tasks`` as (task id, thread cpu ms, running ms); stage 3.0, partition = task id, attempt 0.
    The JVM's clock is the test's ``ManualClock`` (the last one ``watch`` made)."""
    jvm_ms = int(JVM_CLOCK[-1].monotonic() * 1000)
    return f"tasks {cpu_ms} {jvm_ms} {PAUSING}:1:{gc_ms} " + " ".join(
        f"{t}:3:0:{t}:0:{c}:{r}" for t, c, r in tasks
    )


def watch(clock: ManualClock, python: list[ProcessCpu] | None = None, **kw: object) -> TaskWatch:
    """A watch whose process scan returns ``python`` as it is when scanned."""
    JVM_CLOCK.append(clock)
    kwargs: dict[str, object] = {"timeout_s": 2.0, "interval_s": INTERVAL, "clock": clock}
    kwargs.update(kw)
    return TaskWatch(workers=lambda: list(python or []), **kwargs)  # type: ignore[arg-type]


def feed(w: TaskWatch, clock: ManualClock, seconds: float, make: object) -> None:
    """One line per interval for ``seconds``; ``make(i)`` builds the i-th line."""
    for i in range(int(seconds / INTERVAL)):
        clock.jump(INTERVAL)
        w.on_line(make(i))  # type: ignore[operator]


def test_a_tasks_line_is_parsed_and_a_malformed_one_refused() -> None:
    sample = parse_tasks_line(f"tasks 5300 99000 {PAUSING}:7:1200 42:3:1:5:2:870:9100 43:3:1:6:0:-1:10")
    assert (sample.gc_count, sample.gc_s, sample.cpu_s, sample.jvm_s) == (7, 1.2, 5.3, 99.0)
    first = sample.tasks[0]
    assert (first.task_id, first.stage, first.stage_attempt, first.partition, first.attempt) == (
        42,
        3,
        1,
        5,
        2,
    )
    assert first.jvm_cpu_s == 0.87 and first.running_s == 9.1 and sample.tasks[1].jvm_cpu_s < 0
    assert first.label == "stage 3.1 partition 5 attempt 2 (task 42)"
    for bad in (
        "tasks 1 2 3",
        "tasks a b c d",
        "tasks 1 2 3 4 42:3",
        "pulse 1 2 3 4",
        "tasks 1 2 3 4 1:2:3:4:5:6:x",
    ):
        with pytest.raises(ValueError):
            parse_tasks_line(bad)


def test_a_busy_task_is_never_stuck_and_an_idle_one_is_after_the_timeout() -> None:
    clock = ManualClock(start=100.0)
    w = watch(clock, ask_jvm_stack=None)
    # Task 1 spins (its thread's CPU grows by the interval); task 2 waits (CPU flat).
    feed(w, clock, 1.5, lambda i: line(0, 0, (1, 250 * (i + 1), 250 * (i + 1)), (2, 40, 250 * (i + 1))))
    assert not any(p.stuck for p in w.work())
    feed(w, clock, 1.0, lambda i: line(0, 0, (1, 2000 + 250 * i, 2000), (2, 40, 2000)))
    assert wait_until(lambda: any(p.stuck for p in w.work()), 10)
    by_id = {p.id: p for p in w.work()}
    assert not by_id["1"].stuck and by_id["1"].idle_s < 1.0
    assert by_id["2"].stuck and by_id["2"].idle_s >= 2.0
    assert "no Python worker labelled" in by_id["2"].where and "JVM stack unavailable" in by_id["2"].where
    assert w.work()[0].id == "2"  # stuck first


def test_a_python_worker_busy_on_cpu_keeps_its_task_progressing() -> None:
    """The JVM thread of a Python task waits on its worker: the worker's CPU is the task's."""
    clock = ManualClock(start=100.0)
    python: list[ProcessCpu] = []
    w = watch(clock, python)

    def spin(i: int) -> str:
        python[:] = [ProcessCpu(4242, 5, 0.25 * (i + 1), labelled=True)]
        return line(0, 0, (5, 10, 250 * (i + 1)))

    feed(w, clock, 4.0, spin)
    assert [p.stuck for p in w.work()] == [False]
    assert w.work()[0].idle_s <= INTERVAL


def test_a_reused_worker_still_labelled_with_its_last_task_works_for_the_next_one() -> None:
    """Task 6 ended; its worker, still labelled ``abt6``, starts task 7 (reads its first message,
    unpickles the function) before it is labelled again: that CPU is task 7's progress."""
    clock = ManualClock(start=100.0)
    python: list[ProcessCpu] = []
    w = watch(clock, python)

    def starting(i: int) -> str:
        python[:] = [ProcessCpu(4242, 6, 0.25 * (i + 1), labelled=True)]
        return line(0, 0, (7, 10, 250 * (i + 1)))

    feed(w, clock, 4.0, starting)
    assert [p.stuck for p in w.work()] == [False]
    assert w.work()[0].idle_s <= INTERVAL
    # The same worker idle under its stale label: task 7 turns stuck at the timeout.
    feed(w, clock, 2.5, lambda i: line(0, 0, (7, 10, 4000 + 250 * (i + 1))))
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)


def test_a_slow_poll_is_not_progress() -> None:
    """A thread that only polls (a millisecond a second) is as good as blocked."""
    clock = ManualClock(start=0.0)
    w = watch(clock)
    feed(w, clock, 3.0, lambda i: line(0, 0, (9, 1 + i // 4, 250 * (i + 1))))
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)


def test_a_task_that_ends_or_moves_while_inspected_is_not_reported() -> None:
    clock = ManualClock(start=0.0)
    asked: list[int] = []

    def ask(task: int) -> None:  # the JVM answers after the task already ended there
        asked.append(task)
        w.on_line(line(0, 0))  # task 3 no longer running
        w.on_stack_line(f"stack {task} -")

    w = watch(clock, ask_jvm_stack=ask)
    i = 0
    while not asked and i < 20:  # idle lines until the watch inspects the task (no line after that)
        i += 1
        clock.jump(INTERVAL)
        w.on_line(line(0, 0, (3, 5, 250 * i)))
        wait_until(lambda: bool(asked), 0.2)
    assert asked == [3]
    assert wait_until(lambda: not w._tasks[3].inspecting if 3 in w._tasks else True, 10)
    assert w.work() == []  # ended while inspected: nothing to report


def test_a_jvm_stack_is_asked_for_and_shown_in_one_line() -> None:
    clock = ManualClock(start=0.0)

    def ask(task: int) -> None:
        text = (
            'JVM thread "Executor task launch worker for task 0.0 in stage 3.0 (TID 3)" WAITING on '
            "java.lang.Object@1\\n  at java.base/java.lang.Object.wait0(Native Method)\\n  at "
            "org.example.Stuck.run(Stuck.java:12)"
        )
        w.on_stack_line(f"stack {task} {text}")

    w = watch(clock, ask_jvm_stack=ask)
    feed(w, clock, 2.5, lambda i: line(0, 0, (3, 5, 250 * (i + 1))))
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)
    where = w.work()[0].where
    assert (
        "JVM: JVM thread" in where and "WAITING" in where and "org.example.Stuck.run(Stuck.java:12)" in where
    )
    assert "\n" not in where


def test_a_gap_is_explained_and_does_not_make_tasks_stuck() -> None:
    clock = ManualClock(start=0.0)
    w = watch(clock)
    feed(w, clock, 1.0, lambda i: line(100, 1000, (1, 5, 250 * (i + 1))))
    idle_before = w.work()[0].idle_s
    clock.jump(5.0)  # the JVM was stopped: no GC, no CPU across the silence
    w.on_line(line(100, 1001, (1, 5, 6000)))
    assert w.last_gap is not None and w.last_gap.cause.startswith("process stopped: no GC, no CPU")
    # The pause is not idle time: the task is as idle as before it, plus the interval it had.
    assert [p.stuck for p in w.work()] == [False]
    assert w.work()[0].idle_s == pytest.approx(idle_before + INTERVAL)
    clock.jump(3.0)  # a GC pause: the collectors' time covers the silence
    w.on_line(line(2900, 4200, (1, 5, 9000)))
    assert w.last_gap is not None and w.last_gap.cause.startswith("garbage collection (2.80s of GC")
    metrics = w.metrics()
    assert metrics["jvm_gaps"] == 2 and metrics["jvm_gap_gc_s"] == pytest.approx(2.8)
    assert metrics["jvm_gc_s"] == pytest.approx(2.9)


@pytest.mark.parametrize("spacing", [2.1, 3.0, 8.0])
def test_a_task_of_a_jvm_whose_lines_all_come_late_is_still_found_stuck(spacing: float) -> None:
    """A JVM starved of CPU writes every line late, each one a gap. Were each whole gap taken off
    the idle time (a CI run's stalled UDF was never found stuck), a stalled task's would never grow;
    it grows by one interval per line, so the task is stuck once ``spacing`` times the timeout
    has passed, and not before the timeout."""
    clock = ManualClock(start=0.0)
    w = watch(clock)
    cpu_ms, due_at = 1000, None
    while due_at is None and clock.monotonic() < 10 * spacing * w.timeout_s:
        clock.jump(INTERVAL * spacing)
        cpu_ms += int(INTERVAL * spacing * 300)  # the JVM runs (a third of a core); the task does not
        w.on_line(line(100, cpu_ms, (1, 5, int(clock.monotonic() * 1000))))
        if w.work()[0].idle_s >= w.timeout_s:
            due_at = clock.monotonic()
    assert w.gaps > 0 and w.last_gap is not None and w.last_gap.cause.startswith("unknown")
    assert due_at is not None, f"idle {w.work()[0].idle_s:.2f} s after {clock.monotonic():.1f} s"
    assert w.timeout_s < due_at <= spacing * (w.timeout_s + 2 * INTERVAL), due_at
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)


@pytest.mark.parametrize(
    ("gap", "gc", "cpu", "starts"),
    [
        (4.0, 3.9, 7.0, "garbage collection"),
        (4.0, 0.0, 0.01, "process stopped"),
        (4.0, 0.5, 2.0, "unknown"),
        (4.0, 0.0, -1.0, "unknown"),  # no CPU figure: not evidence of a stop
    ],
)
def test_gaps_are_told_apart(gap: float, gc: float, cpu: float, starts: str) -> None:
    assert explain_gap(gap, gc, cpu).startswith(starts)


def test_thousands_of_tasks_stay_within_the_payload_bound() -> None:
    clock = ManualClock(start=0.0)
    w = watch(clock)
    clock.jump(INTERVAL)
    w.on_line(line(0, 0, *[(t, 1, 100) for t in range(1, 3001)]))
    assert len(w.work()) == MAX_REPORTED
    assert w.metrics()["tasks_unreported"] == 3000 - MAX_REPORTED


def test_stacks_are_made_one_line() -> None:
    dump = textwrap.dedent(
        """\
        Thread 0x00007f1 (most recent call first):
          File "/usr/lib/python3.11/selectors.py", line 415 in select

        Current thread 0x00007f2 (most recent call first):
          File "/usr/lib/python3.11/threading.py", line 327 in wait
          File "/usr/lib/python3.11/threading.py", line 629 in wait
          File "/tmp/job.py", line 12 in blocked_udf
          File "/x/pyspark/worker.py", line 1600 in func
        """
    )
    assert compact_python_stack(dump) == (
        "wait (threading.py:327) < wait (threading.py:629) < blocked_udf (job.py:12) < func (worker.py:1600)"
    )
    assert (
        compact_jvm_stack('JVM thread "t" RUNNABLE\n  at a.B.c(B.java:1)')
        == 'JVM thread "t" RUNNABLE: a.B.c(B.java:1)'
    )


@pytest.mark.parametrize("after_the_stack", ["writing costs 40 ms", "the task resumed"])
def test_a_real_labelled_worker_blocked_in_a_udf_is_found_with_its_stack(
    tmp_path: Path, after_the_stack: str
) -> None:
    """A real process labelled as arrowbeat's daemon labels a worker (``worker_label.label_task``),
    blocked in ``threading.Event().wait()`` inside ``blocked_udf``: its CPU is found by its label,
    and SIGUSR2 makes it write its stack, which names the function. The CPU writing it costs is
    not progress (a loaded machine charges a 10 ms tick for a few ms); a task that resumed is."""
    local = tmp_path / "local"
    local.mkdir()
    code = textwrap.dedent(
        """\
        import sys, threading
        from spark_plugin.python_worker.worker_label import label_task

        def blocked_udf():
            label_task(77)
            print("labelled", flush=True)
            threading.Event().wait()

        blocked_udf()
        """
    )
    env = dict(os.environ, SPARK_LOCAL_DIRS=str(local))
    worker = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "labelled"
        assert oct((local / STACKS_FOLDER).stat().st_mode & 0o777) == "0o700"
        real_scan = labelled_workers(os.getpid(), agent_pid=-1)  # the worker is our child, as under a JVM
        assert wait_until(lambda: any(p.task == 77 and p.labelled for p in real_scan()), 10)
        extra_cpu = [0.0]  # CPU the worker is shown to have used on top of its real figure

        def workers() -> list[ProcessCpu]:
            return [
                dataclasses.replace(p, cpu_s=p.cpu_s + extra_cpu[0]) if p.labelled else p for p in real_scan()
            ]

        clock = ManualClock(start=0.0)
        JVM_CLOCK.append(clock)
        w = TaskWatch(timeout_s=1.0, interval_s=INTERVAL, workers=workers, local_dir=str(local), clock=clock)
        # Idle for the timeout at the fifth line: the stack is taken (no line comes meanwhile).
        feed(w, clock, 5 * INTERVAL, lambda i: line(0, 0, (77, 3, 250 * (i + 1))))
        assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 15)
        where = w.work()[0].where
        assert "Python: wait (threading.py" in where and "blocked_udf (<string>:7)" in where, where
        assert worker.poll() is None  # the signal did not end it
        assert handles_stack_signal(worker.pid, 77) and not handles_stack_signal(worker.pid, 78)
        # The next line's scan is the first begun after the stack was written: it shows what the
        # writing cost, or the task's own work.
        if after_the_stack == "writing costs 40 ms":
            extra_cpu[0] = 0.04
            feed(w, clock, INTERVAL, lambda i: line(0, 0, (77, 3, 1500)))
            assert [p.stuck for p in w.work()] == [True]
            extra_cpu[0] = 0.10  # CPU used later is progress again
            feed(w, clock, INTERVAL, lambda i: line(0, 0, (77, 3, 1750)))
        else:
            extra_cpu[0] = 0.25
            feed(w, clock, INTERVAL, lambda i: line(0, 0, (77, 3, 1500)))
        assert [p.stuck for p in w.work()] == [False]
    finally:
        worker.kill()
        worker.wait(timeout=10)


def test_an_unlabelled_busy_worker_or_a_udfs_subprocess_keeps_tasks_progressing() -> None:
    """Workers of PySpark's own daemon carry no label: any CPU of unlabelled processes counts for
    the tasks without one (never a false stuck); a labelled worker's subprocess counts for its task."""
    clock = ManualClock(start=0.0)
    python: list[ProcessCpu] = []
    w = watch(clock, python)

    def busy(i: int) -> str:
        python[:] = [
            ProcessCpu(300, None, 0.25 * i),  # an unlabelled worker, computing
            ProcessCpu(400, 8, 1.0, labelled=True),  # task 8's worker, waiting ...
            ProcessCpu(401, 8, 0.25 * i),  # ... on its own subprocess, computing
        ]
        return line(0, 0, (6, 5, 250 * i), (8, 5, 250 * i))

    feed(w, clock, 4.0, busy)
    assert sorted((p.id, p.stuck) for p in w.work()) == [("6", False), ("8", False)]
    assert max(p.idle_s for p in w.work()) <= INTERVAL


def test_a_process_that_appears_is_not_progress() -> None:
    clock = ManualClock(start=0.0)
    python: list[ProcessCpu] = []
    w = watch(clock, python)

    def worker_appears(i: int) -> str:
        # Task 4's worker is first seen late, with all the CPU it ever used: no progress by itself.
        python[:] = [ProcessCpu(500 + i, 4, 100.0, labelled=True)]  # a new pid each scan
        return line(0, 0, (4, 5, 250 * i))

    feed(w, clock, 2.5, worker_appears)
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)


def test_a_gap_keeps_a_stuck_task_stuck_and_a_late_reading_agent_sees_no_gap() -> None:
    clock = ManualClock(start=0.0)
    w = watch(clock)
    feed(w, clock, 2.5, lambda i: line(0, 0, (2, 5, 250 * i)))
    assert wait_until(lambda: [p.stuck for p in w.work()] == [True], 10)
    clock.jump(3.0)  # the JVM paused: its lines stopped
    w.on_line(line(0, 1, (2, 5, 6000)))
    assert w.gaps == 1 and [p.stuck for p in w.work()] == [True]  # no resumed-then-stuck-again
    # The agent itself stalled while the JVM went on: its lines queued, dated a pulse apart.
    jvm_ms = int(clock.monotonic() * 1000)
    clock.jump(2.0)
    for k in range(1, 9):
        w.on_line(f"tasks 1 {jvm_ms + 250 * k} {PAUSING}:1:0 2:3:0:2:0:5:7000")
    assert w.gaps == 1


def test_a_task_that_moves_while_inspected_is_not_reported() -> None:
    clock = ManualClock(start=0.0)

    def ask(task: int) -> None:  # while its stack is taken, the task's thread uses CPU again
        clock.jump(INTERVAL)
        w.on_line(line(0, 0, (3, 900, 3000)))
        w.on_stack_line(f'stack {task} JVM thread "t" RUNNABLE')

    w = watch(clock, ask_jvm_stack=ask)
    feed(w, clock, 2.5, lambda i: line(0, 0, (3, 5, 250 * i)))
    assert wait_until(lambda: not w._tasks[3].inspecting, 10)
    assert [p.stuck for p in w.work()] == [False]


def test_the_stack_signal_goes_only_to_a_labelled_worker_with_the_handler() -> None:
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not handles_stack_signal(plain.pid, 1)  # no handler: SIGUSR2 would end it
        assert not handles_stack_signal(2**22 + 12345, 1)  # no such process
    finally:
        plain.kill()
        plain.wait(timeout=10)


def test_each_tasks_cpu_goes_to_the_pace_with_its_labelled_workers_and_not_an_unlabelled_ones() -> None:
    """``on_task_cpu`` (``executor_pace``): task 7's JVM thread and its labelled worker; task 8's
    JVM thread only (the unlabelled process's CPU is nobody's in particular)."""
    clock = ManualClock()
    workers = [ProcessCpu(100, 7, 0.0, labelled=True), ProcessCpu(200, None, 0.0)]
    got: list[tuple[int, float, float]] = []
    w = watch(clock, workers, on_task_cpu=lambda stage, cpu, wall: got.append((stage, cpu, wall)))
    w.on_line(line(0, 0, (7, 0, 0), (8, 0, 0)))
    clock.jump(INTERVAL)
    workers[:] = [ProcessCpu(100, 7, 0.2, labelled=True), ProcessCpu(200, None, 0.3)]
    w.on_line(line(0, 0, (7, 10, 250), (8, 40, 250)))
    assert [(s, round(c, 3), round(e, 3)) for s, c, e in got] == [(3, 0.21, INTERVAL), (3, 0.04, INTERVAL)]
