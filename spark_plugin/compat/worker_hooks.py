"""How a PySpark worker learns which task it is about to run: the one PySpark function arrowbeat
wraps inside a worker (to label it, ``worker_label``).

Every pyspark 4.x worker calls ``pyspark.worker.setup_spark_files`` once per task, by that name in
``pyspark.worker``'s globals, right after it set the task's ``TaskContext``. Its parameters changed
between minors: ``(infile)`` up to 4.2, ``(infile_or_spark_files_dir, python_includes=None)`` in
4.3, where a wrapper that took one argument failed every Python UDF of the application
(DESIGN.md, "Traps"). So the wrapper takes and passes on any arguments and the return value
untouched, and it is installed only when the running minor is one of :data:`SETUP_SPARK_FILES`, the
function's real signature is the one recorded there, and the worker's task loop calls it by name.
Anything else: no wrapper, one warning naming what and why, and PySpark's worker runs as shipped
(its workers are then not labelled: stuck tasks are still found, without their Python stacks).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spark_plugin.compat._pyspark import imported_pyspark_version, recorded_for

log = logging.getLogger(__name__)

HOOK = "setup_spark_files"
SETUP_SPARK_FILES: dict[tuple[int, int], tuple[str, ...]] = {
    (4, 0): ("infile",),
    (4, 1): ("infile",),
    (4, 2): ("infile",),
    (4, 3): ("infile_or_spark_files_dir", "python_includes"),
}
"""Parameter names of ``pyspark.worker.setup_spark_files`` in each pyspark minor's sources."""
TASK_LOOP = ("main", "invoke_udf")
"""``pyspark.worker`` functions that call the hook by name (4.3 moved the call into ``invoke_udf``)."""
_CALLBACKS = "_arrowbeat_task_callbacks"

TaskCallback = Callable[[int], None]
"""Called in the worker with the task attempt id, before PySpark sets up the task's files."""


@dataclass(frozen=True)
class TaskStartHook:
    """``install(callbacks)`` has the worker call each of ``callbacks`` at the start of each task;
    None (with ``reason``) when this pyspark's hook could not be verified."""

    install: Callable[[Sequence[TaskCallback]], None] | None
    reason: str = ""


def find_task_start_hook(
    worker: Any = None, task_context: Any = None, version: str | None = None
) -> TaskStartHook:
    """Checks ``worker`` (default ``pyspark.worker``), ``task_context`` (default
    ``pyspark.taskcontext.TaskContext``) and the pyspark ``version`` (default: the imported one);
    patches nothing."""
    try:
        if worker is None:
            import pyspark.worker as worker
        if task_context is None:
            from pyspark.taskcontext import TaskContext as task_context
    except Exception as exc:  # any failure to import is PySpark's to report, not ours
        return TaskStartHook(None, f"pyspark.worker cannot be imported here ({exc!r})")
    version = version or imported_pyspark_version()
    expected, unknown = recorded_for(SETUP_SPARK_FILES, version, "worker")
    if expected is None:
        return TaskStartHook(None, unknown)
    current = getattr(worker, HOOK, None)
    if not callable(current):
        return TaskStartHook(None, f"pyspark {version}'s worker has no {HOOK}")
    callbacks: list[TaskCallback] | None = getattr(current, _CALLBACKS, None)
    if callbacks is not None:  # wrapped already: more callbacks, never a second wrapper
        return TaskStartHook(callbacks.extend)
    try:
        signature = inspect.signature(current)
    except (TypeError, ValueError) as exc:
        return TaskStartHook(None, f"the signature of pyspark {version}'s {HOOK} cannot be read ({exc})")
    if tuple(signature.parameters) != expected:
        return TaskStartHook(
            None,
            f"pyspark {version}'s {HOOK}{signature} is not the recorded {HOOK}({', '.join(expected)})",
        )
    if not _called_by_name(worker):
        return TaskStartHook(
            None, f"pyspark {version}'s worker does not call {HOOK} by name in {' or '.join(TASK_LOOP)}"
        )
    if not callable(getattr(task_context, "get", None)) or not callable(
        getattr(task_context, "taskAttemptId", None)
    ):
        return TaskStartHook(None, f"pyspark {version}'s TaskContext has no get() or taskAttemptId()")

    def install(callbacks: Sequence[TaskCallback]) -> None:
        setattr(worker, HOOK, _wrap(current, task_context, list(callbacks)))

    return TaskStartHook(install)


def on_task_start(
    callbacks: Sequence[TaskCallback],
    worker: Any = None,
    task_context: Any = None,
    version: str | None = None,
) -> bool:
    """Has every task of this process's (future) workers call each of ``callbacks`` first, in
    order; True if it will, else False after one warning that says why."""
    hook = find_task_start_hook(worker, task_context, version)
    if hook.install is None:
        log.warning(
            "arrowbeat does not hook the start of tasks in PySpark's workers (they are not labelled "
            "with their tasks: no Python stacks of stuck tasks): %s; PySpark's worker runs unchanged",
            hook.reason,
        )
        return False
    hook.install(callbacks)
    return True


def _called_by_name(worker: Any) -> bool:
    """Does a task-loop function of ``worker`` look the hook up by name (so a new global is used)?"""
    for name in TASK_LOOP:
        function = getattr(worker, name, None)
        if function is None:
            continue
        code = getattr(inspect.unwrap(function), "__code__", None)
        if code is not None and HOOK in code.co_names:
            return True
    return False


def _wrap(
    original: Callable[..., Any], task_context: Any, callbacks: list[TaskCallback]
) -> Callable[..., Any]:
    @functools.wraps(original)  # keeps the original's signature visible to inspect
    def setup_spark_files(*args: Any, **kwargs: Any) -> Any:
        _announce(task_context, callbacks)
        return original(*args, **kwargs)

    setattr(setup_spark_files, _CALLBACKS, callbacks)
    return setup_spark_files


def _announce(task_context: Any, callbacks: list[TaskCallback]) -> None:
    """Each callback with the running task's attempt id; nothing here may fail the task."""
    try:
        task = task_context.get()
        attempt = None if task is None else int(task.taskAttemptId())
    except Exception:
        return
    if attempt is None:
        return
    for callback in callbacks:
        try:
            callback(attempt)
        except Exception:
            continue
