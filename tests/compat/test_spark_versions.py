"""The compatibility subset: what every cell of the version matrix (``make matrix``) must show on
its pyspark, pyarrow, pandas and Python, against one ``local-cluster[2,1,1024]`` application with
arrowbeat on (issue 22: on pyspark 4.3 a wrapper of a PySpark internal failed every Python UDF of
the application).

The application runs with ``spark_settings(delta=False)`` (the history tables are delta-rs's;
Spark-side Delta is the primary cell's business), so the workers run arrowbeat's daemon
(``python_daemon``), with fast heartbeats, and with Spark's own worker tools on
(``spark.python.worker.faulthandler.enabled``; from 4.1 ``tracebackDumpIntervalSeconds`` and
``killOnIdleTimeout``):

- the running versions are supported and both agents register; history rows are written;
- a plain ``udf``, a ``pandas_udf``, ``groupBy().applyInPandas`` and ``mapInArrow`` give the
  results computed here; ``group_apply`` and ``repartition`` equal Spark's own;
- each worker is labelled with its task and writes its stack on arrowbeat's signal, while Spark's
  faulthandler stays enabled in it;
- a UDF that waits for good is ``TASK_STUCK`` with its function's name in arrowbeat's stack; from
  4.1, Spark's periodic dumps of that worker reach the executor's stderr, and Spark's idle timeout
  then ends the worker and the attempt runs again;
- a frozen executor times out (last: it disturbs the application).
"""

from __future__ import annotations

import faulthandler
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pyspark
import pytest
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.functions import col, udf
from pyspark.sql.pandas.functions import pandas_udf

from harness.history_read import rows
from harness.procs import ours, wait_until
from harness.session import build_session, stop_session
from harness.submit import executor_dirs
from spark_plugin.compat import versions
from spark_plugin.jvm.launch import PYTHON_DAEMON_MODULE
from spark_plugin.shuffle import group_apply, group_by, release, repartition
from tests.spark.test_launcher_compat import UNAVAILABLE_WARNING

pytestmark = [pytest.mark.spark, pytest.mark.compat]

SPARK_WORKER_TOOLS = tuple(int(n) for n in pyspark.__version__.split(".")[:2]) >= (4, 1)
"""Spark 4.1 added the periodic traceback dump and the kill on idle timeout."""
STUCK_TIMEOUT_S = 2.0
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
GENEROUS_S = 60.0
EXECUTOR_LINE = re.compile(
    r"arrowbeat executor plugin on executor \d+ \(Spark (?P<version>\S+)\): "
    r"host (?P<host>\S+) \(from the (?P<source>[^)]+)\), local dirs \[(?P<dirs>[^\]]*)\]"
)
"""A deadline no loaded machine should reach; the latencies themselves are benchmarks' business."""
DUMP_INTERVAL_S = 1
IDLE_TIMEOUT_S = 20
"""Spark's idle timeout (kills the worker from 4.1): well after arrowbeat's stuck timeout, so
arrowbeat's stack is taken first, on a loaded machine too (its ``TASK_STUCK`` came 2.2-2.5 s after
the UDF began here, with none to 12 busy loops beside it; the worker's start, before the UDF, took
up to 21 s)."""


@dataclass
class App:
    spark: SparkSession
    base: Path
    tables: Path


@pytest.fixture(scope="module")
def app(scratch: Path) -> Iterator[App]:
    base = scratch / "user-udfs"
    base.mkdir()
    tables = base / "tables"
    conf = {
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "200ms",
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S)}s",
        "spark.arrowbeat.stuckTask.timeout": f"{STUCK_TIMEOUT_S}s",
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.python.worker.tracebackDumpIntervalSeconds": str(DUMP_INTERVAL_S),
        "spark.python.worker.idleTimeoutSeconds": str(IDLE_TIMEOUT_S),
        "spark.python.worker.killOnIdleTimeout": "true",
    }
    spark = build_session("local-cluster[2,1,1024]", base, "test-compat", conf, delta=False)
    try:
        assert spark.sparkContext.getConf().get("spark.python.daemon.module") == PYTHON_DAEMON_MODULE
        yield App(spark, base, tables)
    finally:
        for proc in ours("CoarseGrainedExecutorBackend"):  # a failed test may leave one stopped
            proc.resume()
        stop_session(spark)


