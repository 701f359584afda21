"""``spark.python.daemon.module=spark_plugin.python_daemon``: PySpark's own worker daemon, made
cheaper per task. PySpark forks its Python workers from this daemon and reuses each one for task
after task; two fixed costs per task dominated short Arrow tasks here (~250 ms and ~60 ms):

1. re-reading ``pyspark.zip``'s directory (``zip_imports.skip_unchanged_archives``);
2. the full ``gc.collect()`` PySpark runs in a reused worker after every task, which walks every
   object of pyspark, pyarrow and pandas each time. Importing those once here and freezing them
   (``gc.freeze``, the pre-fork server idiom) before the first fork leaves the collector only the
   objects workers create themselves; it also keeps the shared pages shared (no GC header writes).

It also labels each worker with the task it runs (``worker_label``), so the executor's agent can
tell whether a task's Python side progresses and, when it is stuck, show its stack.

``python -m spark_plugin conf`` and ``configure`` set it when the executors' Python
(``PYSPARK_PYTHON``) is arrowbeat's own, which has this module. Nothing may be printed to stdout
before ``manager()``: PySpark reads the daemon's port from there.
"""

from __future__ import annotations

import gc
import importlib

from spark_plugin.worker_label import label_task
from spark_plugin.zip_imports import skip_unchanged_archives

PRELOADED = ("pyspark.worker", "pyspark.sql.pandas.serializers", "pyarrow", "pandas")
"""What every Arrow task's worker imports anyway; optional ones may be missing."""


def preload_and_freeze() -> list[str]:
    """Import :data:`PRELOADED` and move everything alive into the GC's permanent generation."""
    loaded = []
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        loaded.append(name)
    gc.collect()
    gc.freeze()
    return loaded


def label_workers_by_task() -> bool:
    """Wraps ``pyspark.worker.setup_spark_files``, which a worker calls for every task right after
    it read the task's context, so the worker labels itself with the task (``worker_label``)."""
    try:
        import pyspark.worker as worker
        from pyspark.taskcontext import TaskContext
    except ImportError:
        return False
    original = getattr(worker, "setup_spark_files", None)
    if original is None or getattr(original, "_arrowbeat_labels", False):
        return False

    def setup_spark_files(infile: object) -> object:
        task = TaskContext.get()
        if task is not None:
            label_task(task.taskAttemptId())
        return original(infile)

    setup_spark_files._arrowbeat_labels = True  # type: ignore[attr-defined]
    setattr(worker, "setup_spark_files", setup_spark_files)  # noqa: B010 (pyspark's untyped global)
    return True


skip_unchanged_archives()

if __name__ == "__main__":
    from pyspark import daemon  # reads the worker module from argv at import

    preload_and_freeze()
    label_workers_by_task()
    daemon.manager()  # type: ignore[no-untyped-call]
