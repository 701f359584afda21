"""A spark-submit job for an installed arrowbeat (tests/test_wheel.py, tests/spark/test_packed_env.py):
copied to a temp directory and run there, so nothing of the checkout is on its path.

Shows the plugin ran: the RM's address in the conf, ``--executors`` agents registered, an Arrow
shuffle with the same rows as Spark's and each key in one partition, a Delta table written and
read (Delta's jars came from ``python -m spark_plugin conf``'s flags). Prints one ``WHEEL-JOB``
line of JSON, with the interpreters the agents and the Python workers ran (the tests run every
"host" on this one machine, so the agents' pids can be looked up here) and the seconds each step
took (where a slow run spent them).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import psutil
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import spark_plugin
from heartbeat.executor_info import ExecutorInfo
from heartbeat.rm.admin import list_executors
from spark_plugin.settings.config import from_spark_conf
from spark_plugin.shuffle import repartition


def running_agents(address: str, secret: str) -> list[ExecutorInfo]:
    return [a for a in list_executors(address, secret) if a.state == "RUNNING"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executors", type=int, default=1)
    args = parser.parse_args()
    seconds: dict[str, float] = {}
    mark = time.monotonic()

    def took(step: str) -> None:
        nonlocal mark
        now = time.monotonic()
        seconds[step] = round(now - mark, 1)
        mark = now

    spark = SparkSession.builder.appName("arrowbeat-installed").getOrCreate()
    took("session")
    try:
        config = from_spark_conf(spark.sparkContext.getConf().getAll())
        assert config.rm_address, "arrowbeat is off: the driver plugin published no RM address"
        deadline = time.monotonic() + 120
        agents = running_agents(config.rm_address, config.secret)
        while len(agents) < args.executors and time.monotonic() < deadline:
            # RUNNING, not only listed: an executor whose agent's first start missed its timeout on
            # a loaded machine is listed UNMONITORED (no pid) until the JVM's retry registers it.
            time.sleep(0.2)
            agents = running_agents(config.rm_address, config.secret)
        took("agents registered")
        df = spark.range(4000).withColumn("k", F.col("id") % 13)
        ours = repartition(df, 4, "k").withColumn("p", F.spark_partition_id()).collect()
        theirs = df.collect()
        same_rows = sorted((r.id, r.k) for r in ours) == sorted((r.id, r.k) for r in theirs)
        one_partition_per_key = len({(r.k, r.p) for r in ours}) == 13
        took("shuffles")
        with tempfile.TemporaryDirectory() as tmp:
            spark.range(5).write.format("delta").save(f"{tmp}/t")
            delta_rows = spark.read.format("delta").load(f"{tmp}/t").count()
        took("delta")
        sc = spark.sparkContext
        workers = sc.parallelize(range(8), 8).map(lambda _: sys.executable).distinct().collect()
        took("workers")
        report = {
            "app_id": sc.applicationId,
            "agent_pythons": sorted(psutil.Process(a.pid).cmdline()[0] for a in agents if a.pid),
            "worker_pythons": sorted(workers),
            "rm_address": config.rm_address,
            "agents": sorted(f"{a.executor_id}@{a.host}" for a in agents),
            "same_rows": same_rows,
            "one_partition_per_key": one_partition_per_key,
            "delta_rows": delta_rows,
            "spark_plugin": spark_plugin.__file__,
            "seconds": seconds,
        }
        print("WHEEL-JOB " + json.dumps(report), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
