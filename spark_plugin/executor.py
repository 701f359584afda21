"""``python -m spark_plugin.executor``: the agent on one executor, started by the JVM ExecutorPlugin.

It registers with the driver-side ResourceManager and answers its heartbeat requests with a
payload describing the executor. It answers only while the executor JVM keeps pulsing: a frozen
JVM must look dead to the ResourceManager even though this process still runs.
"""

from __future__ import annotations

import logging
import os
import sys

import psutil

from heartbeat import HeartbeatServices, PayloadProvider, TaskExecutorAgent, rss_provider, slots_provider
from spark_plugin.config import ConfigError, load
from spark_plugin.sidecar import JvmLink, announce_ready, exit_process, setup_logging, wait_for_exit

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
    link = JvmLink(sys.stdin.buffer)
    settings = link.read_settings()
    setup_logging(settings.get("spark.arrowbeat.log.level", "info"))
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

    services = HeartbeatServices(
        interval_s=config.heartbeat_interval_s,
        timeout_s=config.heartbeat_timeout_s,
        rpc_failure_threshold=config.rpc_failure_threshold,
    )
    payload = executor_payload(
        link,
        slots_total=int(settings.get("arrowbeat.executor.cores", "1") or 1),
        jvm_pid=int(settings.get("arrowbeat.executor.jvm.pid", "0") or 0),
    )
    agent = TaskExecutorAgent(
        config.rm_address,
        config.secret,
        executor_id=executor_id,
        host=host,
        services=services,
        payload_providers=payload,
        # Pulses come every interval/2: one interval without one means the JVM is frozen, and the
        # agent stops answering so the RM's timeout reports it (after interval + timeout at most).
        is_healthy=lambda: link.pulse_age_s() < config.heartbeat_interval_s,
    )
    link.start()
    agent.start()
    announce_ready(
        pid=os.getpid(),
        executor_id=executor_id,
        rm=config.rm_address,
        pulse_ms=max(50, int(config.heartbeat_interval_s * 1000 / 2)),
    )
    reason = wait_for_exit(link)
    log.info("agent for executor %s stopping (%s)", executor_id, reason)
    agent.stop()
    return 0


if __name__ == "__main__":
    exit_process(main())
