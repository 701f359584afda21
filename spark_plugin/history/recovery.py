"""What a restarted ResourceManager learns from the history it kept: the executors it knew, and
the events its gauge counters had counted."""

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


@dataclass(frozen=True)
class Recovered:
    """What a restarted RM takes back from its application's ``executor_events``."""

    known: list[KnownExecutor]
    """Executors whose last lifecycle event does not say they left for good: expected back."""
    events: list[tuple[str, str]]
    """Every recorded ``(event, executor_id)`` of the application, oldest first: replayed into
    the driver's gauge counters (``plugin_metrics.LivenessTally.replay``), so a restart does not
    set Spark's ``events.*`` counters back to zero."""


def known_executors(root: TablesLocation | Path | str, app_id: str) -> list[KnownExecutor]:
    """Executors of ``app_id`` whose last recorded event does not say they left for good."""
    return recover(root, app_id).known


def recover(root: TablesLocation | Path | str, app_id: str) -> Recovered:
    """One read of ``executor_events`` for ``app_id``: the executors to expect back and the
    events to replay; nothing for a table that does not exist yet."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    location = locate(root)
    uri, options = location.table_uri(EXECUTOR_EVENTS.name), location.options()
    if location.local is not None and not (location.local / EXECUTOR_EVENTS.name / "_delta_log").is_dir():
        return Recovered([], [])
    columns = ["app_id", "executor_id", "host", "instance_id", "ts", "event"]
    try:
        events = DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=columns)
    except TableNotFoundError:
        return Recovered([], [])
    except Exception as exc:  # the writer opened the table a moment ago: storage trouble, named
        if location.local is not None:
            raise
        raise TablePathError(
            f"cannot read {location.spark_uri(EXECUTOR_EVENTS.name)}: {location.scrub(exc)}"
        ) from None
    events = events.filter(pc.equal(events["app_id"], app_id)).sort_by([("ts", "ascending")])
    last: dict[str, KnownExecutor] = {}
    replay: list[tuple[str, str]] = []
    for row in events.to_pylist():
        replay.append((row["event"], row["executor_id"]))
        if row["event"] not in _LIFECYCLE:
            continue
        last[row["executor_id"]] = KnownExecutor(
            row["executor_id"], row["host"], row["instance_id"], row["event"]
        )
    return Recovered([e for e in last.values() if e.last_event not in _ENDED], replay)
