"""Many concurrent remote reducers per agent on real Spark, with agents whose buffers run out.

``local-cluster[3,4,512]``: three executor JVMs of four cores, so twelve reduce tasks run at once
and eight of them, on the two other executors, read from any one agent. Host-local disk reads are
off, so every read of another executor's map outputs streams through its agent, and each agent
has a 4 MiB pool (the smallest setting): room for two streams' reserved buffers, every other
stream must queue.

To make the queue certain rather than likely, the test first acts as two more, slow reducers:
they stage streams of their own on every agent and connect without reading, so each agent's
buffers are taken. The job's reducers then stage and connect, and all of them wait in the agents' queues
(first come, first served) until an agent holds eight waiting streams at once; the slow reducers
then go away and the queues drain. Every reduce task succeeds at its first attempt and the
result equals Spark's own, row for row.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import DataFrame, SparkSession

from arrow_shuffle import InputGate, NetworkBufferPool, RemoteChannelSpec, ShuffleConfig
from harness.procs import wait_until
from harness.session import build_session, stop_session
from spark_plugin.shuffle import repartition, shuffle_of
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.worker.agent_client import MapOutputClient

pytestmark = pytest.mark.spark
EXECUTORS, CORES = 3, 4
REMOTE_REDUCERS = (EXECUTORS - 1) * CORES  # reduce tasks reading from any one agent at once
ROWS = 200_000
BLOCKER_SHUFFLE = 2_000_000_000  # the slow reducer's own map output, in a folder no job uses
MIB = 1 << 20


@pytest.fixture(scope="module")
def cluster(scratch: Path) -> Iterator[tuple[SparkSession, Path]]:
    root = scratch / "concurrent-reducers"
    spark = build_session(
        f"local-cluster[{EXECUTORS},{CORES},512]",
        scratch,
        "test-concurrent-reducers",
        conf={
            "spark.executor.memory": "512m",
            "spark.arrowbeat.shuffle.dir": str(root),
            "spark.arrowbeat.tables.path": str(scratch / "concurrent-reducers-tables"),
            "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
            "spark.arrowbeat.shuffle.agentMemory": "4m",  # four 1 MiB buffers: two streams at a time
            "spark.locality.wait": "0",  # every free core takes a reduce task at once
        },
    )
    yield spark, root
    stop_session(spark)


def agents(spark: SparkSession, root: Path) -> list[dict[str, Any]]:
    folder = root / spark.sparkContext.applicationId / "agents"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []


def secret_of(spark: SparkSession) -> str:
    secret = spark.sparkContext.getConf().get("spark.arrowbeat.authenticate.secret")
    assert secret
    return secret


def metrics(spark: SparkSession, info: dict[str, Any]) -> dict[str, float]:
    with MapOutputClient((info["host"], info["control_port"]), secret_of(spark), "test") as client:
        return client.metrics()


def source(spark: SparkSession) -> DataFrame:
    """Nulls, strings and a key holding a third of the rows, over twelve map partitions."""
    return spark.range(0, ROWS, numPartitions=12).selectExpr(
        "id",
        "CASE WHEN id % 19 = 0 THEN NULL WHEN id % 3 = 0 THEN 7 ELSE pmod(hash(id), 500) END AS k",
        "concat('s', pmod(hash(id, 1), 50)) AS s",
    )


class SlowReducer:
    """Stages a 12 MiB stream on one agent and connects without reading: its two reserved buffers
    fill and stay taken until ``close()``. A real client and gate, only slow."""

    schema = pa.schema([("k", pa.int64()), ("x", pa.float64())])

    def __init__(self, spark: SparkSession, info: dict[str, Any], index: int) -> None:
        self.info = info
        path = str(Path(info["dir"]) / f"s{BLOCKER_SHUFFLE}" / f"blocker{index}.arrows")
        writer = MapOutputWriter(path, self.schema, ["k"], 1, 64 * MIB)
        for start in range(0, 12 * MIB // 16, 65536):
            ids = pa.array(range(start, start + 65536), pa.int64())
            writer.write(pa.record_batch([ids, ids.cast(pa.float64())], schema=self.schema))
        segments = writer.finish()[0].segments
        self.client = MapOutputClient((info["host"], info["control_port"]), secret_of(spark), "test")
        self.pid = self.client.stage(BLOCKER_SHUFFLE, 0, self.schema, [(path, segments)])
        config = ShuffleConfig(network_memory_bytes=2 * MIB, floating_buffers_per_gate=0)
        self.gate = InputGate(
            [RemoteChannelSpec((info["host"], info["data_port"]), self.pid, 0)],
            self.schema,
            NetworkBufferPool(2, MIB),
            config,
            secret_of(spark),
        )
        self.gate.start()

    def close(self) -> None:
        self.gate.close()
        self.client.unstage(self.pid)
        self.client.release(BLOCKER_SHUFFLE)  # the second call finds nothing left: harmless
        self.client.close()


def test_many_concurrent_remote_reducers_queue_for_agent_buffers_and_all_succeed(
    cluster: tuple[SparkSession, Path],
) -> None:
    spark, root = cluster
    assert wait_until(lambda: len(agents(spark, root)) == EXECUTORS, 120), "not every agent started"
    infos = agents(spark, root)
    assert all(metrics(spark, a)["shuffle_pool_segments"] == 4 for a in infos)
    df = source(spark)
    expected = Counter(tuple(r) for r in df.collect())

    slow = [SlowReducer(spark, info, i) for info in infos for i in range(2)]
    result: dict[str, Any] = {}
    try:
        assert wait_until(
            lambda: all(metrics(spark, a)["shuffle_pool_available"] == 0 for a in infos), 30, 0.2
        )
        out = repartition(df, 3 * EXECUTORS * CORES, "k")

        def run() -> None:
            try:
                result["rows"] = out.selectExpr("spark_partition_id() AS p", "*").collect()
            except BaseException as exc:
                result["error"] = exc

        job = threading.Thread(target=run, name="concurrent-reducers-job")
        job.start()
        # Every reducer stages on both other agents and waits there: one agent sees all eight.
        assert wait_until(
            lambda: (
                max(metrics(spark, a)["shuffle_streams_waiting"] for a in infos) >= REMOTE_REDUCERS
                or not job.is_alive()
            ),
            240,
            interval_s=0.5,
        ), f"never {REMOTE_REDUCERS} waiting streams on one agent: {[metrics(spark, a) for a in infos]}"
        assert job.is_alive(), f"the job ended while the agents' buffers were taken: {result}"
    finally:
        for reducer in slow:
            reducer.close()
    job.join(300)
    assert not job.is_alive() and "error" not in result, result.get("error")

    rows = result["rows"]
    assert Counter(tuple(r)[1:] for r in rows) == expected  # exactly Spark's rows
    where: dict[Any, set[int]] = {}
    for r in rows:
        where.setdefault(r["k"], set()).add(r["p"])
    assert all(len(parts) == 1 for parts in where.values())  # each key in one reduce partition

    with shuffle_of(out) as handle:
        reads = [r for r in handle.reports() if r["side"] == "read"]
    assert reads and all(r["attempt"].endswith(".0") for r in reads), "a reduce task was retried"
    assert sum(r["streamed_bytes"] for r in reads) > 0

    figures = [metrics(spark, a) for a in infos]
    peak = max(f["shuffle_streams_waiting_max"] for f in figures)
    queued = sum(f["shuffle_streams_queued"] for f in figures)
    wait_max = max(f["shuffle_stream_wait_max_s"] for f in figures)
    print(
        f"\nconcurrent reducers: {len(reads)} reduce tasks, {queued:.0f} streams queued over "
        f"{EXECUTORS} agents, peak {peak:.0f} waiting on one agent, longest wait {wait_max:.2f}s, "
        f"timeouts {sum(f['shuffle_streams_wait_timeouts'] for f in figures):.0f}, "
        f"expired {sum(f['shuffle_streams_expired'] for f in figures):.0f}"
    )
    assert peak >= REMOTE_REDUCERS
    assert all(f["shuffle_streams_wait_timeouts"] == 0 and f["shuffle_streams_expired"] == 0 for f in figures)
    assert wait_until(lambda: all(metrics(spark, a)["shuffle_streams_open"] == 0 for a in infos), 30)
    assert all(metrics(spark, a)["shuffle_pool_available"] == 4 for a in infos)
