"""Heartbeat history and executor lifecycle events as Delta tables (see ``tables.py`` for schemas).

Text from the wire (ids, hosts, event details) passes ``wire_text`` before it is recorded (and
before the driver-side process logs it).

Reading the tables back (the CLI, the report, the live page) goes through ``reader``.

Layering: this package imports only ``spark_plugin.settings``, ``spark_plugin.errors`` and the
heartbeat library's clock and ``one_line`` of arrowbeat, so the user's driver (the DataFrame API's
shuffle metrics) can use it without loading the plugin's processes."""

from spark_plugin.errors import HistoryTableError, IncompatibleTableError, TablePathError
from spark_plugin.history.recovery import KnownExecutor, Recovered, known_executors, recover
from spark_plugin.history.storage import TablesLocation, locate, tables_location
from spark_plugin.history.tables import EXECUTOR_EVENTS, HEARTBEATS, TABLES
from spark_plugin.history.wire_text import wire_text
from spark_plugin.history.writer import HistoryWriter, event_row, heartbeat_row

__all__ = [
    "EXECUTOR_EVENTS",
    "HEARTBEATS",
    "TABLES",
    "HistoryTableError",
    "HistoryWriter",
    "IncompatibleTableError",
    "KnownExecutor",
    "Recovered",
    "TablePathError",
    "TablesLocation",
    "event_row",
    "heartbeat_row",
    "known_executors",
    "locate",
    "recover",
    "tables_location",
    "wire_text",
]
