"""Issue 14, item 3: map outputs lost while their executor lives are recomputed, exactly.

``local-cluster[2,1,1024]``, every read of the other executor's outputs streamed through its agent.
The map side of an adaptive ``group_apply`` runs when it is called, so each test can take the
outputs away between the map side and the reduce side:

- the agent of one executor is SIGKILLed while its JVM lives: the JVM notices, asks the driver to
  replace the executor, and Spark recomputes that executor's map partitions;
- the map-output files of one executor are deleted while its agent lives: the reduce task that
  cannot read them tells that agent (``report_lost``), which tells its JVM, and the same follows.

Either way the result equals Spark's own ``groupBy``, the recomputed map partitions are named in
the reduce tasks' reports, and the cluster is back to two executors.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from spark_plugin.shuffle import group_apply, shuffle_of
from tests.procs import ours, wait_until
from tests.spark.session import build_session, stop_session

pytestmark = pytest.mark.spark
ROWS = 40_000
SUMMARY = "k bigint, n bigint, sx double"


@pytest.fixture(scope="module")
def cluster(scratch: Path) -> Iterator[tuple[SparkSession, Path]]:
    root = scratch / "recompute-shuffle"
    spark = build_session(
        "local-cluster[2,1,1024]",
        scratch,
        "test-recompute",
        conf={
            "spark.arrowbeat.shuffle.dir": str(root),
            "spark.arrowbeat.tables.path": str(scratch / "recompute-tables"),
            "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
            "spark.sql.shuffle.partitions": "16",
            "spark.arrowbeat.shuffle.adaptive": "true",
            "spark.shuffle.io.retryWait": "3s",
        },
    )
    yield spark, root
    stop_session(spark)


def source(spark: SparkSession) -> DataFrame:
    return spark.range(0, ROWS, numPartitions=4).selectExpr(
        "id", "pmod(hash(id), 97) AS k", "cast(id % 1000 AS double) AS x"
    )


def summary(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int64()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def expected(df: DataFrame) -> dict[int, tuple[int, float]]:
    return {r.k: (r.n, r.sx) for r in df.groupBy("k").applyInArrow(summary, SUMMARY).collect()}


def agents(root: Path, app_id: str) -> dict[str, dict[str, Any]]:
    """Executor id -> its agent's discovery record (pid, ports, directory)."""
    found = {}
    for path in (root / app_id / "agents").glob("*.json"):
        info = json.loads(path.read_text())
        found[str(info["executor_id"])] = info
    return found


def executor_jvms() -> set[int]:
    return {p.pid for p in ours("CoarseGrainedExecutorBackend") if "--executor-id" in p.cmdline()}


def map_outputs_of(info: dict[str, Any], shuffle_id: int) -> list[Path]:
    folder = Path(info["dir"]) / f"s{shuffle_id}"
    return sorted(folder.glob("*.arrows")) if folder.exists() else []


def victim_with_outputs(spark: SparkSession, root: Path, shuffle_id: int) -> tuple[str, dict[str, Any]]:
    known = agents(root, spark.sparkContext.applicationId)
    for executor, info in sorted(known.items()):
        if map_outputs_of(info, shuffle_id):
            return executor, info
    raise AssertionError(f"no agent holds outputs of shuffle {shuffle_id}: {known}")


def check_recomputed(spark: SparkSession, out: DataFrame, df: DataFrame, jvms_before: set[int]) -> None:
    got = {r.k: (r.n, r.sx) for r in out.collect()}
    assert got == expected(df)
    handle = shuffle_of(out)
    reads = [r for r in handle.reports() if r["side"] == "read"]
    assert any(r["recomputed_maps"] for r in reads), reads
    handle.release()
    # Spark replaced the executor: two executors again, one of them new.
    assert wait_until(lambda: len(executor_jvms()) == 2 and executor_jvms() != jvms_before, 90)


def test_an_agent_killed_while_its_jvm_lives_gets_its_map_partitions_recomputed(
    cluster: tuple[SparkSession, Path],
) -> None:
    spark, root = cluster
    df = source(spark)
    jvms_before = executor_jvms()
    assert len(jvms_before) == 2
    out = group_apply(df, ["k"], summary, SUMMARY)  # adaptive: the map side has run
    shuffle_id = shuffle_of(out).shuffle_id
    _, info = victim_with_outputs(spark, root, shuffle_id)
    os.kill(int(info["pid"]), signal.SIGKILL)
    check_recomputed(spark, out, df, jvms_before)


def test_map_output_files_deleted_under_a_live_agent_are_recomputed(
    cluster: tuple[SparkSession, Path],
) -> None:
    spark, root = cluster
    assert wait_until(lambda: len(executor_jvms()) == 2 and len(agents_alive(spark, root)) == 2, 90)
    df = source(spark)
    jvms_before = executor_jvms()
    out = group_apply(df, ["k"], summary, SUMMARY)
    shuffle_id = shuffle_of(out).shuffle_id
    _, info = victim_with_outputs(spark, root, shuffle_id)
    for path in map_outputs_of(info, shuffle_id):
        path.unlink()
    check_recomputed(spark, out, df, jvms_before)


def agents_alive(spark: SparkSession, root: Path) -> list[str]:
    alive = []
    for executor, info in agents(root, spark.sparkContext.applicationId).items():
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            continue
        alive.append(executor)
    return alive
