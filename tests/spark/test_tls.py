"""``spark.arrowbeat.ssl.enabled=true`` on ``local-cluster[2,1,1024]`` with the generated, pinned
certificate: both agents register with the RM over TLS (ListExecutors answers only a TLS client
that trusts that certificate), and a repartition whose map outputs all stream through the other
executor's agent (host-local disk reads off: control and data ports inside TLS) is exact."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.procs import wait_until
from harness.session import build_session, stop_session
from heartbeat.errors import HeartbeatError
from heartbeat.rm.admin import list_executors
from spark_plugin.settings import tls
from spark_plugin.settings.config import from_spark_conf
from spark_plugin.shuffle import repartition, shuffle_of

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(scratch: Path) -> Iterator[SparkSession]:
    session = build_session(
        "local-cluster[2,1,1024]",
        scratch,
        "test-tls",
        conf={
            "spark.arrowbeat.ssl.enabled": "true",
            "spark.arrowbeat.shuffle.dir": str(scratch / "tls-shuffle"),
            "spark.arrowbeat.tables.path": str(scratch / "tls-tables"),
            "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
        },
    )
    yield session
    stop_session(session)


def test_agents_register_over_tls_and_a_streamed_shuffle_is_exact(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    settings = from_spark_conf(conf.getAll())
    material = tls.from_config(settings)  # what the driver generated and handed to the SparkConf
    assert material is not None and material.generated
    address, secret = settings.rm_address, settings.secret
    credentials = tls.grpc_channel_credentials(material)
    options = tls.grpc_channel_options(material)

    def running() -> list[str]:
        return sorted(
            e.executor_id
            for e in list_executors(address, secret, channel_credentials=credentials, channel_options=options)
            if e.state == "RUNNING"
        )

    assert wait_until(lambda: running() == ["0", "1"], 120), running()
    with pytest.raises(HeartbeatError):  # plaintext gets nothing from the RM
        list_executors(address, secret, timeout_s=2.0)

    df = spark.range(0, 30_000, numPartitions=4).selectExpr("id", "pmod(hash(id), 23) AS k")
    out = repartition(df, 4, "k")
    with shuffle_of(out) as handle:
        rows = Counter(tuple(r) for r in out.collect())
        streamed = sum(r["streamed_bytes"] for r in handle.reports() if r["side"] == "read")
    assert rows == Counter(tuple(r) for r in df.collect())
    assert streamed > 0, "map outputs of the other executor streamed through its agent"


def test_a_pipelined_shuffle_streams_inside_tls(spark: SparkSession) -> None:
    """One map and one reduce task at once: the driver's rendezvous and the map task's own data
    server (a server context rebuilt in the worker from the plan) inside TLS."""
    df = spark.range(0, 20_000, numPartitions=1).selectExpr("id", "pmod(hash(id), 11) AS k")
    out = repartition(df, 1, "k", mode="pipelined")
    with shuffle_of(out):
        rows = Counter(tuple(r) for r in out.collect())
    assert rows == Counter(tuple(r) for r in df.collect())
