"""Letting go of a PySpark accumulator's value on the driver.

PySpark's driver keeps every accumulator it ever made in ``pyspark.accumulators.
_accumulatorRegistry`` (id -> accumulator, with its value), for the life of the process: its
update server adds each task's update to the entry of that id. A shuffle's accumulator holds
its task reports (about 1 KB a task), so a streaming query with a shuffle per micro-batch kept
every report of every shuffle: about 20 MB per 1,000 shuffles.

``discard(aid)`` puts a shared, empty sink in the accumulator's place. The id stays (the update
server of pyspark 4.0 looks ids up without checking: a missing one would fail the update
connection that every later job's accumulators use), so a late update (a released DataFrame
evaluated again) is taken and dropped; what stays is the registry's slot, about 100 bytes.
Nothing is done, and False returned, on a PySpark without that registry.
"""

from __future__ import annotations

from typing import Any


class _Discarded:
    """Takes any update (``registry[aid] += update``) and keeps nothing."""

    def __iadd__(self, _update: Any) -> _Discarded:
        return self

    def __repr__(self) -> str:
        return "<arrowbeat: a released accumulator's updates are dropped>"


DISCARDED = _Discarded()


def discard(aid: int) -> bool:
    """Drop accumulator ``aid``'s value from PySpark's registry; whether there was one."""
    try:
        from pyspark import accumulators
    except ImportError:
        return False
    registry = getattr(accumulators, "_accumulatorRegistry", None)
    if not isinstance(registry, dict) or aid not in registry:
        return False
    registry[aid] = DISCARDED
    return True
