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

from spark_plugin.config import load, tables_root
from spark_plugin.history.tables import SHUFFLE_METRICS, open_table


def tables_root_of(spark: Any) -> Path:
    """``spark.arrowbeat.tables.path`` of this application, as the RM resolves it."""
    settings = {k: v for k, v in spark.sparkContext.getConf().getAll() if k.startswith("spark.")}
    known = {k: v for k, v in settings.items() if not k.startswith("spark.arrowbeat.") or k in _known()}
    return tables_root(load(known), settings)


def _known() -> set[str]:
    from spark_plugin.config import OPTIONS_BY_KEY

    return set(OPTIONS_BY_KEY)


def rows_of(app_id: str, shuffle_id: int, reports: Sequence[dict[str, Any]]) -> pa.Table:
    now = dt.datetime.now(dt.UTC)
    columns: dict[str, list[Any]] = {f.name: [] for f in SHUFFLE_METRICS.schema}
    for r in reports:
        detail = {"recomputed_maps": [m for m, _ in r["recomputed_maps"]]} if r.get("recomputed_maps") else {}
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
        }
        for name, value in values.items():
            columns[name].append(value)
    return pa.table(columns, schema=SHUFFLE_METRICS.schema)


def append_rows(root: Path, app_id: str, shuffle_id: int, reports: Sequence[dict[str, Any]]) -> None:
    from deltalake import write_deltalake

    path = open_table(root, SHUFFLE_METRICS)
    write_deltalake(path, rows_of(app_id, shuffle_id, reports), mode="append")
