"""``python -m spark_plugin.processes.executor``: the agent on one executor, started by its JVM plugin.

It registers with the driver-side ResourceManager and answers its heartbeat requests with a
payload describing the executor. It answers only while the executor JVM keeps pulsing: a frozen
JVM must look dead to the ResourceManager even though this process still runs. It registers
again, with capped backoff and no deadline, whenever the RM is gone; if the agent ends anyway
(a newer agent took its executor id, an unexpected failure) this process exits with status
:data:`AGENT_ENDED`, its last log line the cause, and the JVM restarts it. It answers each of the
JVM's pulses from the loop that serves its heartbeats (:func:`answer_pulses`): an agent alive but
wedged stops answering, and the JVM kills it after the hang bound it announced and restarts it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import psutil

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ShuffleError
from arrow_shuffle.transport import TcpTransport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.hard_exit import exit_now
from arrowbeat_base.rate_log import RateLog
from heartbeat import AgentThread, NoticeBoard, PayloadProvider, one_line, rss_provider, slots_provider
from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm.plugin_metrics import MetricsReporter, executor_figures
from spark_plugin.jvm.sidecar import (
    JvmChannel,
    JvmLink,
    PulseAnswers,
    secret_values,
    setup_logging,
    wait_for_exit,
)
from spark_plugin.monitoring.executor_pace import JvmPace
from spark_plugin.monitoring.executor_tasks import TaskWatch
from spark_plugin.monitoring.executor_workers import labelled_workers
from spark_plugin.settings import tls
from spark_plugin.settings.config import ArrowBeatConfig, ConfigError, early_value, load
from spark_plugin.shuffle.agent.disk_usage import DiskUsage
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import shuffle_roots

log = logging.getLogger("arrowbeat.agent")


def executor_payload(link: JvmLink, slots_total: int, jvm_pid: int) -> list[PayloadProvider]:
    """Slots and running tasks (from the JVM's pulses), the JVM's RSS, and the pulse age."""
    providers = [slots_provider(slots_total, busy=link.running_tasks)]
    try:
        providers.append(rss_provider(jvm_pid if jvm_pid > 0 else None))
    except psutil.Error:
        log.warning("cannot watch executor JVM pid %s; rss_bytes stays unknown", jvm_pid)
    providers.append(lambda: {"jvm_pulse_age_ms": int(link.pulse_age_s() * 1000)})
    return providers


def main() -> int:
    channel = JvmChannel.claim_stdout()  # first: nothing but the protocol reaches the JVM's stdout
    link = JvmLink(sys.stdin.buffer)
    settings = link.read_settings()
    setup_logging(early_value(settings, "spark.arrowbeat.log.level"), secret_values(settings))
    try:
        config = load(settings)
    except ConfigError as exc:
        log.error("arrowbeat agent not started: %s", exc)
        return 2
    executor_id = settings.get("arrowbeat.executor.id", "")
    host = settings.get("arrowbeat.executor.host", "") or "127.0.0.1"
    if not executor_id or not config.rm_address or not config.secret:
        log.error(
            "arrowbeat agent not started: the launcher handed over no executor id, RM address or secret"
        )
        return 2

    try:  # the driver's generated certificate, or the configured files of this host
        material = tls.from_config(config)
    except ConfigError as exc:
        log.error("arrowbeat agent not started: %s", exc)
        return 2
    payload = executor_payload(
        link,
        slots_total=int(settings.get("arrowbeat.executor.cores", "1") or 1),
        jvm_pid=int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0),
    )
    agent = AgentThread(
        config.rm_address,
        config.secret,
        executor_id=executor_id,
        host=host,
        services=config.heartbeat_services(),
        payload_providers=payload,
        is_healthy=jvm_alive(config, settings, link),
        retry_policy=config.registration_policy(),  # no deadline: it tries while the executor lives
        channel_credentials=None if material is None else tls.grpc_channel_credentials(material),
        channel_options=() if material is None else tls.grpc_channel_options(material),
        on_rm_unreachable=rm_unreachable_reporter(channel.rm_unreachable),
        on_kill_host=frozen_jvm_killer(settings, link, config.heartbeat_interval_s),
    )
    link.on_rm_address(agent.set_rm_address)  # a restarted RM on another port (the JVM tells us)
    # The JVM's line interval (pulses); task CPU from the task watch (JVM thread and Python worker)
    # while it scans the workers (a stuck-task timeout is set), else from the lines (JVM thread).
    pace = JvmPace(
        max(0.05, config.heartbeat_interval_s / 2), task_cpu_from_lines=config.stuck_task_timeout_s <= 0
    )
    tasks = task_watch(config, settings, link, channel, pace)
    payload += [tasks.work, tasks.metrics, pace.metrics]  # pace: the driver's peer comparison
    transport = None if material is None else TcpTransport(server_context=tls.server_context(material))
    notices = NoticeBoard()  # findings carried to the driver in the payloads, recorded as events there

    def on_corrupt(detail: str) -> None:  # a damaged map output of ours: a SHUFFLE_CORRUPT event
        notices.add("SHUFFLE_CORRUPT", detail)

    shuffle = LazyShuffleService(
        config,
        settings,
        executor_id,
        host,
        transport,
        _reporter(channel),
        on_corrupt=on_corrupt,
    )
    payload += [shuffle.metrics, notices]
    answer_pulses(link, agent, channel)
    link.start()
    shuffle.start_when_app_known(link)  # before registering: a registered agent serves shuffles
    agent.start()
    agent.on_ended(link.gone.set)  # an agent that gave up ends this process too (below)
    channel.announce_ready(
        pid=os.getpid(),
        executor_id=executor_id,
        rm=config.rm_address,
        pulse_ms=max(50, int(config.heartbeat_interval_s * 1000 / 2)),
        # The JVM's hang check (Supervision.java): unanswered this long, it kills and restarts us.
        hang_ms=round(config.agent_hang_bound_s() * 1000),
    )
    metrics = MetricsReporter(
        lambda: executor_figures(shuffle.metrics()),
        lambda snapshot, figures: channel.metrics(snapshot, figures, "executor"),
        config.heartbeat_interval_s,
    )
    metrics.start()  # the agent's shuffle figures as Spark metrics (plugin_metrics)
    reason = wait_for_exit(link)
    if agent.ended:  # it gave up while the JVM runs: end loudly, the JVM restarts us
        metrics.stop()
        shuffle.close()
        log.error(
            "arrowbeat agent of executor %s exits with status %d: %s",
            executor_id,
            AGENT_ENDED,
            agent_end_cause(agent.error),
        )  # the last line: the JVM reports it to the driver as the cause
        return AGENT_ENDED
    log.info("agent for executor %s stopping (%s)", executor_id, reason)
    metrics.stop()
    agent.stop(reason=reason)
    shuffle.close()
    return 0


def jvm_alive(config: ArrowBeatConfig, settings: dict[str, str], link: JvmLink) -> Callable[[], bool]:
    """``AgentThread``'s ``is_healthy``: whether the agent answers the RM. Pulses come every half
    interval: one interval without one means the JVM is frozen, and the agent stops answering so
    that the RM reports it. With ``heartbeat.detector=phi`` (which reports a silence within a
    second) a stale pulse silences the agent only if the JVM is stopped, or after
    ``heartbeat.timeout`` (``monitoring.executor_jvm_health``): a GC pause is not a freeze."""
    interval = config.heartbeat_interval_s

    def pulsed() -> bool:
        return link.pulse_age_s() < interval

    def pulsed_within_timeout() -> bool:  # phi without a view of the JVM: the timeout rules
        return link.pulse_age_s() < config.heartbeat_timeout_s

    jvm_pid = int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0)
    if config.heartbeat_detector != "phi":
        return pulsed
    if jvm_pid <= 0:
        log.warning(
            "no executor JVM pid: a frozen JVM is reported after heartbeat.timeout (%g s), not sooner",
            config.heartbeat_timeout_s,
        )
        return pulsed_within_timeout
    from spark_plugin.monitoring.executor_jvm_health import JvmHealth

    try:
        return JvmHealth(jvm_pid, link.pulse_age_s, interval, config.heartbeat_timeout_s).healthy
    except (psutil.Error, ValueError) as exc:
        log.warning(
            "cannot watch executor JVM pid %s (%s): a frozen JVM is reported after heartbeat.timeout "
            "(%g s), not sooner",
            jvm_pid,
            exc,
            config.heartbeat_timeout_s,
        )
        return pulsed_within_timeout


def answer_pulses(link: JvmLink, agent: AgentThread, channel: JvmChannel) -> None:
    """Each JVM pulse is answered (``ARROWBEAT-ALIVE 0 0``: an agent keeps no history) from the
    agent's heartbeat loop, not from the thread that reads the pulse: what must be proved is that
    the agent can still answer the RM. A wedged loop answers nothing and a stopped process
    nothing at all; the JVM then calls the agent hung and restarts it. A frozen JVM sends no
    pulse, so it is never answered: the agent's own silence to the RM (``is_healthy``) is
    unchanged."""
    link.on_pulse(PulseAnswers(agent.when_serving, lambda: (0, 0), channel.alive))


def frozen_jvm_killer(
    settings: dict[str, str], link: JvmLink, stale_s: float
) -> Callable[[str], None] | None:
    """``AgentThread``'s ``on_kill_host``: the RM timed this executor out and its JVM may be ended
    if it is frozen (``monitoring.executor_frozen_jvm`` checks first). None without the JVM's pid."""
    from spark_plugin.monitoring.executor_frozen_jvm import FrozenJvm

    jvm_pid = int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0)
    if jvm_pid <= 0:
        return None
    try:
        return FrozenJvm(jvm_pid, link.pulse_age_s, stale_s).on_kill_host
    except psutil.Error:
        log.warning("cannot watch executor JVM pid %s; a frozen JVM is left to Spark's kill", jvm_pid)
        return None


