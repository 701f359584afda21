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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import SparkSession

from heartbeat.rm.admin import list_executors
from spark_plugin.history.storage import tables_root
from spark_plugin.jobs import executor_health
from spark_plugin.settings.config import ConfigError, from_spark_conf
from spark_plugin.settings.units import parse_duration


def wait_for(what: Callable[[], Any], timeout_s: float, interval_s: float = 0.1) -> Any:
    """``what()`` once it is truthy, or None at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(interval_s)
    return None


def slow_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """A deliberately slow Arrow stage, so the job is still running while an executor is frozen."""
    for batch in batches:
        time.sleep(0.25)
        yield batch


def spark_detection_bounds(conf: Any) -> tuple[float, float]:
    """When Spark's HeartbeatReceiver would drop a hung executor: timeout, plus up to one check interval."""
    timeout = parse_duration(conf.get("spark.network.timeout", "120s"))
    check = parse_duration(conf.get("spark.network.timeoutInterval", "60s"))
    return timeout, timeout + check


def expected_executors(conf: Any) -> int:
    """How many executors the application asked for: ``local-cluster[N,..]`` or executor instances."""
    master = str(conf.get("spark.master", ""))
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster[") :].split(",")[0])
    return int(conf.get("spark.executor.instances", "1") or 1)


def committed_event(tables: str, executor_id: str, event: str, after: float) -> bool:
    """Has ``executor_events`` a committed row of ``event`` for the executor at or after ``after``?"""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        rows = DeltaTable(f"{tables}/executor_events").to_pyarrow_table(
            columns=["executor_id", "event", "ts"]
        )
    except TableNotFoundError:
        return False
    return any(
        r["executor_id"] == executor_id and r["event"] == event and r["ts"].timestamp() >= after
        for r in rows.to_pylist()
    )


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
    try:
        config = from_spark_conf(conf.getAll())
    except ConfigError as exc:
        print(f"arrowbeat is off in this application: {exc}", file=sys.stderr)
        spark.stop()
        return 1
    address = config.rm_address
    if not address:
        print("arrowbeat is not running in this application: see the driver log for why", file=sys.stderr)
        spark.stop()
        return 1
    secret = config.secret
    timeout_s = config.heartbeat_timeout_s
    expected = expected_executors(conf)
    problems: list[str] = []

    print(f"\n== arrowbeat ResourceManager: pid {config.driver_pid} at {address}")

    def running_agents() -> list[Any]:
        return [e for e in list_executors(address, secret) if e.state == "RUNNING"]

    wait_for(lambda: len(running_agents()) >= expected, 60)
    agents = running_agents()
    for e in agents:
        print(f"   executor {e.executor_id}: agent pid {e.pid} on {e.host}, state {e.state}")
    if len(agents) < expected:
        problems.append(f"only {len(agents)} of {expected} executor agents registered")

    resumed: tuple[str, float] | None = None  # (executor id, when it was frozen)
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
            # Freeze it mid-task: wait until its heartbeat says a task is running there.
            wait_for(
                lambda: any(
                    e.executor_id == victim.executor_id and e.payload is not None and e.payload.running_tasks
                    for e in list_executors(address, secret)
                ),
                60,
            )
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
                print(
                    f"   arrowbeat reported it {reported.state} after {time.time() - stopped:.1f} s "
                    f"(interval {config.heartbeat_interval_s:g} s, timeout {timeout_s:g} s)"
                )
            else:
                print("   arrowbeat did NOT report it in time")
                problems.append(f"the frozen executor {victim.executor_id} was not reported")
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
            if back is None:
                problems.append(f"the resumed executor {victim.executor_id} did not re-register")
            else:
                resumed = (victim.executor_id, stopped)
    job.join()
    print(f"\n== job finished: {job_result[0] if job_result else 'failed'} rows")

    warehouse = conf.get("spark.sql.warehouse.dir", "spark-warehouse").removeprefix("file:")
    table = str(Path(warehouse) / "arrowbeat_demo")
    df = spark.range(0, args.rows, numPartitions=4).selectExpr("id", "id % 97 AS bucket", "rand(7) AS x")
    df.write.format("delta").mode("overwrite").save(table)
    count = spark.read.format("delta").load(table).count()
    print(f"\n== Delta table {table}: wrote {args.rows} rows, read back {count}")

    tables = str(tables_root(config, dict(conf.getAll())))
    # The health query below must see the freeze: wait for its commit.
    if resumed is not None and not wait_for(
        lambda: committed_event(tables, resumed[0], "REREGISTERED", resumed[1]),
        config.tables_flush_interval_s + 30,
    ):
        problems.append(f"no REREGISTERED row for executor {resumed[0]} in {tables}/executor_events")
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
    if not (job_result and job_result[0] == args.rows):
        problems.append(f"the job counted {job_result[0] if job_result else 'nothing'}, not {args.rows}")
    if count != args.rows:
        problems.append(f"the Delta table read back {count} rows, not {args.rows}")
    for problem in problems:
        print(f"DEMO FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
