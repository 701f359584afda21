"""Where a stuck task is, in few characters: a Python worker's stack (written by its
``faulthandler`` on ``SIGUSR2``, once the worker says it handles the signal) and a JVM thread's
(``jstack``-like lines from the JVM), each cut to its innermost frames for the heartbeat payload.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from spark_plugin.python_worker.worker_label import LABEL_PREFIX, STACK_SIGNAL

MAX_WHERE_CHARS = 1500


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)$')


def handles_stack_signal(pid: int, task_id: int) -> bool:
    """Is ``pid`` still the worker labelled with ``task_id``, with a handler for the stack signal
    (``SigCgt`` in ``/proc/<pid>/status``)? Without one the signal would end the process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return False
    caught = int(fields.get("SigCgt", "0").strip() or "0", 16)
    name = fields.get("Name", "").strip()
    return name == f"{LABEL_PREFIX}{task_id}"[:15] and bool(caught >> (int(STACK_SIGNAL) - 1) & 1)


def compact_python_stack(text: str, frames: int = 8) -> str:
    """A ``faulthandler`` dump as one line: the frames of the thread running the task (the one
    in ``pyspark/worker.py``, else the first), innermost first: ``func (file:line) < ...``."""
    blocks: list[list[tuple[str, str, str]]] = []
    for raw in text.splitlines():
        if raw.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
            continue
        match = _FRAME.match(raw)
        if match is not None:
            if not blocks:
                blocks.append([])
            blocks[-1].append((match["func"], os.path.basename(match["file"]), match["line"]))
    if not blocks:
        return text.strip().splitlines()[0][:200] if text.strip() else "(empty)"
    chosen = next((b for b in blocks if any(f == "worker.py" for _, f, _ in b)), blocks[0])
    return _join(f"{func} ({name}:{line})" for func, name, line in chosen[:frames])


def compact_jvm_stack(text: str, frames: int = 6) -> str:
    """The JVM's ``thread "..." STATE [on lock]`` header and its innermost frames, one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return "(empty)"
    head, rest = lines[0], [line.removeprefix("at ") for line in lines[1 : frames + 1]]
    return f"{head}: {_join(rest)}" if rest else head


def _join(parts: Iterable[str]) -> str:
    return " < ".join(parts)
