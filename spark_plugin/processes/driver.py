"""``python -m spark_plugin.processes.driver``: the driver-side process, started by the JVM DriverPlugin.

Start-up happens here, in one place and in order (Flink's ``ClusterEntrypoint.initializeServices``):
settings from the JVM, validated config, history tables, heartbeat services, the ResourceManager's
gRPC server, Spark's own view of its executors (``spark_view``, lines from the JVM's listener),
then the ready line with its address. Shutdown runs in reverse when the JVM goes away.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.hard_exit import exit_now
from heartbeat.scheduler import Cancellable, Scheduler, ThreadScheduler
from spark_plugin.compat import versions
from spark_plugin.errors import JvmCommandError
from spark_plugin.history.gaps import GapBook, carried_gap, describe, gap_detail
from spark_plugin.history.recovery import Recovered
from spark_plugin.history.wire_text import MAX_ID_CHARS, wire_text
from spark_plugin.jvm.plugin_metrics import LivenessTally, MetricsReporter, driver_figures
from spark_plugin.jvm.sidecar import (
    JvmChannel,
    JvmLink,
    PulseAnswers,
    secret_values,
    setup_logging,
    unavailable_internals,
    wait_for_exit,
)
from spark_plugin.monitoring.driver_degraded import DegradedWatch, Exclusions, still_degraded
from spark_plugin.monitoring.driver_notices import NoticeEvents
from spark_plugin.monitoring.driver_tasks import TaskEvents
from spark_plugin.settings import extras
from spark_plugin.settings.config import ArrowBeatConfig, ConfigError, early_value, load

if TYPE_CHECKING:
    from heartbeat import ExecutorEvent

log = logging.getLogger("arrowbeat.driver")
SPARK_VERSION_SETTING = "arrowbeat.spark.version"
"""The running Spark's version, which the JVM's driver plugin adds to the settings it hands over."""
START_FAILED = 1
"""Exit status when the RM could not start (its port taken, say): unlike a refused setting
(``protocol.NOT_STARTED``), the JVM starts the process again, rate-limited as restarts are."""
RESTART_ANY_PORT = "arrowbeat.rm.restart.anyPort"
"""Set by the JVM for a restart (``RmSupervisor.RESTART_ANY_PORT``): if the RM's port is
taken, serve on another rather than fail every restart."""


def rm_host(config: ArrowBeatConfig, settings: dict[str, str]) -> str:
    return config.rm_host or settings.get("spark.driver.host") or "127.0.0.1"


def register_within_s(config: ArrowBeatConfig) -> float:
    """How long after Spark added an executor its agent may take to register before the executor
    is reported UNMONITORED: the JVM waits up to the startup timeout for the agent's ready line,
    and a started agent registers within a heartbeat timeout."""
    return config.startup_timeout_s + config.heartbeat_timeout_s


def dynamic_allocation(settings: dict[str, str]) -> bool:
    """Spark's ``spark.dynamicAllocation.enabled``, which the DriverPlugin hands over: with it, an
    executor the driver killed was released as idle."""
    return settings.get("spark.dynamicAllocation.enabled", "").strip().lower() == "true"


DERIVED_KINDS = frozenset({"TASK_STUCK", "TASK_RESUMED", "SHUFFLE_CORRUPT", "DEGRADED", "RECOVERED"})
"""Events the router itself makes from heartbeats (the RM's bus never carries them): the live
page's view gets them through :meth:`EventRouter.watch_derived`, the bus's own from the bus."""


_GONE = frozenset({"UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"})
"""The executor left for good: what is judged of it (``DegradedWatch``) goes with it."""


class EventRouter:
    """The RM's subscriber: history rows, a log line per lifecycle event, the optional kill.

    Every text of an event came from the wire (the agent chose its id, host and unregister
    reason): it is logged only through :func:`wire_text`, and the history rows pass it too. A
    kill goes to the JVM only for an id of Spark's form (``JvmChannel.lost_executor``: the kill, then
    Spark's scheduler told the executor is lost, so its running tasks are resubmitted at once). Heartbeats
    also pass ``task_events.TaskEvents``: stuck and resumed tasks, explained re-registrations
    (held until the next heartbeat), GC time per interval; ``driver_notices.NoticeEvents``:
    the agents' notices (a damaged map output: ``SHUFFLE_CORRUPT``), each recorded once; and
    ``driver_degraded.DegradedWatch``: an executor consistently slower than its peers
    (``DEGRADED``, then ``RECOVERED``), which ``exclusions`` (``onDegraded=exclude``) has replaced.

    ``kill_after_s`` (the full ``heartbeat.timeout`` under ``heartbeat.detector=phi``): a silence
    the phi detector reports early is acted on here only once it has lasted that long and the
    executor has not registered again meanwhile. A frozen JVM is ended at once on its own host
    (the RM's ``kill_host``: its agent checks the JVM is stopped), and Spark sees it die; what an
    early suspicion must not do is have the driver kill an executor whose agent merely stalled."""

    def __init__(
        self,
        app_id: Callable[[], str],
        history: Any,
        kill: Callable[[str], None] | None = None,
        tasks: TaskEvents | None = None,
        clock: Clock = SYSTEM_CLOCK,
        notices: NoticeEvents | None = None,
        degraded: DegradedWatch | None = None,
        exclusions: Exclusions | None = None,
        kill_after_s: float = 0.0,
        scheduler: Scheduler | None = None,
    ) -> None:
        self._app_id = app_id
        self._kill_after_s = kill_after_s if scheduler is not None else 0.0
        self._scheduler = scheduler
        self._pending_kills: dict[str, Cancellable] = {}
        self._pending_lock = threading.Lock()
        self._history = history
        self._kill = kill
        self._tasks = tasks or TaskEvents()
        self._notices = notices or NoticeEvents()
        self._degraded = degraded
        self._exclusions = exclusions
        self._considered = float("-inf")
        self._clock = clock
        self._last_beat: dict[str, float] = {}
        self._watchers: list[Callable[[ExecutorEvent], None]] = []

    def watch_derived(self, watcher: Callable[[ExecutorEvent], None]) -> None:
        """``watcher`` also gets each event of :data:`DERIVED_KINDS` recorded from now on (on the
        RM's event thread, like a bus subscriber)."""
        self._watchers = [*self._watchers, watcher]

    def __call__(self, event: object) -> None:
        from heartbeat import ExecutorEvent, HeartbeatRecord
        from spark_plugin.history import HEARTBEATS, heartbeat_row

        if isinstance(event, HeartbeatRecord):
            previous = self._last_beat.get(event.executor_id)
            self._last_beat[event.executor_id] = event.ts
            gap_ms = None if previous is None else (event.ts - previous) * 1000.0
            derived, gc_s = self._tasks.on_heartbeat(event, self._clock.monotonic())
            derived += self._notices.on_heartbeat(event)
            if self._degraded is not None:
                derived += self._degraded.on_heartbeat(event)
            if self._history is not None:
                gc_ms = None if gc_s is None else gc_s * 1000.0
                self._history.append(HEARTBEATS.name, heartbeat_row(self._app_id(), event, gap_ms, gc_ms))
            for one in derived:
                self._record(one)
            now = self._clock.monotonic()
            if self._exclusions is not None and self._degraded is not None and now - self._considered >= 1.0:
                self._considered = now  # once a second: a scan of every executor's state
                self._exclusions.consider(self._degraded.excludable(), self._degraded.healthy())
            return
        if isinstance(event, ExecutorEvent):
            if event.kind.name in ("REGISTERED", "REREGISTERED") or event.kind.name in _GONE:
                self._cancel_kill(event.executor_id)  # back (the silence was not the JVM's), or gone
            for one in self._tasks.on_event(event, self._clock.monotonic()):
                self._record(one)
            if not self._tasks.tracks(event.executor_id):  # gone: executor churn must not grow it
                self._last_beat.pop(event.executor_id, None)
            if event.kind.name in ("HEARTBEAT_TIMEOUT", "UNREACHABLE") and self._degraded is not None:
                self._degraded.forget(event.executor_id)  # silent: neither a peer nor healthy now
            if event.kind.name in _GONE:
                if self._degraded is not None:
                    self._degraded.forget(event.executor_id)
                if self._exclusions is not None:
                    self._exclusions.forget(event.executor_id)

    def close(self) -> None:
        """Records what is still held (a re-registration waiting for its heartbeat) and drops the
        kills still deferred (the application is ending): call before the history writer stops."""
        with self._pending_lock:
            pending, self._pending_kills = list(self._pending_kills.values()), {}
        for kill in pending:
            kill.cancel()
        for one in self._tasks.close():
            self._record(one)

    def _record(self, event: ExecutorEvent) -> None:
        from heartbeat import EventKind
        from spark_plugin.history import EXECUTOR_EVENTS, event_row

        log.log(
            logging.WARNING
            if event.kind in (EventKind.SHUFFLE_CORRUPT, EventKind.DEGRADED)
            else logging.INFO,
            "executor %s (%s, instance %s): %s %s",
            wire_text(event.executor_id, MAX_ID_CHARS),
            wire_text(event.host, MAX_ID_CHARS),
            wire_text(event.instance_id, MAX_ID_CHARS),
            event.kind.name,
            wire_text(event.detail),
        )
        if self._history is not None:
            self._history.append(EXECUTOR_EVENTS.name, event_row(self._app_id(), event))
        if event.kind.name in DERIVED_KINDS:
            for watcher in self._watchers:
                try:
                    watcher(event)
                except Exception:  # a view must not stop the history (as on the bus)
                    log.exception("derived-event watcher %r raised; it stays", watcher)
        if self._kill is not None and event.kind in (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE):
            self._act(event.executor_id)  # a silence the RM's own stall explains is no timeout

    def _act(self, executor_id: str) -> None:
        """The kill now, or (``kill_after_s``) once the silence lasted the full timeout."""
        if self._kill_after_s <= 0 or self._scheduler is None:
            self._kill_now(executor_id)
            return
        with self._pending_lock:
            if executor_id in self._pending_kills:
                return
            self._pending_kills[executor_id] = self._scheduler.schedule(
                self._kill_after_s, lambda: self._kill_if_pending(executor_id)
            )

    def _kill_if_pending(self, executor_id: str) -> None:
        with self._pending_lock:
            pending = self._pending_kills.pop(executor_id, None)
        if pending is not None:
            self._kill_now(executor_id)

    def _cancel_kill(self, executor_id: str) -> None:
        with self._pending_lock:
            pending = self._pending_kills.pop(executor_id, None)
        if pending is not None:
            pending.cancel()
            log.info("executor %s is back: not asking Spark to kill it", wire_text(executor_id, MAX_ID_CHARS))

    def _kill_now(self, executor_id: str) -> None:
        assert self._kill is not None
        try:
            self._kill(executor_id)
        except JvmCommandError as exc:  # one per lost executor: bounded by registrations
            log.warning("not asking Spark to kill executor: %s", exc)


def exclude_action(settings: dict[str, str], channel: JvmChannel) -> Callable[[str], None]:
    """``onDegraded=exclude``'s request to the JVM: decommission where Spark's decommissioning is on
    (the DriverPlugin hands ``spark.decommission.enabled`` over; its shuffle and cached blocks can
    move), else kill and replace (both checked internals; the JVM falls back to the kill)."""
    if settings.get("spark.decommission.enabled", "").strip().lower() == "true":
        return channel.decommission_executor
    return channel.kill_executor


def record_gap(book: GapBook, history: Any, app_id: str, host: str, epoch: str) -> None:
    """A restarted RM's first record: the gap its predecessor left (``history.gaps``), logged, and
    a ``MONITORING_GAP`` row (whose commit the book waits for before it stops passing the gap on)."""
    from heartbeat import EventKind, ExecutorEvent
    from spark_plugin.history import EXECUTOR_EVENTS, event_row

    gap = book.gap()
    if gap is None:
        return
    log.warning("arrowbeat's ResourceManager was restarted: %s", describe(gap))
    if history is not None:
        event = ExecutorEvent(
            EventKind.MONITORING_GAP,
            "",
            host,
            epoch,
            gap.end if gap.start is None else gap.start,
            gap_detail(gap),
        )
        history.append(EXECUTOR_EVENTS.name, event_row(app_id, event))
    book.recorded()


def open_history(config: ArrowBeatConfig, settings: dict[str, str]) -> tuple[Any, Recovered]:
    """The history writer and what this application's history holds already (a restart's);
    on a bad path, None and nothing."""
    from spark_plugin.history import HistoryTableError, HistoryWriter, recover, tables_location

    root = tables_location(config, settings)  # str(root): the Spark-side URI, no credentials
    writer = HistoryWriter(
        root, config.tables_flush_interval_s, config.tables_compact_interval_s, config.tables_retention_s
    )
    try:
        writer.open()
        recovered = recover(root, settings.get("spark.app.id", ""))
    except HistoryTableError as exc:
        log.error("history tables off, heartbeats continue in memory only: %s", exc)
        return None, Recovered([], [])
    writer.start()
    known = [e.executor_id for e in recovered.known]
    log.info("history tables at %s%s", root, f"; recovered executors {known}" if known else "")
    return writer, recovered


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

    from heartbeat import HeartbeatError, ResourceManagerServer
    from spark_plugin.settings import tls

    try:  # generated here at the first start; a restart gets the same one back from the JVM
        material = tls.from_config(config, may_generate=True)
    except ConfigError as exc:
        for problem in exc.problems:
            log.error("bad arrowbeat TLS setting: %s", problem)
        log.error("arrowbeat stays off for this application; the application runs on")
        return 2
    history, recovered = open_history(config, settings)
    rm = ResourceManagerServer(
        config.heartbeat_services(),
        secret=config.secret,
        host=rm_host(config, settings),
        port=config.rm_port,
        known_executors=[e.executor_id for e in recovered.known],
        server_credentials=None if material is None else tls.grpc_server_credentials(material),
        # A restart whose port was taken meanwhile serves on another; agents ask their JVMs for it.
        any_port_if_taken=settings.get(RESTART_ANY_PORT) == "true",
        # onHeartbeatTimeout=kill: on a timeout it trusts, the RM tells the agent it may SIGKILL
        # its executor JVM if that is frozen (the agent checks: monitoring.executor_frozen_jvm).
        kill_frozen_hosts=config.on_heartbeat_timeout == "kill",
    )
    app_id = settings.get("spark.app.id", "")
    no_kill = unavailable_internals(settings).get("kill-and-replace-executor")
    if config.on_heartbeat_timeout == "kill" and no_kill:
        log.warning("arrowbeat: spark.arrowbeat.onHeartbeatTimeout=kill is off on this Spark: %s", no_kill)
    if config.on_degraded == "exclude" and no_kill:
        log.warning("arrowbeat: spark.arrowbeat.onDegraded=exclude only reports on this Spark: %s", no_kill)
    spark_support = versions.spark_support(settings.get(SPARK_VERSION_SETTING, ""))
    for problem in [spark_support.message or "", *versions.library_problems()]:
        if problem:
            log.warning("arrowbeat: %s", problem)
    tasks = TaskEvents(
        kill_task=channel.kill_task if config.on_stuck_task == "kill" else None,
        # A heartbeat follows a registration within an interval, or a few under heavy load.
        hold_s=max(5.0, 5 * config.heartbeat_interval_s),
    )
    for executor_id, stuck in recovered.stuck.items():  # a restart: what its predecessor reported
        tasks.adopt_stuck(executor_id, [(t.task_id, t.label) for t in stuck])
    notices = NoticeEvents()
    notices.adopt(recovered.corrupt)  # agents may still carry what the predecessor recorded
    degraded = DegradedWatch(config.heartbeat_interval_s)
    degraded.adopt(still_degraded(recovered.events))  # a restart: RECOVERED, never DEGRADED twice
    # phi's early suspicions: the driver's kill waits for the full timeout, on a timer thread of its own
    deferred_kills = (
        ThreadScheduler("arrowbeat-deferred-kills") if config.heartbeat_detector == "phi" else None
    )
    router = EventRouter(
        lambda: link.app_id(app_id),
        history,
        kill=channel.lost_executor if config.on_heartbeat_timeout == "kill" and not no_kill else None,
        tasks=tasks,
        notices=notices,
        degraded=degraded,
        exclusions=Exclusions(exclude_action(settings, channel))
        if config.on_degraded == "exclude" and not no_kill
        else None,
        kill_after_s=config.heartbeat_timeout_s if config.heartbeat_detector == "phi" else 0.0,
        scheduler=deferred_kills,
    )
    rm.subscribe(router)
    tally = LivenessTally()
    tally.replay(recovered.events)  # before the RM starts: no event of ours can come first
    rm.subscribe(tally)
    router.watch_derived(tally)  # SHUFFLE_CORRUPT is the router's, not the bus's: counted from there
    try:
        address = rm.start()
    except HeartbeatError as exc:  # e.g. a pinned spark.arrowbeat.rm.port taken: the JVM retries
        log.error("arrowbeat's ResourceManager did not start: %s", exc)
        if deferred_kills is not None:
            deferred_kills.shutdown()
        if history is not None:
            history.stop()
        return START_FAILED
    book = GapBook(
        SYSTEM_CLOCK,
        carried_gap(settings),
        None if history is None else history.complete_until,
        (lambda: 0) if history is None else history.unsaved_rows,
    )
    record_gap(book, history, link.app_id(app_id), rm_host(config, settings), rm.epoch)
    page = None
    no_live_page = extras.missing("live") if config.ui_enabled else None
    if no_live_page:
        log.warning("arrowbeat: %s; monitoring runs on without it", no_live_page)
    elif config.ui_enabled:  # the live page: its own thread and loop, its URL logged (live_page)
        from spark_plugin.tools.live_page import start_live_page

        page = start_live_page(
            config.secret,
            rm.executors,
            rm.subscribe,
            host=rm_host(config, settings),
            port=config.ui_port,
            interval_s=config.heartbeat_interval_s,
            timeout_s=config.heartbeat_timeout_s,
            app_id=lambda: link.app_id(app_id),
            rm_address=address,
            ssl_context=None if material is None else tls.server_context(material),  # HTTPS with TLS on
        )
        if page is not None:  # stuck tasks and damaged outputs are the router's, not the bus's
            router.watch_derived(page.view)
    from spark_plugin.monitoring.driver_lost_outputs import LostOutputs
    from spark_plugin.monitoring.driver_spark_view import SparkView

    lost_outputs = LostOutputs(channel.kill_executor)  # executors whose map outputs are gone
    link.on_executor_lines(
        SparkView(rm, register_within_s(config), dynamic_allocation(settings), lost_outputs)
    )
    link.on_pulse(PulseAnswers(rm.when_serving, book.answer, channel.alive))
    link.start()
    channel.announce_ready(
        address=address,
        pid=os.getpid(),
        epoch=rm.epoch,
        pulse_ms=int(config.heartbeat_interval_s * 1000),
        # The JVM's supervisor (Supervision.java): when this process is hung, how often to restart.
        hang_ms=round(config.rm_hang_bound_s() * 1000),
        restart_max=config.rm_restarts_max,
        restart_window_ms=round(config.rm_restarts_window_s * 1000),
        restart_backoff_ms=round(config.rm_restart_backoff_max_s * 1000),
        **({} if material is None else tls.ready_fields(material)),  # the JVM hands them on
        **({} if page is None else {"ui_url": page.url}),  # no token: the SparkConf shows it
    )
    log.info("ResourceManager serving on %s%s", address, "" if material is None else f" (TLS, {material})")
    metrics = MetricsReporter(
        lambda: driver_figures(
            rm.executors(), tally, None if history is None else history.stats(), SYSTEM_CLOCK.time()
        ),
        lambda snapshot, figures: channel.metrics(snapshot, figures, "driver"),
        config.heartbeat_interval_s,
    )
    metrics.start()  # the gauges of Spark's metrics system (plugin_metrics)
    reason = wait_for_exit(link)
    log.info("stopping (%s)", reason)
    metrics.stop()
    if page is not None:
        page.stop()
    rm.stop()
    router.close()  # after the RM's last event, before the history's last commit
    if deferred_kills is not None:
        deferred_kills.shutdown()
    if history is not None:
        history.stop()
    return 0


if __name__ == "__main__":
    exit_now(main())  # the JVM-stdin reader thread would trip finalisation
