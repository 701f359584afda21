"""Removing one map task's Spark status blocks (``compat.shuffle_blocks``) has Spark recompute map
partitions without replacing the executor, on ``local-cluster[2,1,1024]`` (the run's shared
``shuffle_cluster``).

A grouped shuffle's outputs are held (``shuffle_of``) and read once; then one map output's arrowbeat
file and its status blocks are removed, as its agent would on finding the file damaged, and the
same DataFrame is read again. Spark's answer to the fetch failure (``DAGScheduler``: every map
output registered on the serving executor is unregistered, ``removeExecutorAndUnregisterOutputs``)
decides what is recomputed: exactly the map partitions that executor ran, none of the other's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession

from harness.procs import executor_jvms
from harness.session import sql_conf
from spark_plugin.compat.shuffle_blocks import remove_map_status_blocks, task_attempt_of
from spark_plugin.shuffle import group_apply, shuffle_of
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark
ROWS = 20_000
SUMMARY = "k int, n bigint, sx double"


def _summary(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def source(spark: SparkSession) -> DataFrame:
    """Deterministic (recomputable) rows over 6 map partitions, about 50 keys."""
    return spark.range(0, ROWS, numPartitions=6).selectExpr(
        "id", "cast(pmod(hash(id), 50) AS int) AS k", "cast(pmod(hash(id, 2), 1000) AS double) AS x"
    )


def answer(df: DataFrame) -> dict[int, tuple[int, float]]:
    return {r.k: (r.n, round(r.sx, 6)) for r in df.collect()}


def block_manager_dirs(jvm: psutil.Process) -> list[str]:
    """The executor's block-manager folders, as PySpark hands them to its Python workers
    (``SPARK_LOCAL_DIRS`` of the executor's daemon) and its JVM hands them to the agent."""
    for child in jvm.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            dirs = [d for d in child.environ().get("SPARK_LOCAL_DIRS", "").split(",") if d]
            if dirs and all(Path(d).name.startswith("blockmgr-") for d in dirs):
                return dirs
    raise AssertionError(f"no Python worker of executor JVM {jvm.pid} names its local dirs")


def test_removed_status_blocks_recompute_that_executors_map_partitions_only(
    shuffle_cluster: ShuffleCluster,
) -> None:
    spark, root = shuffle_cluster.spark, shuffle_cluster.root
    app = spark.sparkContext.applicationId
    df = source(spark)
    want = answer(df.groupBy("k").applyInArrow(_summary, SUMMARY))
    # Not adaptive: the map tasks themselves write the status rows into Spark's shuffle (an adaptive
    # shuffle caches them and another task shuffles them, tasks.carry_function).
    with sql_conf(spark, {"spark.arrowbeat.shuffle.adaptive": "false"}):
        out = group_apply(df, ["k"], _summary, SUMMARY)
        handle = shuffle_of(out)
        first = answer(out)
    try:
        assert first == want
        writes = [r for r in handle.reports() if r["side"] == "write"]
        assert sorted(r["partition"] for r in writes) == list(range(6))
        by_executor: dict[str, set[int]] = {}
        for r in writes:
            by_executor.setdefault(r["executor"], set()).add(r["partition"])
        assert len(by_executor) == 2, by_executor  # both executors ran map tasks
        victim = next(r for r in writes if r["rows"] > 0)
        executor, attempt = victim["executor"], victim["attempt"]
        jvms = executor_jvms()
        pids = {e: p.pid for e, p in jvms.items()}
        folder = root / app / executor / f"s{handle.shuffle_id}"
        (arrows,) = folder.glob(f"m{victim['partition']}-{attempt}-*.arrows")

        task = task_attempt_of(attempt)
        assert task is not None, attempt
        removed = remove_map_status_blocks(block_manager_dirs(jvms[executor]), task)
        arrows.unlink()
        kinds = [Path(p).name.split(".", 1)[1] for p in removed]
        # Index first (a reader meets a missing index, never a half-removed output), then data.
        assert kinds[:2] == ["index", "data"] and all(k.startswith("checksum.") for k in kinds[2:]), removed

        again = answer(out)
        assert again == want
        first_attempts = {r["attempt"] for r in writes}
        reruns = [r for r in handle.reports() if r["side"] == "write" and r["attempt"] not in first_attempts]
        reads = [r for r in handle.reports() if r["side"] == "read"]
        print(
            f"removed {removed}; victim executor {executor} ran {sorted(by_executor[executor])}; "
            f"reruns {[(r['partition'], r['executor'], r['attempt']) for r in reruns]}"
        )
        # Spark unregistered every map output of the serving executor, and only those (no full
        # retry of the map stage: no reduce task had finished when the fetch failed).
        assert sorted(r["partition"] for r in reruns) == sorted(by_executor[executor])
        assert {p for r in reads for p, _ in r["recomputed_maps"]} == by_executor[executor]
        # No executor was replaced.
        assert {e: p.pid for e, p in executor_jvms().items()} == pids
    finally:
        handle.release()