ASK_RM_EVERY_S = 1.0
"""How often at most an agent that cannot reach its RM asks its JVM whether the RM moved (the JVM
asks the driver over Spark's RPC, one ask at a time)."""


def rm_unreachable_reporter(
    tell_jvm: Callable[[str], None], clock: Clock = SYSTEM_CLOCK, every_s: float = ASK_RM_EVERY_S
) -> Callable[[str], None]:
    """``AgentThread``'s ``on_rm_unreachable``: each failed registration attempt, at most one a
    ``every_s``, becomes an ``rm-unreachable <address>`` command to the JVM (``JvmChannel.
    rm_unreachable``), which answers with the RM's new address if it moved."""
    rate = RateLog(None, every_s, clock, max_keys=1)

    def unreachable(address: str) -> None:
        if rate.admit("ask") is None:
            return
        try:
            tell_jvm(address)
        except JvmCommandError as exc:
            log.warning("cannot ask the JVM where the RM is: %s", exc)

    return unreachable


AGENT_ENDED = 3
"""Exit status of an agent process whose agent ended while its JVM runs (it gave up registering,
a newer agent took its executor id, or it failed unexpectedly): the JVM restarts it, rate-limited,
and tells the driver (``ArrowBeatExecutorPlugin``)."""


def agent_end_cause(error: BaseException | None) -> str:
    """One line saying why the agent ended: its error's kind and message."""
    if error is None:
        return "the agent ended without an error"
    return one_line(f"{type(error).__name__}: {error}")