def executor_events(tables: Path, kind: str) -> list[dict[str, Any]]:
    return [r for r in rows(tables, "executor_events") if r["event"] == kind]


def test_the_running_versions_are_supported() -> None:
    assert versions.spark_support(pyspark.__version__).level == "supported", pyspark.__version__
    assert versions.library_problems() == []


def test_both_agents_register_and_history_rows_are_written(app: App) -> None:
    app.spark.range(0, 100, numPartitions=4).count()  # executors up
    registered = lambda: {r["executor_id"] for r in executor_events(app.tables, "REGISTERED")}  # noqa: E731
    assert wait_until(lambda: len(registered()) >= 2, 90), rows(app.tables, "executor_events")
    assert wait_until(lambda: len(rows(app.tables, "heartbeats")) > 0, 30)


def test_a_plain_udf(app: App) -> None:
    plus_one = udf(lambda x: x + 1, "long")
    got = app.spark.range(0, 1000, numPartitions=4).select(plus_one("id").alias("y")).collect()
    assert sorted(r.y for r in got) == list(range(1, 1001))


def test_a_pandas_udf(app: App) -> None:
    def halved_plus_one(values: pd.Series) -> pd.Series:
        return values * 0.5 + 1.0

    scaled = pandas_udf(halved_plus_one, "double")  # type: ignore[call-overload]

    got = app.spark.range(0, 500, numPartitions=3).select(scaled(col("id")).alias("y")).collect()
    assert sorted(r.y for r in got) == [i * 0.5 + 1.0 for i in range(500)]


def test_group_by_apply_in_pandas(app: App) -> None:
    def totals(group: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {"key": [int(group["key"].iloc[0])], "total": [int(group["id"].sum())], "n": [len(group)]}
        )

    df = app.spark.range(0, 2000, numPartitions=4).withColumn("key", col("id") % 7)
    got = df.groupBy("key").applyInPandas(totals, "key long, total long, n long").collect()
    expected = {k: (sum(i for i in range(2000) if i % 7 == k), len(range(k, 2000, 7))) for k in range(7)}
    assert {r.key: (r.total, r.n) for r in got} == expected


