"""PySpark's worker daemon, as arrowbeat's daemon (``python_worker.daemon``) runs it: its entry point, and
what may be imported before it forks workers.

The entry is ``pyspark.daemon.manager()`` (no parameters in 4.0-4.3); when it cannot be verified,
:func:`run_pyspark_daemon` runs the module as ``python -m pyspark.daemon`` would, so PySpark's own
daemon always runs.

Fork and threads: up to 4.1 PySpark's daemon imports its worker module (numpy, and its threads,
with it) before it forks, and arrowbeat preloaded pyarrow and pandas the same way. From 4.2 PySpark
imports the worker module only in the forked child, so that no thread exists at ``fork()``
(SPARK-54456): arrowbeat then preloads only modules that start none, checked by counting the
process's threads after each import, and freezes the rest in each worker after its first task.
An unknown minor, or a daemon that does not look like its minor's, gets no preloading at all.
"""

from __future__ import annotations

import inspect
import os
import runpy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_plugin.compat._pyspark import imported_pyspark_version, recorded_for

FULL_PRELOAD = ("pyspark.worker", "pyspark.sql.pandas.serializers", "pyarrow", "pandas")
"""What every Arrow task's worker imports anyway; optional ones may be missing."""
THREAD_FREE_PRELOAD = ("pyspark.worker", "pyspark.sql.pandas.serializers")
"""The part of it that starts no thread on the minors that fork without threads (pyarrow starts
jemalloc's, numpy its BLAS pool)."""
IMPORTS_WORKER_BEFORE_FORK: dict[tuple[int, int], bool] = {
    (4, 0): True,
    (4, 1): True,
    (4, 2): False,
    (4, 3): False,
}
"""Per pyspark minor: does ``pyspark.daemon`` import the worker module at its own import (a
module-level ``worker_main``), i.e. before it forks?"""


@dataclass(frozen=True)
class DaemonEntry:
    """``manager`` to call, or None (with ``reason``): run :func:`run_pyspark_daemon` instead."""

    manager: Callable[[], None] | None
    reason: str = ""


def find_daemon_entry(daemon: Any) -> DaemonEntry:
    """``daemon.manager`` if it is a function that needs no argument."""
    manager = getattr(daemon, "manager", None)
    if not callable(manager):
        return DaemonEntry(None, "pyspark.daemon has no manager()")
    try:
        signature = inspect.signature(manager)
    except (TypeError, ValueError) as exc:
        return DaemonEntry(None, f"the signature of pyspark.daemon.manager cannot be read ({exc})")
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        return DaemonEntry(None, f"pyspark.daemon.manager{signature} needs arguments")
    return DaemonEntry(manager)


def run_pyspark_daemon() -> None:
    """PySpark's daemon exactly as ``python -m pyspark.daemon <worker module>`` runs it."""
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


@dataclass(frozen=True)
class ForkPlan:
    """What arrowbeat's daemon imports and freezes before the first fork."""

    preload: tuple[str, ...]
    threads_allowed: bool
    """PySpark itself forks with threads (4.0, 4.1); else stop preloading once one appears."""
    freeze_in_worker: bool
    """Freeze each worker's objects at its second task (what was not imported before fork)."""
    reason: str = ""
    """Why preloading is off; empty when the plan is this minor's."""


def fork_plan(daemon: Any, version: str | None = None) -> ForkPlan:
    """The plan for this pyspark ``version`` (default: the imported one) and its ``daemon`` module."""
    version = version or imported_pyspark_version()
    before, unknown = recorded_for(IMPORTS_WORKER_BEFORE_FORK, version, "daemon")
    if before is None:
        return ForkPlan((), False, False, unknown)
    if hasattr(daemon, "worker_main") != before:
        recorded = "before" if before else "after"
        return ForkPlan(
            (),
            False,
            False,
            f"pyspark {version}'s daemon does not import its worker module {recorded} fork as recorded for "
            "its minor (pyspark.daemon.worker_main)",
        )
    if before:
        return ForkPlan(FULL_PRELOAD, True, False)
    return ForkPlan(THREAD_FREE_PRELOAD, False, True)


def thread_count() -> int:
    """Threads of this process, native ones included (``/proc/self/task``; Python's elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()
