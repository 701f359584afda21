"""What a restarted ResourceManager learns from the history it kept: the executors it knew."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spark_plugin.errors import TablePathError
from spark_plugin.history.storage import TablesLocation, locate
from spark_plugin.history.tables import EXECUTOR_EVENTS

#: After these, an executor is no longer expected to come back on its own.
_ENDED = {"UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"}
#: Events about an executor's agent registration; the others (UNMONITORED: no agent ever came;
#: TASK_STUCK/TASK_RESUMED: its tasks) say nothing of whether an agent is expected back.
_LIFECYCLE = {"REGISTERED", "REREGISTERED", "HEARTBEAT_TIMEOUT", "UNREACHABLE", *_ENDED}


@dataclass(frozen=True)
class KnownExecutor:
    executor_id: str
    host: str
    instance_id: str
    last_event: str


def known_executors(root: TablesLocation | Path | str, app_id: str) -> list[KnownExecutor]:
    """Executors of ``app_id`` whose last recorded event does not say they left for good."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    location = locate(root)
    uri, options = location.table_uri(EXECUTOR_EVENTS.name), location.options()
    if location.local is not None and not (location.local / EXECUTOR_EVENTS.name / "_delta_log").is_dir():
        return []
    columns = ["app_id", "executor_id", "host", "instance_id", "ts", "event"]
    try:
        events = DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=columns)
    except TableNotFoundError:
        return []
    except Exception as exc:  # the writer opened the table a moment ago: storage trouble, named
        if location.local is not None:
            raise
        raise TablePathError(
            f"cannot read {location.spark_uri(EXECUTOR_EVENTS.name)}: {location.scrub(exc)}"
        ) from None
    events = events.filter(pc.equal(events["app_id"], app_id)).sort_by([("ts", "ascending")])
    last: dict[str, KnownExecutor] = {}
    for row in events.to_pylist():
        if row["event"] not in _LIFECYCLE:
            continue
        last[row["executor_id"]] = KnownExecutor(
            row["executor_id"], row["host"], row["instance_id"], row["event"]
        )
    return [e for e in last.values() if e.last_event not in _ENDED]
