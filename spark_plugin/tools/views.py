"""What several operators' tools show the same way, so a value reads alike everywhere.

:func:`executor_rows` is the RM's live view of its executors as rows (``arrowbeat executors``:
the table and ``--json``; the live page's JSON), :func:`size_text` a byte count (the report,
``arrowbeat tables``). Imported by the tools' command modules, never the other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from heartbeat import one_line
from spark_plugin.history.reader import id_order

if TYPE_CHECKING:
    from heartbeat.executor_info import ExecutorInfo


def executor_rows(executors: Sequence[ExecutorInfo], now: float) -> list[dict[str, Any]]:
    """One dict per executor: the columns of ``arrowbeat executors`` (its table and ``--json``) and
    of the live page's executors."""
    rows = []
    for e in sorted(executors, key=lambda e: id_order(e.executor_id)):
        p = e.payload
        metrics = p.metrics if p is not None else {}
        segments = metrics.get("shuffle_pool_segments")
        available = metrics.get("shuffle_pool_available")
        pool = None if not segments or available is None else 100.0 * (segments - available) / segments
        rows.append(
            {
                "executor_id": one_line(e.executor_id, 64),
                "host": one_line(e.host, 64),
                "state": one_line(e.state, 32),
                "heartbeat_age_s": None
                if not e.last_heartbeat
                else round(max(0.0, now - e.last_heartbeat), 3),
                "rtt_ms": e.last_rtt_ms,
                "slots_busy": p.slots_busy if p else None,
                "slots_total": p.slots_total if p else None,
                "running_tasks": p.running_tasks if p else None,
                "rss_bytes": p.rss_bytes if p else None,
                "jvm_pulse_age_ms": p.jvm_pulse_age_ms if p else None,
                "shuffle_pool_used_pct": None if pool is None else round(pool, 1),
                "pid": e.pid or None,
                "up_s": round(max(0.0, now - e.registered_at), 1) if e.registered_at else None,
                "instance_id": one_line(e.instance_id, 64),
            }
        )
    return rows


def size_text(n: float) -> str:
    """Bytes as B / KiB / MiB / GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


__all__ = ["executor_rows", "size_text"]
