"""``python -m spark_plugin.driver``: the driver-side process, started by the JVM DriverPlugin.

Start-up happens here, in one place and in order (Flink's ``ClusterEntrypoint.initializeServices``):
settings from the JVM, validated config, history tables, heartbeat services, the ResourceManager's
gRPC server, then the ready line with its address. Shutdown runs in reverse when the JVM goes away.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from spark_plugin.config import ArrowBeatConfig, ConfigError, early_value, load, tables_root
from spark_plugin.errors import JvmCommandError
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.sidecar import (
    JvmChannel,
    JvmLink,
    exit_process,
    secret_values,
    setup_logging,
    wait_for_exit,
)

log = logging.getLogger("arrowbeat.driver")


def rm_host(config: ArrowBeatConfig, settings: dict[str, str]) -> str:
    return config.rm_host or settings.get("spark.driver.host") or "127.0.0.1"


class EventRouter:
    """The RM's subscriber: history rows, a log line per lifecycle event, the optional kill.

    Every text of an event came from the wire (the agent chose its id, host and unregister
    reason): it is logged only through :func:`wire_text`, and the history rows pass it too. A
    kill goes to the JVM only for an id of Spark's form (``JvmChannel.kill_executor``)."""

    def __init__(
        self, app_id: Callable[[], str], history: Any, kill: Callable[[str], None] | None = None
    ) -> None:
        self._app_id = app_id
        self._history = history
        self._kill = kill
        self._last_beat: dict[str, float] = {}

    def __call__(self, event: object) -> None:
        from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord
        from spark_plugin.history import EXECUTOR_EVENTS, HEARTBEATS, event_row, heartbeat_row

        if isinstance(event, HeartbeatRecord):
            previous = self._last_beat.get(event.executor_id)
            self._last_beat[event.executor_id] = event.ts
            gap_ms = None if previous is None else (event.ts - previous) * 1000.0
            if self._history is not None:
                self._history.append(HEARTBEATS.name, heartbeat_row(self._app_id(), event, gap_ms))
            return
        if not isinstance(event, ExecutorEvent):
            return
        log.info(
            "executor %s (%s, instance %s): %s %s",
            wire_text(event.executor_id, MAX_ID_CHARS),
            wire_text(event.host, MAX_ID_CHARS),
            wire_text(event.instance_id, MAX_ID_CHARS),
            event.kind.name,
            wire_text(event.detail),
        )
        if self._history is not None:
            self._history.append(EXECUTOR_EVENTS.name, event_row(self._app_id(), event))
        if self._kill is not None and event.kind in (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE):
            try:
                self._kill(event.executor_id)
            except JvmCommandError as exc:  # one per lost executor: bounded by registrations
                log.warning("not asking Spark to kill executor: %s", exc)


def open_history(config: ArrowBeatConfig, settings: dict[str, str]) -> tuple[Any, list[str]]:
    """The history writer and the executors this application's history knows; on a bad path, (None, [])."""
    from spark_plugin.history import HistoryTableError, HistoryWriter, known_executors

    root = tables_root(config, settings)
    writer = HistoryWriter(
        root, config.tables_flush_interval_s, config.tables_compact_interval_s, config.tables_retention_s
    )
    try:
        writer.open()
        known = [e.executor_id for e in known_executors(root, settings.get("spark.app.id", ""))]
    except HistoryTableError as exc:
        log.error("history tables off, heartbeats continue in memory only: %s", exc)
        return None, []
    writer.start()
    log.info("history tables at %s%s", root, f"; recovered executors {known}" if known else "")
    return writer, known


def main() -> int:
    channel = JvmChannel.claim_stdout()  # first: nothing but the protocol reaches the JVM's stdout
    link = JvmLink(sys.stdin.buffer)
    settings = link.read_settings()
    setup_logging(early_value(settings, "spark.arrowbeat.log.level"), secret_values(settings))
    try:
        config = load(settings)
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("bad arrowbeat setting: %s", problem)
        log.error("arrowbeat stays off for this application; the application runs on")
        return 2
    if not config.secret:
        log.error("no spark.arrowbeat.authenticate.secret was handed over by the JVM launcher")
        return 2

    from heartbeat import ResourceManagerServer
    from spark_plugin import tls

    try:  # generated here at the first start; a restart gets the same one back from the JVM
        material = tls.from_config(config, may_generate=True)
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("bad arrowbeat TLS setting: %s", problem)
        log.error("arrowbeat stays off for this application; the application runs on")
        return 2
    history, known = open_history(config, settings)
    rm = ResourceManagerServer(
        config.heartbeat_services(),
        secret=config.secret,
        host=rm_host(config, settings),
        port=config.rm_port,
        known_executors=known,
        server_credentials=None if material is None else tls.grpc_server_credentials(material),
    )
    app_id = settings.get("spark.app.id", "")
    rm.subscribe(
        EventRouter(
            lambda: link.app_id(app_id),
            history,
            kill=channel.kill_executor if config.on_heartbeat_timeout == "kill" else None,
        )
    )
    address = rm.start()
    link.start()
    channel.announce_ready(
        address=address,
        pid=os.getpid(),
        epoch=rm.epoch,
        pulse_ms=int(config.heartbeat_interval_s * 1000),
        **({} if material is None else tls.ready_fields(material)),  # the JVM hands them on
    )
    log.info("ResourceManager serving on %s%s", address, "" if material is None else f" (TLS, {material})")
    reason = wait_for_exit(link)
    log.info("stopping (%s)", reason)
    rm.stop()
    if history is not None:
        history.stop()
    return 0


if __name__ == "__main__":
    exit_process(main())