def task_watch(
    config: ArrowBeatConfig,
    settings: dict[str, str],
    link: JvmLink,
    channel: JvmChannel,
    pace: JvmPace | None = None,
) -> TaskWatch:
    """Whether each running task progresses (``task_watch``), fed by the JVM's ``tasks`` lines; the
    same lines feed ``pace`` (how late they come, for the driver's comparison with the peers)."""
    jvm_pid = int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0)
    local_dirs = [d for d in settings.get("arrowbeat.executor.local.dirs", "").split(",") if d]
    watch = TaskWatch(
        timeout_s=config.stuck_task_timeout_s,
        interval_s=max(0.05, config.heartbeat_interval_s / 2),  # the JVM's pulse interval
        workers=labelled_workers(jvm_pid, os.getpid()),
        ask_jvm_stack=channel.jstack,
        local_dir=local_dirs[0] if local_dirs else "",
        on_task_cpu=None if pace is None else pace.add_task_cpu,
    )

    def on_line(line: str) -> None:
        if line.startswith("stack "):
            watch.on_stack_line(line)
        else:
            watch.on_line(line)
            if pace is not None:  # how late the JVM's lines come (monitoring.executor_pace)
                pace.on_line(line)

    link.on_task_lines(on_line)
    return watch


def _reporter(channel: JvmChannel) -> Callable[[str], None]:
    """``outputs-lost`` to the JVM: its ExecutorPlugin asks Spark to replace this executor, so the
    map partitions whose files vanished are recomputed
    (``spark_plugin.shuffle.worker.output_recovery.lost_outputs``)."""

    def report(reason: str) -> None:
        try:
            channel.outputs_lost(reason)
        except JvmCommandError as exc:
            log.error("map outputs lost, but not reported to the JVM: %s", exc)

    return report


