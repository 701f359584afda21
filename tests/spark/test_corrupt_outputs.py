"""Damaged map outputs on ``local-cluster[2,1,1024]`` (the run's shared ``shuffle_cluster``): the
answer stays exact, Spark reruns the damaged map partitions, and ``shuffle_metrics`` says so.

As a user met it (issue 36): a grouped shuffle's outputs held with ``shuffle_of``, the result read
once, then bytes of every map-output file overwritten and the same DataFrame read again, with
reads host-local and streamed through the agents. Before checksums this gave wrong answers
silently, or crashed every reduce task until the job failed. Now every reader verifies before
Arrow decodes; the owner's agent removes the file and the Spark blocks of its status rows, the
reduce task's retry meets a fetch failure and Spark reruns the map partitions
(``spark_plugin.shuffle.agent.corrupt_outputs``, ``spark_plugin.compat.shuffle_blocks``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from harness.history_read import rows as history_rows
from harness.procs import executor_jvms, wait_until
from harness.session import sql_conf
from spark_plugin.shuffle import group_apply, shuffle_of
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark
ROWS = 20_000
SUMMARY = "k int, n bigint, sx double"
FULL_RETRY_ON_MISMATCH = "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch"
DAMAGE = {
    "one-bit": [(0.47, 0x01, 1)],
    "overwrites": [(0.35, 0x5A, 256), (0.60, 0x5A, 256), (0.85, 0x5A, 256)],
}
"""(where in the file, XOR mask, bytes): what issue 36 tried on main before checksums."""


def _summary(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def source(spark: SparkSession) -> DataFrame:
    """Deterministic (recomputable) rows over 6 map partitions, 997 keys."""
    return spark.range(0, ROWS, numPartitions=6).selectExpr(
        "id", "cast(pmod(hash(id), 997) AS int) AS k", "cast(pmod(hash(id, 2), 1000) AS double) AS x"
    )


def answer(df: DataFrame) -> dict[int, tuple[int, float]]:
    return {r.k: (r.n, round(r.sx, 6)) for r in df.collect()}


def damage(path: Path, spots: list[tuple[float, int, int]]) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        for at, mask, length in spots:
            f.seek(int(size * at))
            old = f.read(length)
            f.seek(int(size * at))
            f.write(bytes(b ^ mask for b in old))


@pytest.mark.parametrize("host_local", [True, False], ids=["host-local", "streamed"])
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_map_outputs_are_recomputed_and_the_answer_is_exact(
    shuffle_cluster: ShuffleCluster, kind: str, host_local: bool
) -> None:
    spark, root, tables = shuffle_cluster.spark, shuffle_cluster.root, shuffle_cluster.tables
    df = source(spark)
    want = answer(df.groupBy("k").agg(F.count("*").alias("n"), F.sum("x").alias("sx")))
    # Not adaptive: the map tasks themselves write their status rows into Spark's shuffle, so the
    # agent finds their blocks (an adaptive shuffle's rows are cached and shuffled by another task:
    # a damaged output then replaces its executor). Spark 4.2's full retry on a checksum mismatch
    # would abort the result stage: the recomputed rows name a new file
    # (docs/concepts/shuffle.md, "Lost map outputs").
    settings = {
        "spark.arrowbeat.shuffle.adaptive": "false",
        "spark.arrowbeat.shuffle.readHostLocalDisk": str(host_local).lower(),
        FULL_RETRY_ON_MISMATCH: "false",
    }
    pids = {e: p.pid for e, p in executor_jvms().items()}
    with sql_conf(spark, settings):
        out = group_apply(df, ["k"], _summary, SUMMARY)
        handle = shuffle_of(out)
        try:
            assert answer(out) == want
            app = spark.sparkContext.applicationId
            files = sorted((root / app).glob(f"*/s{handle.shuffle_id}/*.arrows"))
            writes = [r for r in handle.reports() if r["side"] == "write" and r["rows"] > 0]
            assert len(files) == len(writes) >= 4, files
            for path in files:
                damage(path, DAMAGE[kind])
            assert answer(out) == want  # never a wrong row, never a crashed worker
            handle.flush_metrics()
            from deltalake import DeltaTable

            rows = DeltaTable(str(tables / "shuffle_metrics")).to_pyarrow_table().to_pylist()
            mine = [r for r in rows if r["shuffle_id"] == handle.shuffle_id]
            corrupt = {r["partition"] for r in mine if r["side"] == "write" and r["corrupt"]}
            damaged = {r["partition"] for r in writes}
            assert corrupt and corrupt <= damaged, (corrupt, damaged)
            assert all(r["recomputed"] for r in mine if r["corrupt"])
            # Each damaged file an agent found is a SHUFFLE_CORRUPT event naming its executor and file.
            named = {r["file"] for r in (json.loads(m["detail"])["corrupt"] for m in mine if m["corrupt"])}

            def recorded() -> bool:
                found = [
                    e for e in history_rows(tables, "executor_events") if e["event"] == "SHUFFLE_CORRUPT"
                ]
                return all(any(f in e["detail"] for e in found) for f in named)

            assert wait_until(recorded, 30), named
        finally:
            handle.release()
    # The damage cost map partitions, not executors.
    assert {e: p.pid for e, p in executor_jvms().items()} == pids
