"""Reading arrowbeat's history tables in tests without a Spark session (delta-rs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def rows(tables: Path, name: str) -> list[dict[str, Any]]:
    """All rows of one history table, oldest first; empty if it does not exist yet."""
    from deltalake import DeltaTable

    path = tables / name
    if not (path / "_delta_log").is_dir():
        return []
    table = DeltaTable(str(path)).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: r["ts"])


def events(tables: Path, executor_id: str | None = None) -> list[tuple[str, str]]:
    """``(executor_id, event)`` pairs from ``executor_events``, oldest first."""
    return [
        (r["executor_id"], r["event"])
        for r in rows(tables, "executor_events")
        if executor_id is None or r["executor_id"] == executor_id
    ]