APP_ID_WAITS_S = (60.0, 120.0, 300.0, 600.0)
"""How long the shuffle service waits for the application id between two WARNINGs (the last
repeats): it never stops waiting while the agent runs."""
DISK_EVERY_MIN_S = 5.0
"""The shuffle directory is walked for its disk use every heartbeat interval, at most this often."""


class _Assigned(Protocol):
    def wait(self, timeout: float | None = None) -> bool: ...


class LazyShuffleService:
    """The agent's ``MapOutputService``, started once the application id is known: at once on
    cluster executors, after the driver assigned it for the driver's own executor (local mode).
    Its disk figure is walked off the heartbeat loop (``agent_disk_usage``): ``walk`` (tests
    inject one) runs on a thread of its own, and :meth:`metrics` never waits for it."""

    def __init__(
        self,
        config: ArrowBeatConfig,
        settings: dict[str, str],
        executor_id: str,
        host: str,
        transport: TcpTransport | None = None,
        on_outputs_lost: Callable[[str], None] | None = None,
        *,
        walk: Callable[[MapOutputService], int] = MapOutputService.disk_bytes,
        app_id_waits_s: Sequence[float] = APP_ID_WAITS_S,
        on_corrupt: Callable[[str], None] | None = None,
    ) -> None:
        self._args = (config, settings, executor_id, host)
        self._transport = transport
        self._on_outputs_lost = on_outputs_lost
        self._on_corrupt = on_corrupt
        self._walk = walk
        self._waits_s = tuple(app_id_waits_s)
        self._lock = threading.Lock()
        self._service: MapOutputService | None = None
        self._disk: DiskUsage | None = None
        self._closed = False

    def start_when_app_known(self, link: JvmLink) -> None:
        known = self._args[1].get("spark.app.id", "")
        if known:
            self._start(known)
            return
        threading.Thread(
            target=self.wait_then_start,
            args=(link.app_assigned, link.app_id),
            name="shuffle-start",
            daemon=True,
        ).start()

    def wait_then_start(self, assigned: _Assigned, app_id: Callable[[], str]) -> None:
        """Starts the service once ``assigned`` is set, however long that takes: a WARNING after
        each wait of :data:`APP_ID_WAITS_S` (backing off), never a silent end. Gives up only when
        the agent closes."""
        waited = 0.0
        for number in range(1 << 62):
            step = self._waits_s[min(number, len(self._waits_s) - 1)]
            if assigned.wait(timeout=step):
                self._start(app_id())
                return
            with self._lock:
                if self._closed:
                    return
            waited += step
            log.warning(
                "the Arrow shuffle service of executor %s has waited %.0f s for the application id from "
                "its JVM and waits on; until then it serves no map outputs",
                self._args[2],
                waited,
            )

    def _start(self, app_id: str) -> None:
        config, settings, executor_id, host = self._args
        service = start_shuffle_service(
            config,
            {**settings, "spark.app.id": app_id},
            executor_id,
            host,
            self._transport,
            self._on_outputs_lost,
            self._on_corrupt,
        )
        disk = None
        if service is not None:
            walk = self._walk
            disk = DiskUsage(lambda: walk(service), max(DISK_EVERY_MIN_S, config.heartbeat_interval_s))
        with self._lock:
            if self._closed:
                if service is not None:
                    service.close()
                return
            self._service, self._disk = service, disk
        if disk is not None:
            disk.start()

    def metrics(self) -> dict[str, float]:
        """The service's figures with the last walked disk use (left out before the first walk)."""
        with self._lock:
            service, disk = self._service, self._disk
        if service is None:
            return {}
        figures = service.metrics(walk_disk=False)
        total = None if disk is None else disk.bytes()
        if total is not None:
            figures["shuffle_disk_bytes"] = float(total)
        return figures

    def close(self) -> None:
        with self._lock:
            self._closed = True
            service, self._service = self._service, None
            disk, self._disk = self._disk, None
        if disk is not None:
            disk.stop()
        if service is not None:
            service.close()


