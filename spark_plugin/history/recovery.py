"""What a restarted ResourceManager learns from the history it kept: the executors it knew."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spark_plugin.history.tables import EXECUTOR_EVENTS

#: After these, an executor is no longer expected to come back on its own.
_ENDED = {"UNREGISTERED"}


@dataclass(frozen=True)
class KnownExecutor:
    executor_id: str
    host: str
    instance_id: str
    last_event: str


def known_executors(root: Path, app_id: str) -> list[KnownExecutor]:
    """Executors of ``app_id`` whose last recorded event does not say they left for good."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    path = root / EXECUTOR_EVENTS.name
    if not (path / "_delta_log").is_dir():
        return []
    events = DeltaTable(str(path)).to_pyarrow_table(
        columns=["app_id", "executor_id", "host", "instance_id", "ts", "event"]
    )
    events = events.filter(pc.equal(events["app_id"], app_id)).sort_by([("ts", "ascending")])
    last: dict[str, KnownExecutor] = {}
    for row in events.to_pylist():
        last[row["executor_id"]] = KnownExecutor(
            row["executor_id"], row["host"], row["instance_id"], row["event"]
        )
    return [e for e in last.values() if e.last_event not in _ENDED]
