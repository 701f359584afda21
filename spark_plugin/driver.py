"""``python -m spark_plugin.driver``: the driver-side process, started by the JVM DriverPlugin.

Start-up happens here, in one place and in order (Flink's ``ClusterEntrypoint.initializeServices``):
settings from the JVM, validated config, heartbeat services, the ResourceManager's gRPC server,
then the ready line with its address. Shutdown runs in reverse when the JVM goes away.
"""

from __future__ import annotations

import logging
import os
import sys

from spark_plugin.config import ArrowBeatConfig, ConfigError, load
from spark_plugin.sidecar import JvmLink, announce_ready, setup_logging, wait_for_exit

log = logging.getLogger("arrowbeat.driver")


def _rm_host(config: ArrowBeatConfig, settings: dict[str, str]) -> str:
    return config.rm_host or settings.get("spark.driver.host") or "127.0.0.1"


def main() -> int:
    link = JvmLink(sys.stdin.buffer)
    settings = link.read_settings()
    setup_logging(settings.get("spark.arrowbeat.log.level", "info"))
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

    from heartbeat import HeartbeatServices, ResourceManagerServer

    services = HeartbeatServices(
        interval_s=config.heartbeat_interval_s,
        timeout_s=config.heartbeat_timeout_s,
        rpc_failure_threshold=config.rpc_failure_threshold,
    )
    rm = ResourceManagerServer(services, secret=config.secret, host=_rm_host(config, settings),
                               port=config.rm_port)
    address = rm.start()
    rm.subscribe(lambda event: log.info("%s", event))
    link.start()
    announce_ready(address=address, pid=os.getpid(), epoch=rm.epoch,
                   pulse_ms=int(config.heartbeat_interval_s * 1000))
    log.info("ResourceManager for %s serving on %s", settings.get("spark.app.id", "?"), address)
    reason = wait_for_exit(link)
    log.info("stopping (%s)", reason)
    rm.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
