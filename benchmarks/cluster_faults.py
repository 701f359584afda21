"""A whole host lost on a real Spark standalone cluster: how fast arrowbeat reports a frozen host,
and how long an Arrow shuffle takes to an exact result when a host is killed mid-shuffle.

The client-mode application of ``harness/standalone.py`` (``standalone_app``): a Master and
two Workers, each its own host (127.0.0.2, 127.0.0.3, one core, its own temp dir); the
application's driver here, arrowbeat at its defaults (interval 1 s, timeout 5 s), Spark's too
(``spark.shuffle.io.retryWait`` 5 s). Each round:

- *freeze*: SIGSTOP on one Worker and everything under it; the time to that executor's
  ``HEARTBEAT_TIMEOUT`` (the RM's timestamp in ``executor_events``), then SIGCONT and its
  re-registration;
- *kill*: an adaptive ``group_apply`` whose map side has run on both hosts, then SIGKILL on one
  Worker and everything under it, then the reduce side: the time from the kill to the exact
  result, against the reduce side of the same job without a kill in the same round (and the
  whole jobs, as a ratio). The host is started again before the next round.

    .venv/bin/python -m benchmarks.cluster_faults [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from harness.env import prepare
from harness.history_read import rows
from harness.procs import wait_until
from harness.standalone import (
    SUMMARY,
    StandaloneCluster,
    Worker,
    keyed_source,
    spark_executors,
    spark_summary,
    standalone_app,
    summary,
)
from spark_plugin.shuffle import group_apply, shuffle_of

ROWS = 400_000
EVENTS = "executor_events"
WAIT_S = 120.0  # the longest any step may take before the run is called failed


def source(spark: SparkSession) -> DataFrame:
    return keyed_source(spark, ROWS, 997)


def event_ts(tables: Path, executor_id: str, kind: str, after: float) -> float | None:
    for r in rows(tables, "executor_events"):
        if r["executor_id"] == executor_id and r["event"] == kind and r["ts"].timestamp() >= after:
            return float(r["ts"].timestamp())
    return None


def must(condition: Any, what: str) -> None:
    if not wait_until(condition, WAIT_S, interval_s=0.05):
        raise SystemExit(f"not within {WAIT_S:g}s: {what}")


def freeze_round(cluster: StandaloneCluster, tables: Path, worker: Worker) -> float:
    """Seconds from SIGSTOP of the whole host to its executor's HEARTBEAT_TIMEOUT."""
    executor = cluster.executor_id(worker)
    stopped_at = time.time()
    cluster.freeze(worker)
    try:
        must(lambda: event_ts(tables, executor, "HEARTBEAT_TIMEOUT", stopped_at), f"{worker.name} reported")
    finally:
        thawed_at = cluster.thaw(worker)  # before the SIGCONT: a re-registration may follow at once
    detected = event_ts(tables, executor, "HEARTBEAT_TIMEOUT", stopped_at)
    assert detected is not None
    must(
        lambda: event_ts(tables, executor, "REREGISTERED", thawed_at),
        f"{worker.name} back: {[(r['ts'], r['event'], r['detail']) for r in rows(tables, EVENTS)]}",
    )
    return detected - stopped_at


def shuffle_round(
    spark: SparkSession,
    cluster: StandaloneCluster,
    expected: dict[int, tuple[int, float]],
    victim: Worker | None,
) -> tuple[float, float]:
    """(whole job seconds, seconds from the end of the map side, or from the kill, to the exact
    result) for one adaptive group_apply; ``victim``'s host is killed after its map side ran."""
    df = source(spark)
    started = time.monotonic()
    out = group_apply(df, ["k"], summary, SUMMARY)  # adaptive: the map side runs here
    handle = shuffle_of(out)
    mid = time.monotonic()
    if victim is not None:
        written = {r["executor"] for r in handle.reports() if r["side"] == "write"}
        if cluster.executor_id(victim) not in written:
            raise SystemExit(f"{victim.name} ran no map task: nothing to lose")
        cluster.kill(victim)
    got = {r.k: (r.n, r.sx) for r in out.collect()}
    done = time.monotonic()
    if got != expected:
        raise SystemExit(f"inexact result ({'after a kill' if victim else 'no kill'})")
    recomputed = any(r["recomputed_maps"] for r in handle.reports() if r["side"] == "read")
    if (victim is not None) != recomputed:
        raise SystemExit(f"recomputed maps: {recomputed}, host killed: {victim is not None}")
    handle.release()
    return done - started, done - mid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    prepare()  # loopback, the venv's Python, the run marker
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-cluster-faults-"))
    freezes: list[float] = []
    kills: list[tuple[float, float]] = []
    clean: list[tuple[float, float]] = []
    conf = {
        "spark.arrowbeat.tables.flushInterval": "500ms",
        "spark.sql.shuffle.partitions": "8",
        "spark.arrowbeat.shuffle.adaptive": "true",
    }
    try:
        with standalone_app(
            scratch / "cluster", scratch, "bench-cluster-faults", conf, timeout_s=WAIT_S
        ) as app:
            spark, cluster, tables = app.spark, app.cluster, app.tables
            expected = spark_summary(source(spark))
            shuffle_round(spark, cluster, expected, None)  # warm-up: Python workers, imports
            for index in range(args.rounds):
                worker = cluster.workers[index % 2]
                freezes.append(freeze_round(cluster, tables, worker))
                clean.append(shuffle_round(spark, cluster, expected, None))
                kills.append(shuffle_round(spark, cluster, expected, worker))
                cluster.start_worker(worker)
                cluster.wait_alive([worker])
                must(lambda: spark_executors(spark) == 2, f"an executor on {worker.name} again")
                must(lambda w=worker: len(cluster.executors_of(w)) == 1, f"{worker.name} runs one")
                print(
                    f"round {index + 1} ({worker.name}): frozen host reported after "
                    f"{freezes[-1]:.2f}s; job {clean[-1][0]:.2f}s without a kill, "
                    f"{kills[-1][0]:.2f}s with one; kill -> exact result {kills[-1][1]:.2f}s "
                    f"(reduce side alone {clean[-1][1]:.2f}s)",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    kill_job, kill_recovery = (statistics.median(x) for x in zip(*kills, strict=True))
    clean_job, clean_reduce = (statistics.median(x) for x in zip(*clean, strict=True))
    print(f"RESULT host_freeze_detect_runs={','.join(f'{s:.2f}' for s in freezes)}")
    print(f"RESULT host_kill_recovery_runs={','.join(f'{s:.2f}' for _, s in kills)}")
    print(f"RESULT no_kill_reduce_s={clean_reduce:.2f}")
    print(f"RESULT host_kill_job_s={kill_job:.2f}")
    print(f"RESULT no_kill_job_s={clean_job:.2f}")
    print(f"RESULT host_kill_vs_no_kill={kill_job / clean_job:.2f}")
    print(f"RESULT host_freeze_detect_s={statistics.median(freezes):.2f}")
    print(f"RESULT host_kill_recovery_s={kill_recovery:.2f}")
    return 0


if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