def agent_shuffle_config(config: ArrowBeatConfig) -> ShuffleConfig:
    """The engine settings of this executor's shuffle agent, from the ``spark.arrowbeat.shuffle.*``
    keys (validated by ``load``; the engine checks the same ranges again)."""
    return ShuffleConfig(
        network_memory_bytes=config.shuffle_agent_memory_bytes,
        buffer_reserve_timeout_s=config.shuffle_buffer_reserve_timeout_s,
        checksum=config.shuffle_checksum,
    )


def start_shuffle_service(
    config: ArrowBeatConfig,
    settings: dict[str, str],
    executor_id: str,
    host: str,
    transport: TcpTransport | None = None,
    on_outputs_lost: Callable[[str], None] | None = None,
    on_corrupt: Callable[[str], None] | None = None,
) -> MapOutputService | None:
    """The Arrow shuffle's map-output directory and server (TLS when ``transport`` has a server
    context); the agent runs on without it on failure. ``on_corrupt(detail)``: a damaged map
    output of this executor was found (a ``SHUFFLE_CORRUPT`` notice for the driver)."""
    try:
        service = MapOutputService(
            app_id=settings.get("spark.app.id", "") or "app",
            executor_id=executor_id,
            secret=config.secret,
            # This executor's own local dirs, as its JVM resolved them (never a driver's path).
            root=shuffle_roots(config.shuffle_dir, settings.get("arrowbeat.executor.local.dirs", "")),
            jvm_pid=int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0),
            host=host,
            config=agent_shuffle_config(config),
            ttl_s=config.shuffle_ttl_s,
            transport=transport,
            on_outputs_lost=on_outputs_lost,
            on_corrupt=on_corrupt,
            port=config.shuffle_port,
            # Spark's own block-manager folders and how Spark names its files there: a damaged map
            # output's status blocks are removed so that Spark reruns that map partition.
            spark_local_dirs=settings.get("arrowbeat.executor.local.dirs", "").split(","),
            spark_settings=settings,
        )
    except (OSError, ShuffleError) as exc:
        log.error("Arrow shuffle service not started on executor %s: %s", executor_id, exc)
        return None
    sweeper = threading.Thread(
        target=_sweep_loop,
        args=(service, min(60.0, config.shuffle_ttl_s / 4)),
        name="shuffle-ttl",
        daemon=True,
    )
    sweeper.start()
    return service


def _sweep_loop(service: MapOutputService, every_s: float) -> None:
    while not service.closed.wait(every_s):
        try:
            service.sweep()
        except OSError as exc:
            log.warning("shuffle TTL sweep failed: %s", exc)


if __name__ == "__main__":
    exit_now(main())  # the JVM-stdin reader thread would trip finalisation
