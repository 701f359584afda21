"""Stuck tasks and explained gaps, measured with false positives counted (issue 17).

One application on ``local-cluster[2,1,2048]`` (``benchmarks/stuck_tasks_app.py``), stuck-task
timeout 3 s, heartbeat interval 0.1 s and timeout 0.35 s, executors on the serial collector:

- ``R`` real hangs (a UDF blocked on ``threading.Event().wait()``), each beside a UDF spinning on
  CPU for twice the stuck timeout: how soon each hang is ``TASK_STUCK`` after it began
  (``stuck_detect_s``, median and max), and how many busy tasks were reported (``false_stuck``);
- ``R`` GC pauses *under* the heartbeat timeout: any ``TASK_STUCK`` or timeout they cause counts
  as a false positive too;
- ``R`` SIGSTOPs of an executor JVM and ``R`` GC pauses *over* the heartbeat timeout: how many of
  the ``REREGISTERED`` details that follow name the right cause (``gc_gaps_right``,
  ``stop_gaps_right``).

``python -m benchmarks.stuck_tasks [--rounds 3]``; ends with ``RESULT name=value`` lines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.apps import gc_pause_jar
from harness.env import prepare
from harness.history_read import rows
from harness.procs import ours, wait_until
from harness.submit import SubmittedApp

STUCK_S, INTERVAL_S, TIMEOUT_S = 3.0, 0.1, 0.35


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small-gc", type=int, default=3_000_000, help="objects: a pause under the timeout")
    parser.add_argument("--big-gc", type=int, default=20_000_000, help="objects: a pause over the timeout")
    args = parser.parse_args()
    prepare()  # loopback, the venv's Python everywhere, the run marker
    rounds = args.rounds
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-bench-stuck-"))
    tables = scratch / "tables"
    print(f"load average before: {os.getloadavg()[0]:.2f} (2 cores)")
    app = SubmittedApp(
        Path(__file__).parent / "stuck_tasks_app.py",
        "local-cluster[2,1,2048]",
        scratch,
        conf={
            "spark.arrowbeat.tables.path": str(tables),
            "spark.arrowbeat.tables.flushInterval": "200ms",
            "spark.arrowbeat.stuckTask.timeout": f"{STUCK_S}s",
            "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
            "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S * 1000)}ms",
            "spark.driver.extraClassPath": str(gc_pause_jar(scratch)),
            "spark.executor.extraClassPath": str(gc_pause_jar(scratch)),
            "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -Xmn900m",  # no young GCs while building
            "spark.executor.memory": "1536m",
        },
        args=[
            str(scratch),
            "--rounds",
            str(rounds),
            "--hang-s",
            str(2 * STUCK_S),
            "--busy-s",
            str(2 * STUCK_S),
        ],
    )
    try:
        app.wait_for("APP-STOPS ", 600)

        def count(kind: str) -> int:
            return sum(e["event"] == kind for e in rows(tables, "executor_events"))

        for _ in range(rounds):
            jvm = ours("CoarseGrainedExecutorBackend", app=app.marker)[0]
            timeouts, back = count("HEARTBEAT_TIMEOUT"), count("REREGISTERED")
            jvm.suspend()
            try:  # stopped until the RM reported it, then back until it re-registered
                wait_until(lambda: count("HEARTBEAT_TIMEOUT") > timeouts, 30)  # noqa: B023
            finally:
                jvm.resume()
            wait_until(lambda: count("REREGISTERED") > back, 30)  # noqa: B023
        gc_phase_from = time.time()
        (scratch / "go-gc").touch()
        done = app.wait_for("APP-DONE ", 600)
        assert app.wait(120) == 0, app.log_tail()
    finally:
        app.close()
    events = rows(tables, "executor_events")
    stuck = [e for e in events if e["event"] == "TASK_STUCK"]
    hangs = [float((scratch / f"hang-{r}").read_text()) for r in range(rounds)]
    true_stuck = [e for e in stuck if "partition 0 " in e["detail"]]
    detect = [e["ts"].timestamp() - h for e, h in zip(true_stuck, hangs, strict=False)]
    false_stuck = len(stuck) - len(true_stuck)
    rereg = [e for e in events if e["event"] == "REREGISTERED"]
    details = [e["detail"] for e in rereg]
    after_gc = [e["detail"] for e in rereg if e["ts"].timestamp() >= gc_phase_from]
    after_stop = [e["detail"] for e in rereg if e["ts"].timestamp() < gc_phase_from]
    gc_right = sum("gap: garbage collection" in d for d in after_gc)
    stop_right = sum("gap: process stopped" in d for d in after_stop)
    unexplained = sum("gap not explained" in d for d in details)
    wrong = len(details) - unexplained - gc_right - stop_right
    timeouts = sum(e["event"] == "HEARTBEAT_TIMEOUT" for e in events)
    print(f"hangs {rounds}, reported {len(true_stuck)}; detection (s): {[round(d, 2) for d in detect]}")
    print(f"GC pauses under the timeout (ms): {done['small_pause_ms']}; over it: {done['big_pause_ms']}")
    print(f"heartbeat timeouts: {timeouts} (expected {2 * rounds}: {rounds} stops + {rounds} long GCs)")
    for d in details:
        print(f"  REREGISTERED: {d}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print(f"RESULT stuck_detect_s={statistics.median(detect) if detect else float('nan'):.2f}")
    print(f"RESULT stuck_detect_max_s={max(detect) if detect else float('nan'):.2f}")
    print(f"RESULT stuck_missed={rounds - len(true_stuck)}")
    print(f"RESULT false_stuck={false_stuck}")
    print(f"RESULT false_timeouts={max(0, timeouts - 2 * rounds)}")
    print(f"RESULT gc_gaps_right={gc_right}/{len(after_gc)}")
    print(f"RESULT stop_gaps_right={stop_right}/{len(after_stop)}")
    print(f"RESULT long_gcs_timed_out={len(after_gc)}/{rounds}")
    print(f"RESULT gaps_unexplained={unexplained}")
    print(f"RESULT gaps_misclassified={wrong}")
    return 0


if __name__ == "__main__":
    from arrowbeat_base.hard_exit import exit_now

    start = time.monotonic()
    code = main()
    print(f"({time.monotonic() - start:.0f} s)", file=sys.stderr)
    exit_now(code)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
