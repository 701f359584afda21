"""Inside a PySpark Python worker: say which task it runs, and be ready to say where it is.

``daemon`` (arrowbeat's worker daemon) calls :func:`label_task` when a task starts in a
worker. The worker's kernel name (``/proc/<pid>/comm``) becomes ``abt<task attempt id>``, so the
executor's agent finds the worker that serves a task and reads its CPU time; and ``faulthandler``
is registered on ``SIGUSR2`` to write the stack of every thread to a private file, so the agent can
show where a stuck task waits, even when its thread is blocked in C (``faulthandler`` writes from
the signal handler, without the GIL). The agent signals only a worker whose label and stack file
exist (without the handler, ``SIGUSR2`` would end it).

Beside Spark's own worker tools (``spark.python.worker.faulthandler.enabled``: ``faulthandler.enable``
on fatal signals into its own file; 4.1+ ``tracebackDumpIntervalSeconds``: a repeating
``faulthandler.dump_traceback_later`` to stderr): this module only ever *registers* its one user
signal, never enables, disables, cancels or unregisters anything, so whatever Spark armed stays
armed. Should something else already handle ``SIGUSR2`` in the worker, arrowbeat's handler chains
to it rather than replace it.

Stack files go with their workers. A worker cannot remove its own: PySpark's daemon ends it with
``os._exit`` (no ``atexit``), or a signal does. So each worker, when it makes its file, removes
the files of workers that are gone (``remove_dead_workers_files``): the folder holds the live
workers' files and those of workers that ended since the last one started, never one per
worker the executor ever ran.

Kept tiny: it is imported by every worker; nothing here may print to stdout.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
from typing import IO

LABEL_PREFIX = "abt"
"""``/proc/<pid>/comm`` of a worker running a task: ``abt<task attempt id>`` (15 characters at most)."""
STACKS_FOLDER = "arrowbeat-stacks"
"""The folder, in the executor's first Spark local dir, of the workers' stack files."""
STACK_SIGNAL = signal.SIGUSR2
_PR_SET_NAME = 15

_stack_file: IO[str] | None = None


def stack_path(local_dir: str, pid: int) -> str:
    return os.path.join(local_dir, STACKS_FOLDER, f"{int(pid)}.txt")


def _ready_for_stacks() -> bool:
    """Once per worker: the private stack file opened and the handler registered."""
    global _stack_file
    if _stack_file is not None:
        return True
    local_dirs = [d for d in os.environ.get("SPARK_LOCAL_DIRS", "").split(",") if d]
    if not local_dirs:
        return False
    from arrow_shuffle.private_files import create_private_file, make_private_dir

    folder = make_private_dir(os.path.join(local_dirs[0], STACKS_FOLDER))
    path = os.path.join(folder, f"{os.getpid()}.txt")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a reused pid's old file
    remove_dead_workers_files(folder)
    stream = os.fdopen(create_private_file(path), "a", encoding="utf-8")
    faulthandler.register(STACK_SIGNAL, file=stream, all_threads=True, chain=_signal_caught(STACK_SIGNAL))
    _stack_file = stream
    return True


def remove_dead_workers_files(folder: str) -> int:
    """Delete the stack files in ``folder`` whose worker is gone; returns how many.

    A file stays while its pid runs (a pid reused by another process keeps it until that one
    ends: at most one file per pid). Best effort: a file another worker removed first is fine."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    for name in names:
        stem, _, ext = name.partition(".")
        if ext != "txt" or not stem.isdigit() or int(stem) == os.getpid() or _alive(int(stem)):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(folder, name))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process (EPERM): alive
        return True
    return True


def _signal_caught(signum: int) -> bool:
    """Does this process already run a handler for ``signum`` (``SigCgt``, whoever installed it:
    Python's ``signal`` or native code)? Then arrowbeat's handler calls it after its dump."""
    try:
        with open("/proc/self/status") as f:
            caught = next((line.split(":", 1)[1] for line in f if line.startswith("SigCgt:")), "0")
    except OSError:
        return False
    return bool(int(caught.strip() or "0", 16) >> (int(signum) - 1) & 1)


def label_task(task_attempt_id: int) -> None:
    """Mark this worker as serving ``task_attempt_id``. Best effort: never fails the task."""
    try:
        if not _ready_for_stacks():
            return
        name = f"{LABEL_PREFIX}{int(task_attempt_id)}"[:15].encode()
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    except Exception:  # a worker without a label is only watched less closely
        return
