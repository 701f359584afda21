"""``spark.python.daemon.module=spark_plugin.python_worker.daemon``: PySpark's own worker daemon, made
cheaper per task. PySpark forks its Python workers from this daemon and reuses each one for task
after task; two fixed costs per task dominated short Arrow tasks here (~250 ms and ~60 ms):

1. re-reading ``pyspark.zip``'s directory (``zip_imports.skip_unchanged_archives``);
2. the full ``gc.collect()`` PySpark runs in a reused worker after every task, which walks every
   object of pyspark, pyarrow and pandas each time. Importing those once here and freezing them
   (``gc.freeze``, the pre-fork server idiom) before the first fork leaves the collector only the
   objects workers create themselves; it also keeps the shared pages shared (no GC header writes).
   Where PySpark forks without threads (4.2+), only what starts no thread is imported here, and
   each worker freezes what it imported itself at its second task (``compat.daemon``).

It also labels each worker with the task it runs (``worker_label``, through the hook
``compat.worker_hooks`` verified for this pyspark), so the executor's agent can tell whether a
task's Python side progresses and, when it is stuck, show its stack.

Every step is an optimisation: one that cannot be verified on the running pyspark is skipped with
one warning on stderr, and PySpark's daemon runs all the same. ``python -m spark_plugin conf`` and
``configure`` set this module when the executors' Python (``PYSPARK_PYTHON``) is arrowbeat's own.
Nothing may be printed to stdout before ``manager()``: PySpark reads the daemon's port from there.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
from collections.abc import Callable, Iterable

from spark_plugin.compat import daemon as daemon_compat
from spark_plugin.compat.worker_hooks import on_task_start
from spark_plugin.python_worker.worker_label import label_task
from spark_plugin.python_worker.zip_imports import skip_unchanged_archives

log = logging.getLogger(__name__)


def preload_and_freeze(modules: Iterable[str], threads_allowed: bool = True) -> list[str]:
    """Import ``modules`` (optional ones may be missing) and move everything alive into the GC's
    permanent generation. Unless ``threads_allowed``, preloading stops (one warning) at the first
    import after which the process has more than one thread."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
        if not threads_allowed and daemon_compat.thread_count() > 1:
            log.warning(
                "arrowbeat's worker daemon stops preloading: importing %s started a thread, and this "
                "PySpark forks its workers without threads",
                name,
            )
            break
    gc.collect()
    gc.freeze()
    return loaded


def freeze_at_second_task() -> Callable[[int], None]:
    """A per-task callback for a worker that imported its own modules after the fork: at its
    second task (after PySpark's collection of the first one's garbage) it freezes what is left,
    so later collections skip it."""
    seen = 0

    def on_task(_task_attempt_id: int) -> None:
        nonlocal seen
        seen += 1
        if seen == 2:
            gc.freeze()

    return on_task


def _warnings_to_stderr() -> None:
    """arrowbeat's warnings in this process go to stderr, whatever logging says: stdout is the
    daemon's channel to the JVM."""
    logger = logging.getLogger("spark_plugin")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("arrowbeat worker daemon: %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def main() -> None:
    """Prepare, then run PySpark's daemon; nothing here stops PySpark's daemon from running."""
    _warnings_to_stderr()
    try:
        from pyspark import daemon  # up to 4.1 this imports the worker module named in argv
    except Exception:  # PySpark's own way fails the same way, with PySpark's error
        daemon_compat.run_pyspark_daemon()
        return
    entry = daemon_compat.find_daemon_entry(daemon)
    if entry.manager is None:
        log.warning("arrowbeat runs PySpark's daemon as shipped, without its optimisations: %s", entry.reason)
        daemon_compat.run_pyspark_daemon()
        return
    try:
        skip_unchanged_archives()
        plan = daemon_compat.fork_plan(daemon)
        if plan.reason:
            log.warning("arrowbeat's worker daemon preloads nothing: %s", plan.reason)
        preload_and_freeze(plan.preload, plan.threads_allowed)
        on_task_start([label_task, *([freeze_at_second_task()] if plan.freeze_in_worker else [])])
    except Exception:  # an optimisation that broke is dropped; the daemon still runs
        log.warning("arrowbeat's worker daemon skipped its optimisations", exc_info=True)
    entry.manager()


if __name__ == "__main__":
    main()