def test_map_in_arrow(app: App) -> None:
    def doubled(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column(0).to_pylist()
            yield pa.RecordBatch.from_pydict({"id": ids, "twice": [2 * i for i in ids]})

    got = app.spark.range(0, 3000, numPartitions=4).mapInArrow(doubled, "id long, twice long").collect()
    assert sorted((r.id, r.twice) for r in got) == [(i, 2 * i) for i in range(3000)]


def _keyed(spark: SparkSession) -> Any:
    return spark.range(0, 5000, numPartitions=4).selectExpr("id % 37 AS key", "id AS v")


def test_group_apply_equals_spark(app: App) -> None:
    def total(table: pa.Table) -> pa.Table:
        return pa.table({"key": table.column("key").slice(0, 1), "s": [pc.sum(table.column("v")).as_py()]})

    ours_ = group_apply(_keyed(app.spark), ["key"], total, "key long, s long")
    spark_ = _keyed(app.spark).groupBy("key").agg(F.sum("v").alias("s"))
    assert sorted(map(tuple, ours_.collect())) == sorted(map(tuple, spark_.collect()))


def test_group_by_over_parquet_reads_the_files_in_its_map_tasks_and_equals_spark(app: App) -> None:
    """This Spark's plan is read (``compat.parquet_relation``) and its map tasks read the files;
    a pandas result with a timestamp converts in the session's zone, which nobody set here."""
    folder = app.base / "parquet-in"
    folder.mkdir()
    at = pa.array(
        [1_700_000_000_000_000 + i * 3_600_000_000 for i in range(3000)], pa.timestamp("us", tz="UTC")
    )
    table = pa.table({"key": pa.array([i % 13 for i in range(3000)], pa.int64()), "at": at})
    pq.write_table(table, folder / "a.parquet", row_group_size=1000)

    def latest(group: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame(
            {"key": [int(group["key"].iloc[0])], "last": [group["at"].max()], "n": [len(group)]}
        )

    schema = "key long, last timestamp, n long"
    want = app.spark.read.parquet(str(folder)).groupBy("key").applyInPandas(latest, schema).collect()
    ours_ = group_by(app.spark.read.parquet(str(folder)), "key").applyInPandas(latest, schema)
    try:
        assert "Range (" in str(ours_._jdf.queryExecution().analyzed().toString())  # no FileScan
        assert sorted(map(tuple, ours_.collect())) == sorted(map(tuple, want)) and len(want) == 13
    finally:
        release(ours_)


def test_repartition_equals_spark(app: App) -> None:
    shuffled = repartition(_keyed(app.spark), 3, "key")
    assert shuffled.rdd.getNumPartitions() == 3
    assert sorted(map(tuple, shuffled.collect())) == sorted(map(tuple, _keyed(app.spark).collect()))
    # Each key in one partition, as df.repartition(3, "key") keeps it.
    keys_per_partition = shuffled.groupBy(F.spark_partition_id().alias("p")).agg(
        F.collect_set("key").alias("keys")
    )
    seen: list[int] = [k for r in keys_per_partition.collect() for k in r.keys]
    assert len(seen) == len(set(seen)) == 37


def test_each_worker_is_labelled_and_writes_its_stack_beside_sparks_faulthandler(app: App) -> None:
    def inspect_worker(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # Imported here: the function travels by value and runs in the worker.
        from spark_plugin.monitoring.executor_stacks import handles_stack_signal
        from spark_plugin.python_worker.worker_label import STACK_SIGNAL, stack_path

        for _ in batches:
            pass
        ctx = TaskContext.get()
        assert ctx is not None
        task = ctx.taskAttemptId()
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
        stack = ""
        if handles_stack_signal(os.getpid(), task):  # never signal a worker without the handler
            path = stack_path(os.environ["SPARK_LOCAL_DIRS"].split(",")[0], os.getpid())
            start = os.path.getsize(path)
            os.kill(os.getpid(), STACK_SIGNAL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and os.path.getsize(path) <= start:
                threading.Event().wait(0.05)
            with open(path) as f:
                f.seek(start)
                stack = f.read()
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "task": task,
                    "comm": comm,
                    "stack_names_udf": "inspect_worker" in stack,
                    "spark_faulthandler": faulthandler.is_enabled(),
                }
            ]
        )

    schema = "task long, comm string, stack_names_udf boolean, spark_faulthandler boolean"
    got = app.spark.range(0, 40, numPartitions=4).mapInArrow(inspect_worker, schema).collect()
    assert len(got) == 4
    for r in got:
        assert r.comm == f"abt{r.task}"[:15], r
        assert r.stack_names_udf, r
        assert r.spark_faulthandler, r  # arrowbeat left Spark's faulthandler enabled


def test_a_stuck_udfs_stack_is_found_beside_sparks_own_dumps(app: App) -> None:
    go = app.base / "go"
    attempts = app.base / "attempts"
    attempts.mkdir()

    def wait_for_go(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None
        (attempts / f"{ctx.partitionId()}-{ctx.attemptNumber()}").touch()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            deadline = time.monotonic() + 90  # never for good, whatever happens to the test
            while not go.exists() and time.monotonic() < deadline:
                threading.Event().wait(0.2)
        yield from batches

    result: list[Any] = []
    job = threading.Thread(
        target=lambda: result.append(
            app.spark.range(0, 100, numPartitions=2).mapInArrow(wait_for_go, "id long").collect()
        ),
        daemon=True,
    )
    started, wall_start = time.monotonic(), time.time()
    job.start()
    try:

        def stuck() -> list[str]:
            return [e["detail"] for e in rows(app.tables, "executor_events") if e["event"] == "TASK_STUCK"]

        def in_the_udf() -> list[str]:
            # On a loaded machine the attempt may first stall before its worker reaches it (the JVM
            # thread waits for the worker: a TASK_STUCK with the JVM stack only, then TASK_RESUMED
            # once the worker works); the stall in the function is the one this test is about.
            return [d for d in stuck() if "partition 0 attempt 0" in d and "wait_for_go" in d]

        def story() -> str:
            """What happened instead, for a failure: the attempts begun and the events since."""
            events = [
                (round(e["ts"].timestamp() - wall_start, 1), e["executor_id"], e["event"], e["detail"][:160])
                for e in rows(app.tables, "executor_events")
                if e["ts"].timestamp() >= wall_start
            ]
            begun = sorted(p.name for p in attempts.iterdir())
            done = not job.is_alive()
            # Late JVM lines read as pauses, and a pause is not idle time: per executor, its
            # heartbeats since the job began and the largest pulse age and gap between them.
            beats: dict[str, list[tuple[float, float]]] = {}
            for b in rows(app.tables, "heartbeats"):
                if b["ts"].timestamp() >= wall_start:
                    beats.setdefault(b["executor_id"], []).append(
                        (b["jvm_pulse_age_ms"] or 0, b["gap_ms"] or 0)
                    )
            pulses = {
                e: f"{len(v)} beats, max pulse age {max(v)[0]:.0f} ms, max gap {max(g for _, g in v):.0f} ms"
                for e, v in sorted(beats.items())
            }
            return (
                f"{time.monotonic() - started:.0f} s in; attempts begun {begun}; job done {done}; "
                f"executors {pulses}; {events}"
            )

        assert wait_until(in_the_udf, 60), story()
        if not SPARK_WORKER_TOOLS:  # no kill on idle before 4.1: let the UDF go
            go.touch()
        job.join(timeout=120)
        assert not job.is_alive() and len(result) == 1
    finally:
        go.touch()
        job.join(timeout=120)
    assert sorted(r.id for r in result[0]) == list(range(100))
    if not SPARK_WORKER_TOOLS:
        return
    # Spark killed the stuck worker at its idle timeout and ran the attempt again ...
    assert (attempts / "0-1").exists(), sorted(p.name for p in attempts.iterdir())
    assert time.monotonic() - started >= IDLE_TIMEOUT_S
    logs = "\n".join(
        p.read_text(errors="replace")
        for p in executor_dirs(app.spark.sparkContext.applicationId).glob("*/stderr")
    )
    assert "Terminating Python worker process due to idle timeout" in logs
    # ... after its own periodic dumps of that worker, which arrowbeat left armed.
    dumps = logs.split(f"Timeout (0:00:0{DUMP_INTERVAL_S})!")
    assert len(dumps) > 2 and any("in wait_for_go" in d.split("Timeout")[0] for d in dumps[1:]), logs[-3000:]


def test_the_launcher_found_every_spark_internal_on_each_executor(app: App) -> None:
    """The one launcher jar (compiled against Spark 4.0's API) on this Spark: each executor plugin
    took its host and local dirs from the block manager, and no internal was unavailable."""
    app_id = app.spark.sparkContext.applicationId
    logs = [p.read_text(errors="replace") for p in executor_dirs(app_id).glob("*/stderr")]
    started = [m for log in logs for line in log.splitlines() if (m := EXECUTOR_LINE.search(line))]
    assert len(started) >= 2 and len(started) == len(logs), started  # one per executor JVM
    assert not [log for log in logs if UNAVAILABLE_WARNING in log]
    for line in started:
        assert line["version"] == pyspark.__version__ and line["source"] == "block manager", line[0]
        assert [d for d in line["dirs"].split(",") if Path(d).name.startswith("blockmgr-")], line[0]


def test_arrowbeats_daemon_verified_this_pyspark_without_a_warning(app: App) -> None:
    """Every optimisation of the daemon (hook, preloading, zip re-reads) checked out on this
    cell's pyspark: a skipped one would have said so once in the executor's stderr."""
    app_id = app.spark.sparkContext.applicationId
    logs = "\n".join(p.read_text(errors="replace") for p in executor_dirs(app_id).glob("*/stderr"))
    assert "arrowbeat worker daemon:" not in logs, [
        line for line in logs.splitlines() if "arrowbeat worker daemon:" in line
    ]


def test_a_frozen_executor_times_out(app: App) -> None:
    jvms = ours("CoarseGrainedExecutorBackend")
    assert len(jvms) == 2
    frozen = jvms[0]
    executor = frozen.cmdline()[frozen.cmdline().index("--executor-id") + 1]
    before = time.time()
    frozen.suspend()
    try:
        assert wait_until(
            lambda: any(
                r["executor_id"] == executor and r["ts"].timestamp() >= before
                for r in executor_events(app.tables, "HEARTBEAT_TIMEOUT")
            ),
            GENEROUS_S,
        )
    finally:
        frozen.resume()
