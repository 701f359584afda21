"""Delayed execution, injected everywhere a timer is needed (Flink's ``ScheduledExecutor``).

Three implementations share the ``Scheduler`` protocol:

* ``LoopScheduler`` runs callbacks on an asyncio loop: the RM and the agent keep all heartbeat
  state on their loop thread, like Flink's main-thread executor, so no callback races a handler.
  Its delays are relative, measured by the loop itself.
* ``ThreadScheduler`` runs callbacks on one daemon thread, for callers without a loop. It waits
  for real (a condition variable with a timeout) but computes due times from its ``Clock``.
* ``ManualScheduler`` runs due callbacks only inside ``advance()``, which moves its
  ``ManualClock``: deterministic, sleep-free tests.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock, ManualClock

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Cancellable: ...


class _Task:
    """A queued callback; cancelling only flags it so the heap needs no removal."""

    __slots__ = ("cancelled", "due", "fn")

    def __init__(self, due: float, fn: Callable[[], None]) -> None:
        self.due = due
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _run(fn: Callable[[], None]) -> None:
    """A failing callback must not kill the scheduler that also runs everyone else's timers."""
    try:
        fn()
    except Exception:
        log.exception("scheduled heartbeat callback failed")


class ManualScheduler:
    """Runs tasks only when ``advance`` moves its ``ManualClock`` past their due time."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self._heap: list[tuple[float, int, _Task]] = []
        self._seq = itertools.count()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        task = _Task(self.clock.monotonic() + max(0.0, delay_s), fn)
        heapq.heappush(self._heap, (task.due, next(self._seq), task))
        return task

    def advance(self, seconds: float) -> None:
        """Move time forward, running every task due on the way at its own due time, in order."""
        end = self.clock.monotonic() + seconds
        while self._heap and self._heap[0][0] <= end:
            due, _, task = heapq.heappop(self._heap)
            if task.cancelled:
                continue
            self.clock.set(max(due, self.clock.monotonic()))
            _run(task.fn)
        self.clock.set(end)

    def pending(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)


class ThreadScheduler:
    """A single timer thread; ``shutdown`` drops pending tasks."""

    def __init__(self, name: str = "heartbeat-scheduler", clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int, _Task]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        task = _Task(self._clock.monotonic() + max(0.0, delay_s), fn)
        with self._cond:
            if not self._closed:
                heapq.heappush(self._heap, (task.due, next(self._seq), task))
                self._cond.notify()
        return task

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    wait_s = self._heap[0][0] - self._clock.monotonic() if self._heap else None
                    if wait_s is not None and wait_s <= 0:
                        break
                    self._cond.wait(wait_s)
                if self._closed:
                    return
                _, _, task = heapq.heappop(self._heap)
            if not task.cancelled:
                _run(task.fn)

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()


class LoopScheduler:
    """Schedules on an asyncio loop; safe to call from the loop thread or from any other thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def schedule(self, delay_s: float, fn: Callable[[], None]) -> Cancellable:
        task = _Task(0.0, fn)

        def fire() -> None:
            if not task.cancelled:
                _run(task.fn)

        delay = max(0.0, delay_s)
        if _running_loop() is self._loop:
            self._loop.call_later(delay, fire)
        else:
            self._loop.call_soon_threadsafe(self._loop.call_later, delay, fire)
        return task


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
