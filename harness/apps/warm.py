"""The start a multi-executor test application makes before it says it is ready: every executor
registered with Spark, and each with a started Python worker (a warm-up task ran there), so what
the test times or injects next does not land on an executor still starting."""

from __future__ import annotations

import time
from typing import Any


def jvm_pid() -> int:
    """The executor JVM running this Python worker (its nearest ``java`` ancestor), else 0."""
    import psutil

    for parent in psutil.Process().parents():
        if parent.name() == "java":
            return parent.pid
    return 0


def warm_pid(_: int) -> int:
    """A warm-up task: long enough for every executor to get one; its JVM's pid."""
    time.sleep(0.3)
    return jvm_pid()


def warm_executors(sc: Any, count: int, timeout_s: float) -> set[int]:
    """The pids of the executor JVMs that ran a warm-up task, once ``count`` executors have
    registered and each ran one (fewer if ``timeout_s`` passes first: the caller's test then
    fails on what it finds, not here)."""
    deadline = time.monotonic() + timeout_s
    while sc._jsc.sc().getExecutorIds().size() < count and time.monotonic() < deadline:
        time.sleep(0.1)
    pids: set[int] = set()
    while len(pids) < count and time.monotonic() < deadline:
        pids |= set(sc.parallelize(range(2 * count), 2 * count).map(warm_pid).collect())
    return pids
