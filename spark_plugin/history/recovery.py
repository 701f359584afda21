"""What a restarted ResourceManager learns from the history it kept: the executors it knew, the
events its gauge counters had counted, the tasks it had reported stuck and not yet resumed, and
the damaged map outputs it had recorded (which agents may still be carrying)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from spark_plugin.errors import TablePathError
from spark_plugin.history.storage import TablesLocation, locate
from spark_plugin.history.tables import EXECUTOR_EVENTS

#: After these, an executor is no longer expected to come back on its own.
_ENDED = {"UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"}
#: Events about an executor's agent registration; the others (UNMONITORED: no agent ever came;
#: TASK_STUCK/TASK_RESUMED: its tasks; SHUFFLE_CORRUPT: a damaged map output its agent found) say
#: nothing of whether an agent is expected back.
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
    stuck: dict[str, list[StuckTask]] = field(default_factory=dict)
    """Per live executor, the task attempts recorded ``TASK_STUCK`` and not yet ``TASK_RESUMED``:
    the restarted RM takes them as still stuck (``TaskEvents.adopt_stuck``), so a task that stays
    stuck is not reported (or killed) twice, and one that moved on during the gap is resumed."""
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    """The last :data:`MAX_CORRUPT` ``SHUFFLE_CORRUPT`` events as ``(executor_id, detail)``,
    oldest first: an agent's board still carries a notice for a while after it was recorded
    (``heartbeat.notices``), and the restarted RM records it again unless it knows it
    (``NoticeEvents.adopt``)."""


DEGRADED_ENDS = frozenset({"RECOVERED", "UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"})
"""What ends an executor's ``DEGRADED``: back in line with its peers, or gone."""


def still_degraded(events: Iterable[tuple[str, str]]) -> list[str]:
    """The executors of ``(event, executor_id)`` pairs (oldest first, as :attr:`Recovered.events`)
    recorded ``DEGRADED`` and not ended since by one of :data:`DEGRADED_ENDS`, in recorded order:
    a restarted driver takes them as degraded still (``DegradedWatch.adopt``)."""
    open_: dict[str, None] = {}
    for kind, executor_id in events:
        if kind == "DEGRADED":
            open_.setdefault(executor_id, None)
        elif kind in DEGRADED_ENDS:
            open_.pop(executor_id, None)
    return list(open_)


MAX_CORRUPT = 1024
"""Recorded damaged outputs a restarted RM takes back (agents carry a notice for about 30 s)."""


@dataclass(frozen=True)
class StuckTask:
    task_id: str
    label: str


_TASK_LABEL = re.compile(r"^(stage \S+ partition \d+ attempt \d+ \(task (\d+)\))(?::|$)")
"""A task event's detail starts with the task's label (``monitoring.executor_tasks``), which ends
with its Spark task id."""


def stuck_tasks(events: list[dict[str, object]]) -> dict[str, list[StuckTask]]:
    """From an application's events, oldest first: per executor, the tasks whose last task event
    is ``TASK_STUCK``; none of an executor whose agent left for good after it. Pure."""
    stuck: dict[str, dict[str, StuckTask]] = {}
    for row in events:
        executor_id, kind = str(row["executor_id"]), str(row["event"])
        if kind in _ENDED:
            stuck.pop(executor_id, None)
            continue
        if kind not in ("TASK_STUCK", "TASK_RESUMED"):
            continue
        found = _TASK_LABEL.match(str(row.get("detail") or ""))
        if found is None:
            continue
        label, task_id = found[1], found[2]
        if kind == "TASK_STUCK":
            stuck.setdefault(executor_id, {})[task_id] = StuckTask(task_id, label)
        else:
            stuck.get(executor_id, {}).pop(task_id, None)
    return {e: list(tasks.values()) for e, tasks in stuck.items() if tasks}


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
    columns = ["app_id", "executor_id", "host", "instance_id", "ts", "event", "detail"]
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
    ordered = events.to_pylist()
    for row in ordered:
        replay.append((row["event"], row["executor_id"]))
        if row["event"] not in _LIFECYCLE:
            continue
        last[row["executor_id"]] = KnownExecutor(
            row["executor_id"], row["host"], row["instance_id"], row["event"]
        )
    corrupt = [
        (str(r["executor_id"]), str(r["detail"] or "")) for r in ordered if r["event"] == "SHUFFLE_CORRUPT"
    ]
    return Recovered(
        [e for e in last.values() if e.last_event not in _ENDED],
        replay,
        stuck_tasks(ordered),
        corrupt[-MAX_CORRUPT:],
    )
