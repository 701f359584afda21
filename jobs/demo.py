"""The demo application (``make demo``): arrowbeat inside a real multi-executor Spark application.

Run with spark-submit and the flags of ``python -m spark_plugin conf`` on
``local-cluster[2,1,1024]``. It shows the driver-side ResourceManager process and one registered
agent per executor (pids and addresses), then writes a Delta table and reads it back.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from heartbeat.client import list_executors
from pyspark.sql import SparkSession


def wait_for_agents(address: str, secret: str, expected: int, timeout_s: float) -> list[object]:
    """The RM's view once ``expected`` executors are registered (or whatever it has at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        executors = list_executors(address, secret, timeout_s=5.0)
        if len(executors) >= expected or time.monotonic() > deadline:
            return list(executors)
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table", default="", help="Delta table path (default: under the warehouse dir)")
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args(argv)

    spark = SparkSession.builder.appName("arrowbeat-demo").getOrCreate()
    sc = spark.sparkContext
    conf = sc.getConf()
    address = conf.get("spark.arrowbeat.rm.address", None)
    if not address:
        print("arrowbeat is not running in this application: see the driver log for why", file=sys.stderr)
        spark.stop()
        return 1
    secret = conf.get("spark.arrowbeat.authenticate.secret")
    expected = max(1, sc._jsc.sc().getExecutorMemoryStatus().size() - 1)

    print(f"driver-side ResourceManager: pid {conf.get('spark.arrowbeat.driver.pid')} at {address}")
    for e in wait_for_agents(address, secret, expected, timeout_s=60):
        print(
            f"  agent for executor {e.executor_id}: pid {e.pid} on {e.host}, {e.state}, "  # type: ignore[attr-defined]
            f"last heartbeat {e.last_heartbeat_age_s:.2f}s ago"
        )  # type: ignore[attr-defined]

    warehouse = conf.get("spark.sql.warehouse.dir", "spark-warehouse").removeprefix("file:")
    table = args.table or str(Path(warehouse) / "arrowbeat_demo")
    df = spark.range(0, args.rows, numPartitions=4).selectExpr("id", "id % 97 AS bucket", "rand(7) AS x")
    df.write.format("delta").mode("overwrite").save(table)
    back = spark.read.format("delta").load(table)
    count, buckets = back.count(), back.select("bucket").distinct().count()
    print(f"Delta table {table}: wrote {args.rows} rows, read back {count} rows in {buckets} buckets")
    spark.stop()
    return 0 if count == args.rows else 1


if __name__ == "__main__":
    sys.exit(main())
