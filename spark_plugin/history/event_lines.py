"""One line per executor lifecycle event, as the CLI (``arrowbeat events``) and the feed job print it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_plugin.history.gaps import KIND as GAP_KIND
from spark_plugin.history.gaps import describe, parse_gap
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text


def format_event(row: Mapping[str, Any]) -> str:
    """One line per event, whatever the table holds: ids, host and detail (they came from the
    wire, and the table may predate arrowbeat's own checks) pass ``wire_text``. A monitoring gap
    is the RM's, not an executor's: its line says which interval has no history, and why."""
    gap = parse_gap(row["detail"]) if row["event"] == GAP_KIND else None
    if gap is not None:
        return (
            f"{row['ts'].isoformat(timespec='milliseconds')} {wire_text(row['app_id'], MAX_ID_CHARS)} "
            f"MONITORING_GAP (every executor): {wire_text(describe(gap))}"
        )
    detail = f" ({wire_text(row['detail'])})" if row["detail"] else ""
    return (
        f"{row['ts'].isoformat(timespec='milliseconds')} {wire_text(row['app_id'], MAX_ID_CHARS)} "
        f"executor {wire_text(row['executor_id'], MAX_ID_CHARS)} on {wire_text(row['host'], MAX_ID_CHARS)}: "
        f"{wire_text(row['event'], MAX_ID_CHARS)}{detail}"
    )
