"""The marks ``harness/apps/timed_job_app.py``'s task attempts write, read back: which attempts ran
where and when (a freeze's cut attempts, their reruns, each executor's pace)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any


def marks(folder: Path, suffix: str) -> list[dict[str, Any]]:
    """A job's task attempts' marks of one kind (``.start`` or ``.end``), each with its ``tid``
    (a mark being written, or left half-written by a killed worker, is skipped)."""
    found = []
    for path in folder.glob(f"*{suffix}"):
        with contextlib.suppress(ValueError, OSError):
            fields = json.loads(path.read_text())
            fields["tid"] = int(path.stem.rsplit("-", 1)[1])
            found.append(fields)
    return found


def running_on(folder: Path, pid: int) -> bool:
    """Whether an attempt on JVM ``pid`` started and has not ended (so far)."""
    ended = {m["tid"] for m in marks(folder, ".end")}
    return any(m["pid"] == pid and m["tid"] not in ended for m in marks(folder, ".start"))


def seconds_per_unit(folder: Path) -> dict[int, list[float]]:
    """JVM pid -> each of its finished attempts' seconds per unit of work."""
    starts = {m["tid"]: m for m in marks(folder, ".start")}
    found: dict[int, list[float]] = {}
    for end in marks(folder, ".end"):
        start = starts.get(end["tid"])
        if start is not None:
            found.setdefault(end["pid"], []).append((end["t"] - start["t"]) / max(1, end["units"]))
    return found
