"""Schedulers: the manual one is deterministic; the threaded one really runs tasks."""

from __future__ import annotations

import threading

from heartbeat import ManualClock, ManualScheduler, ThreadScheduler


def test_manual_scheduler_runs_due_tasks_in_order_at_their_time() -> None:
    scheduler = ManualScheduler()
    seen: list[tuple[str, float]] = []
    scheduler.schedule(2.0, lambda: seen.append(("b", scheduler.clock.monotonic())))
    scheduler.schedule(1.0, lambda: seen.append(("a", scheduler.clock.monotonic())))
    cancelled = scheduler.schedule(1.5, lambda: seen.append(("x", 0.0)))
    cancelled.cancel()
    scheduler.advance(1.9)
    assert seen == [("a", 1.0)]
    scheduler.advance(0.1)
    assert seen == [("a", 1.0), ("b", 2.0)]
    assert scheduler.clock.monotonic() == 2.0


def test_manual_scheduler_runs_tasks_scheduled_by_tasks_within_the_window() -> None:
    scheduler = ManualScheduler()
    seen: list[float] = []

    def tick() -> None:
        seen.append(scheduler.clock.monotonic())
        if len(seen) < 5:
            scheduler.schedule(1.0, tick)

    scheduler.schedule(1.0, tick)
    scheduler.advance(3.5)
    assert seen == [1.0, 2.0, 3.0]


def test_a_failing_task_does_not_stop_the_others() -> None:
    scheduler = ManualScheduler()
    seen: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    scheduler.schedule(1.0, boom)
    scheduler.schedule(1.0, lambda: seen.append(1))
    scheduler.advance(1.0)
    assert seen == [1]


def test_thread_scheduler_runs_and_cancels() -> None:
    scheduler = ThreadScheduler()
    try:
        done = threading.Event()
        skipped = threading.Event()
        scheduler.schedule(0.05, skipped.set).cancel()
        scheduler.schedule(0.01, done.set)
        assert done.wait(5.0)
        later = threading.Event()
        scheduler.schedule(0.06, later.set)
        assert later.wait(5.0)
        assert not skipped.is_set()
    finally:
        scheduler.shutdown()


def test_thread_scheduler_computes_due_times_from_its_clock() -> None:
    """Due an hour from now on its clock: runs once that clock got there, with no hour of waiting."""
    clock = ManualClock()
    scheduler = ThreadScheduler(clock=clock)
    try:
        order: list[str] = []
        done = threading.Event()

        def late() -> None:
            order.append("late")

        def prompt() -> None:
            order.append("prompt")
            done.set()

        scheduler.schedule(3600.0, late)
        clock.jump(3600.0)
        scheduler.schedule(0.0, prompt)  # also wakes the thread, which then reads the clock
        assert done.wait(5.0)
        assert order == ["late", "prompt"], "due times come from the clock, in order"
    finally:
        scheduler.shutdown()
