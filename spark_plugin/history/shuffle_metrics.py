"""The ``shuffle_metrics`` Delta table, appended from the application's driver process.

The Arrow shuffle's task reports arrive on the driver through a Spark accumulator (only from
successful task attempts), so the driver process is where a complete, de-duplicated view exists;
it appends them with delta-rs, beside the RM's history tables (same root, same table
properties), without launching a Spark job.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import TablePathError
from spark_plugin.history.storage import TablesLocation, locate, tables_root
from spark_plugin.history.tables import DEFAULT_RETENTION_S, SHUFFLE_METRICS, open_table, table_properties
from spark_plugin.settings.config import from_spark_conf


def tables_root_of(spark: Any) -> Path | TablesLocation:
    """``spark.arrowbeat.tables.path`` of this application, as the RM resolves it: a directory,
    or a located URI with the application's ``spark.hadoop.*`` credentials (raises ``ConfigError``
    for a malformed or unknown ``spark.arrowbeat.*`` entry)."""
    entries = [(str(k), str(v)) for k, v in spark.sparkContext.getConf().getAll()]
    root = tables_root(from_spark_conf(entries), dict(entries))
    return root if isinstance(root, Path) else locate(root, dict(entries))


def rows_of(
    app_id: str, shuffle_id: int, reports: Sequence[dict[str, Any]], clock: Clock = SYSTEM_CLOCK
) -> pa.Table:
    """The reports as ``shuffle_metrics`` rows, stamped with ``clock.time()`` (UTC)."""
    now = dt.datetime.fromtimestamp(clock.time(), tz=dt.UTC)
    columns: dict[str, list[Any]] = {f.name: [] for f in SHUFFLE_METRICS.schema}
    for r in reports:
        detail: dict[str, Any] = {}
        if r.get("recomputed_maps"):
            detail["recomputed_maps"] = [m for m, _ in r["recomputed_maps"]]
        reducers = r.get("reducers")
        if reducers and reducers[0] != reducers[1]:  # a coalesced reduce task: the partitions it read
            detail["reducers"] = [int(reducers[0]), int(reducers[1])]
        if r.get("corrupt"):  # written again because a reader found its output damaged
            detail["corrupt"] = dict(r["corrupt"])
        if r.get("route"):  # a routing decision (spark_plugin.shuffle.driver.route): path, reason, threshold
            detail["route"] = dict(r["route"])
        values = {
            "app_id": app_id,
            "shuffle_id": shuffle_id,
            "ts": now,
            "side": r["side"],
            "partition": int(r["partition"]),
            "attempt": str(r["attempt"]),
            "executor_id": str(r["executor"]),
            "bytes": int(r["bytes"]),
            "batches": int(r["batches"]),
            "rows": int(r["rows"]),
            "spill_bytes": int(r["spill_bytes"]),
            "blocked_on_credit_s": float(r["blocked_s"]),
            "seconds": float(r["seconds"]),
            "recomputed": bool(r["recomputed"]),
            "detail": json.dumps(detail) if detail else None,
            "corrupt": bool(r.get("corrupt")),
        }
        for name, value in values.items():
            columns[name].append(value)
    return pa.table(columns, schema=SHUFFLE_METRICS.schema)


def append_rows(
    root: TablesLocation | Path | str,
    app_id: str,
    shuffle_id: int,
    reports: Sequence[dict[str, Any]],
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Appends the reports as one commit to ``root/shuffle_metrics`` (created on first use)."""
    append_batches(root, [(app_id, shuffle_id, reports)], clock)


_opened: dict[tuple[str, float], str] = {}
"""Tables this process has opened (its schema checked, its retention set), by location and
retention: the URI to append to. Opening loads the table's snapshot, as an append does: once per
process, not once per append."""


def append_batches(
    root: TablesLocation | Path | str,
    batches: Sequence[tuple[str, int, Sequence[dict[str, Any]]]],
    clock: Clock = SYSTEM_CLOCK,
    retention_s: float = DEFAULT_RETENTION_S,
) -> None:
    """Appends the reports of several shuffles, ``(app_id, shuffle_id, reports)`` each, as one
    commit, to a table kept for ``retention_s`` (``spark.arrowbeat.tables.retention``)."""
    from deltalake import write_deltalake

    location = locate(root)
    key = (repr(location), retention_s)
    path = _opened.get(key)
    if path is None:
        path = _opened[key] = open_table(location, SHUFFLE_METRICS, retention_s)
    rows = pa.concat_tables([rows_of(app, shuffle, reports, clock) for app, shuffle, reports in batches])
    try:
        # The table's properties go with every append: they count only when the append creates
        # the table (removed since this process opened it), which then keeps its retention.
        write_deltalake(
            path,
            rows,
            mode="append",
            configuration=table_properties(retention_s),
            storage_options=location.options(),
        )
    except Exception as exc:
        _opened.pop(key, None)  # opened again next time: the table may have been removed
        if location.local is not None:
            raise
        raise TablePathError(  # delta-rs's text may quote a credential: scrubbed, not chained
            f"cannot append to {location.spark_uri(SHUFFLE_METRICS.name)}: {location.scrub(exc)}"
        ) from None
