"""How fast a hung executor is noticed: arrowbeat against Spark's own heartbeat, in one run.

Two spark-submit applications on local-cluster[2,1,1024], both with arrowbeat at its defaults
(interval 1 s, timeout 5 s): one with Spark's defaults (spark.network.timeout 120 s, checked every
spark.network.timeoutInterval 60 s), one with Spark's timeouts lowered (10 s, checked every 1 s).
In each, one executor JVM is frozen with SIGSTOP; arrowbeat's time is its HEARTBEAT_TIMEOUT event,
Spark's is when the executor leaves ``SparkContext.getExecutorIds`` (seen by the driver every 0.1 s).

    .venv/bin/python -m benchmarks.detection_latency

``--part fast`` measures the sub-second mode (issue 37, item 2): ``heartbeat.detector=phi`` at
100 ms heartbeats on local-cluster[2,1,1536], one executor JVM SIGSTOPped ``--trials`` times (a
random phase each time, thawed once the RM's view shows the loss, re-registered before the
next), then a garbage-collection storm on both executors (``--storm`` seconds of back-to-back full
collections of a large live heap, ``GcPause``, serial collector) with ``--hogs`` CPU-bound
processes on the machine's cores. Each freeze's detection is its HEARTBEAT_TIMEOUT's time (the
RM's clock, in the history table) minus the time just before the SIGSTOP; a false timeout is any
HEARTBEAT_TIMEOUT or UNREACHABLE of an executor that was not frozen then. The same run with the
``timeout`` detector at its defaults (1 s / 5 s) is the baseline, and one at 100 ms / 500 ms shows
what a plain sub-second timeout does under the storm. Prints ``RESULT detect_p99_s=`` and
``RESULT false_timeouts=`` for the phi mode, the others' figures beside them, the CPU the RM and
the agents used while idle, and the machine's load. ``--part fast-heartbeat`` runs the phi
detector without Spark: an RM and three agent processes over gRPC on loopback, each agent
SIGSTOPped in turn (``--trials``), then ``--storm`` seconds under ``--hogs`` CPU hogs.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import tempfile
import time
from pathlib import Path

from harness.apps import HOLD_APP
from harness.env import prepare
from harness.heartbeat_processes import AgentProcess, Collector, RmProcess, first_loss
from harness.history_read import rows
from harness.procs import executor_jvms, wait_until
from harness.submit import SubmittedApp
from heartbeat import EventKind, ExecutorEvent, HeartbeatServices

SPARK_LOWERED = {
    "spark.network.timeout": "10s",
    "spark.network.timeoutInterval": "1s",
    "spark.executor.heartbeatInterval": "1s",
}


HEARTBEAT_SERVICES = HeartbeatServices(interval_s=0.2, timeout_s=1.0, rpc_failure_threshold=2)
WAIT_S = 60.0  # the longest any step may take before the run is called failed


def _lost(events: Collector, executor_id: str) -> ExecutorEvent:
    event = first_loss(events, executor_id, WAIT_S)
    if event is None:
        raise SystemExit(f"heartbeat: {executor_id} was never reported lost")
    return event


def measure_heartbeat() -> tuple[float, float, float]:
    """(kill, freeze) detection seconds and re-registration seconds after an RM restart."""
    secret = secrets.token_hex(16)
    services = HEARTBEAT_SERVICES
    started: list[AgentProcess | RmProcess] = []
    try:
        rm = RmProcess(services, secret)
        started.append(rm)
        rm.wait_ready(WAIT_S)
        agents = {
            name: AgentProcess(rm.address, name, services, secret) for name in ("killed", "frozen", "steady")
        }
        started.extend(agents.values())
        for agent in agents.values():
            agent.wait_line("READY", WAIT_S)
        if not rm.events.wait_for(lambda: {r.executor_id for r in rm.events.records} >= set(agents), WAIT_S):
            raise SystemExit("heartbeat: not every agent answered a heartbeat")
        killed_at = agents["killed"].signal(signal.SIGKILL)
        frozen_at = agents["frozen"].signal(signal.SIGSTOP)
        kill_s = _lost(rm.events, "killed").ts - killed_at
        freeze_s = _lost(rm.events, "frozen").ts - frozen_at
        agents["frozen"].signal(signal.SIGCONT)
        rm.events.wait_event(EventKind.REREGISTERED, "frozen", WAIT_S)

        rm.kill()
        restarted = RmProcess(services, secret, int(rm.address.rsplit(":", 1)[1]))
        started.append(restarted)
        restarted.wait_ready(WAIT_S)
        registered = [
            restarted.events.wait_event(EventKind.REGISTERED, n, WAIT_S) for n in ("frozen", "steady")
        ]
        reregister_s = max(0.0, max(e.ts for e in registered) - restarted.started_at)
        print(
            f"heartbeat (interval {services.interval_s:g} s, timeout {services.timeout_s:g} s): "
            f"killed agent lost after {kill_s:.2f}s, frozen after {freeze_s:.2f}s, "
            f"all registered with a restarted RM after {reregister_s:.2f}s",
            flush=True,
        )
        return kill_s, freeze_s, reregister_s
    finally:
        for child in started:
            child.reap()


def measure(
    scratch: Path, label: str, spark_conf: dict[str, str], spark_wait_s: float
) -> tuple[float, float]:
    """Freezes one executor; returns (arrowbeat seconds, Spark seconds) to notice it."""
    tables = scratch / f"tables-{label}"
    go = scratch / f"go-{label}"
    app = SubmittedApp(
        HOLD_APP,
        "local-cluster[2,1,1024]",
        scratch,
        conf={"spark.arrowbeat.tables.path": str(tables), **spark_conf},
        args=[str(go), "--max-wait", str(spark_wait_s + 120)],
    )
    try:
        app.wait_for("APP-READY ", timeout_s=180)
        wait_until(lambda: len(rows(tables, "heartbeats")) >= 4, 60)
        jvms = executor_jvms(app.marker)
        victim_id = sorted(jvms)[0]
        stopped_at = time.time()
        jvms[victim_id].suspend()
        removed = app.wait_for("SPARK-EXECUTOR-REMOVED ", timeout_s=spark_wait_s)
        spark_s = removed["ts"] - stopped_at
        jvms[victim_id].resume()
        timeouts = [
            r["ts"].timestamp()
            for r in rows(tables, "executor_events")
            if r["executor_id"] == victim_id
            and r["event"] == "HEARTBEAT_TIMEOUT"
            and r["ts"].timestamp() >= stopped_at
        ]
        if not timeouts:
            raise SystemExit(f"{label}: arrowbeat recorded no HEARTBEAT_TIMEOUT for executor {victim_id}")
        arrowbeat_s = min(timeouts) - stopped_at
        print(
            f"{label}: arrowbeat {arrowbeat_s:.2f}s, Spark {spark_s:.2f}s "
            f"(executor {removed['executor_id']})",
            flush=True,
        )
        go.touch()
        app.wait_for("APP-RESULT ", timeout_s=180)
        app.wait(timeout_s=120)
        return arrowbeat_s, spark_s
    finally:
        app.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--spark-wait", type=float, default=400.0, help="longest wait for Spark's own detection"
    )
    parser.add_argument(
        "--part", choices=["heartbeat", "spark", "all", "fast", "fast-heartbeat"], default="all"
    )
    parser.add_argument("--modes", default="phi,standard,short-timeout", help="fast: the modes to run")
    parser.add_argument("--trials", type=int, default=40, help="fast: freezes per mode")
    parser.add_argument("--standard-trials", type=int, default=10, help="fast: freezes in the standard mode")
    parser.add_argument("--storm", type=float, default=60.0, help="fast: seconds of GC storm")
    parser.add_argument("--hogs", type=int, default=4, help="fast: CPU-bound processes during the storm")
    parser.add_argument("--gc-objects", type=int, default=20_000_000, help="fast: live objects per full GC")
    args = parser.parse_args()
    prepare()  # loopback, the venv's Python everywhere, the run marker
    if args.part == "fast-heartbeat":
        from benchmarks.detection_fast import heartbeat_only, report

        report([heartbeat_only(args.trials, args.storm, args.hogs)], args.hogs)
        return 0
    if args.part == "fast":
        from benchmarks.detection_fast import report, run_mode

        runs = []
        for number, mode in enumerate(args.modes.split(",")):
            trials = args.standard_trials if mode == "standard" else args.trials
            scratch = Path(tempfile.mkdtemp(prefix=f"arrowbeat-detect-{mode}-"))
            runs.append(run_mode(mode, scratch, trials, args.storm, args.hogs, args.gc_objects, seed=number))
        report(runs, args.hogs)
        return 0
    if args.part in ("heartbeat", "all"):
        kill_s, freeze_s, reregister_s = measure_heartbeat()
        print(f"RESULT heartbeat_kill_detect_s={kill_s:.2f}")
        print(f"RESULT heartbeat_freeze_detect_s={freeze_s:.2f}")
        print(f"RESULT heartbeat_reregister_s={reregister_s:.2f}")
    if args.part == "heartbeat":
        return 0
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-detect-"))
    arrowbeat_s, spark_s = measure(scratch, "spark-defaults", {}, args.spark_wait)
    arrowbeat_low_s, spark_low_s = measure(scratch, "spark-lowered", SPARK_LOWERED, args.spark_wait)
    print(f"RESULT arrowbeat_detect_s={arrowbeat_s:.2f}")
    print(f"RESULT spark_detect_s={spark_s:.2f}")
    print(f"RESULT detect_speedup={spark_s / arrowbeat_s:.1f}")
    print(f"RESULT arrowbeat_detect_s_run2={arrowbeat_low_s:.2f}")
    print(f"RESULT spark_lowered_detect_s={spark_low_s:.2f}")
    print(f"RESULT detect_speedup_vs_lowered={spark_low_s / arrowbeat_low_s:.1f}")
    return 0


if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
