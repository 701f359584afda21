"""A ``ResourceManagerServer`` alone in a process, for tests that SIGKILL the RM and restart it.

``ARROWBEAT_SECRET=... python -m harness.rm_process --port P --interval S --timeout S``
prints ``READY <host:port> <epoch> <started_at>`` once it serves, then one line per event:
``EVENT <kind> <executor_id> <instance_id> <ts> <host> <detail...>`` and
``HEARTBEAT <executor_id> <instance_id> <ts> <rtt_ms>``. Times are wall-clock epoch seconds, so
a test on the same machine can compare them with its own ``time.time()`` (the RM's ``SYSTEM_CLOCK``
reads the same wall clock). Logs to stderr at ``--log-level`` (default WARNING). Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from arrowbeat_base.clock import SYSTEM_CLOCK
from heartbeat import ExecutorEvent, HeartbeatRecord, HeartbeatServices, ResourceManagerServer
from heartbeat.agent.main import SECRET_ENV
from heartbeat.phi_accrual import PhiSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--interval", type=float, required=True, help="heartbeat interval, s")
    parser.add_argument("--timeout", type=float, required=True, help="heartbeat timeout, s")
    parser.add_argument("--rpc-failure-threshold", type=int, default=2)
    parser.add_argument("--phi-threshold", type=float, default=None, help="the phi detector's; none: off")
    parser.add_argument("--phi-pause", type=float, default=0.2, help="its acceptable pause, s")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    phi = None
    if args.phi_threshold is not None:
        phi = PhiSettings.for_interval(args.interval, args.phi_threshold, args.phi_pause)
    services = HeartbeatServices(args.interval, args.timeout, args.rpc_failure_threshold, phi)
    rm = ResourceManagerServer(services, secret=os.environ[SECRET_ENV], port=args.port)
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            print(line, flush=True)

    def report(event: ExecutorEvent | HeartbeatRecord) -> None:
        if isinstance(event, ExecutorEvent):
            say(
                f"EVENT {event.kind.value} {event.executor_id} {event.instance_id} {event.ts!r} "
                f"{event.host} {event.detail}"
            )
        else:
            say(f"HEARTBEAT {event.executor_id} {event.instance_id} {event.ts!r} {event.rtt_ms!r}")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    rm.subscribe(report)
    address = rm.start()
    say(f"READY {address} {rm.epoch} {SYSTEM_CLOCK.time()!r}")
    stop.wait()
    rm.stop(grace_s=0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
