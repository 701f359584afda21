"""arrowbeat in ``local[2]`` (the README's ``configure`` example): the driver's own executor gets
an agent too, so monitoring and the Arrow shuffle work without a cluster."""

from __future__ import annotations

from collections import Counter

import pytest
from pyspark.sql import SparkSession

from harness.procs import wait_until
from heartbeat.rm.admin import list_executors
from spark_plugin.shuffle import repartition, shuffle_of

pytestmark = pytest.mark.spark


def test_local_mode_has_an_agent_and_a_working_shuffle(spark_local: SparkSession) -> None:
    conf = spark_local.sparkContext.getConf()
    address, secret = conf.get("spark.arrowbeat.rm.address"), conf.get("spark.arrowbeat.authenticate.secret")
    assert address and secret
    assert wait_until(
        lambda: (
            [(e.executor_id, e.state) for e in list_executors(address, secret)] == [("driver", "RUNNING")]
        ),
        30,
    ), list_executors(address, secret)
    df = spark_local.range(0, 5000, numPartitions=3).selectExpr("id", "id % 13 AS k")
    out = repartition(df, 4, "k")
    with shuffle_of(out):
        rows = out.selectExpr("spark_partition_id() AS p", "id", "k").collect()
    assert Counter((r.id, r.k) for r in rows) == Counter((r.id, r.k) for r in df.collect())
    assert all(len({r.p for r in rows if r.k == k}) == 1 for k in range(13))
