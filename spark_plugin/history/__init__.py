"""Heartbeat history and executor lifecycle events as Delta tables (see ``tables.py`` for schemas)."""

from spark_plugin.history.recovery import KnownExecutor, known_executors
from spark_plugin.history.tables import (
    EXECUTOR_EVENTS,
    HEARTBEATS,
    TABLES,
    HistoryTableError,
    IncompatibleTableError,
    TablePathError,
)
from spark_plugin.history.writer import HistoryWriter, event_row, heartbeat_row

__all__ = [
    "EXECUTOR_EVENTS",
    "HEARTBEATS",
    "TABLES",
    "HistoryTableError",
    "HistoryWriter",
    "IncompatibleTableError",
    "KnownExecutor",
    "TablePathError",
    "event_row",
    "heartbeat_row",
    "known_executors",
]
