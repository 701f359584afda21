"""The demo application (``make demo``): arrowbeat inside a real multi-executor Spark application.

Run with spark-submit and the flags of ``python -m spark_plugin conf`` on ``local-cluster[2,1,1024]``:

1. shows the driver-side ResourceManager process and one registered agent per executor;
2. runs a job, and freezes one executor JVM with SIGSTOP mid-run (the demo finds the JVM as the
   parent of its agent, so this step needs executors on this machine);
3. prints when arrowbeat reported the frozen executor and when Spark's own heartbeat would have;
4. resumes it, sees it re-register, lets the job finish;
5. writes a Delta table and reads it back;
6. prints the executor-health query's output over arrowbeat's history tables.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import SparkSession

from heartbeat.admin import list_executors
from jobs import executor_health
from spark_plugin.config import parse_duration


def wait_for(what: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    """``what()`` once it is truthy, or None at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(interval_s)
    return None


def slow_batches(batches: Iterable[Any]) -> Iterable[Any]:
    """A deliberately slow Arrow stage, so the job is still running while an executor is frozen."""
    for batch in batches:
        time.sleep(0.25)
        yield batch


def spark_detection_bounds(conf: Any) -> tuple[float, float]:
    """When Spark's HeartbeatReceiver would drop a hung executor: timeout, plus up to one check interval."""
    timeout = parse_duration(conf.get("spark.network.timeout", "120s"))
    check = parse_duration(conf.get("spark.network.timeoutInterval", "60s"))
    return timeout, timeout + check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--no-freeze", action="store_true", help="skip the SIGSTOP part")
    args = parser.parse_args(argv)

    spark = SparkSession.builder.appName("arrowbeat-demo").getOrCreate()
    sc = spark.sparkContext
    conf = sc.getConf()
    address = conf.get("spark.arrowbeat.rm.address", None)
    if not address:
        print("arrowbeat is not running in this application: see the driver log for why", file=sys.stderr)
        spark.stop()
        return 1
    secret = conf.get("spark.arrowbeat.authenticate.secret", "")
    timeout_s = parse_duration(conf.get("spark.arrowbeat.heartbeat.timeout", "5s"))
    expected = max(1, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)

    print(f"\n== arrowbeat ResourceManager: pid {conf.get('spark.arrowbeat.driver.pid')} at {address}")
    agents = (
        wait_for(
            lambda: (
                [e for e in list_executors(address, secret) if e.state == "RUNNING"]
                if len(list_executors(address, secret)) >= expected
                else None
            ),
            60,
        )
        or []
    )
    for e in agents:
        print(
            f"   executor {e.executor_id}: agent pid {e.pid} on {e.host}, instance {e.instance_id[:8]}, "
            f"state {e.state}"
        )

    job_result: list[int] = []
    job = threading.Thread(
        target=lambda: job_result.append(
            spark.range(0, args.rows, numPartitions=16).mapInArrow(slow_batches, "id long").count()
        )
    )
    job.start()

    if not args.no_freeze and agents:
        victim = agents[0]
        try:
            jvm = psutil.Process(victim.pid).parent()
        except psutil.Error:
            jvm = None
        if jvm is None or "CoarseGrainedExecutorBackend" not in " ".join(jvm.cmdline()):
            print("   (executor JVM not on this machine: skipping the freeze)")
        else:
            time.sleep(2.0)  # let tasks start on both executors
            stopped = time.time()
            jvm.send_signal(signal.SIGSTOP)
            print(f"\n== froze executor {victim.executor_id} (JVM pid {jvm.pid}) with SIGSTOP")
            reported = wait_for(
                lambda: next(
                    (
                        e
                        for e in list_executors(address, secret)
                        if e.executor_id == victim.executor_id and e.state != "RUNNING"
                    ),
                    None,
                ),
                timeout_s * 4,
            )
            low, high = spark_detection_bounds(conf)
            if reported:
                interval = conf.get("spark.arrowbeat.heartbeat.interval", "1s")
                print(
                    f"   arrowbeat reported it {reported.state} after {time.time() - stopped:.1f} s "
                    f"(interval {interval}, timeout {timeout_s:g} s)"
                )
            else:
                print("   arrowbeat did NOT report it in time")
            print(
                f"   Spark's own heartbeat would notice after {low:.0f}-{high:.0f} s "
                f"(spark.network.timeout + up to spark.network.timeoutInterval)"
            )
            jvm.send_signal(signal.SIGCONT)
            back = wait_for(
                lambda: next(
                    (
                        e
                        for e in list_executors(address, secret)
                        if e.executor_id == victim.executor_id and e.state == "RUNNING"
                    ),
                    None,
                ),
                timeout_s * 4,
            )
            print(
                f"   resumed: executor {victim.executor_id} "
                + (f"re-registered as instance {back.instance_id[:8]}" if back else "did NOT re-register")
            )
    job.join()
    print(f"\n== job finished: {job_result[0] if job_result else 'failed'} rows")

    warehouse = conf.get("spark.sql.warehouse.dir", "spark-warehouse").removeprefix("file:")
    table = str(Path(warehouse) / "arrowbeat_demo")
    df = spark.range(0, args.rows, numPartitions=4).selectExpr("id", "id % 97 AS bucket", "rand(7) AS x")
    df.write.format("delta").mode("overwrite").save(table)
    count = spark.read.format("delta").load(table).count()
    print(f"\n== Delta table {table}: wrote {args.rows} rows, read back {count}")

    tables = conf.get("spark.arrowbeat.tables.path", "") or str(Path(warehouse) / "arrowbeat")
    time.sleep(parse_duration(conf.get("spark.arrowbeat.tables.flushInterval", "2s")) + 1.0)
    with tempfile.TemporaryDirectory() as scratch:
        output = f"{scratch}/executor_health"
        query = executor_health.start(
            spark, tables, output, f"{scratch}/ckpt", timeout_s, {"availableNow": True}
        )
        query.awaitTermination()
        print("\n== executor health (per executor and minute):")
        spark.read.format("delta").load(output).where(f"app_id = '{sc.applicationId}'").orderBy(
            "window_start", "executor_id"
        ).drop("app_id").show(truncate=False)
    spark.stop()
    ok = count == args.rows and bool(job_result) and job_result[0] == args.rows
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
