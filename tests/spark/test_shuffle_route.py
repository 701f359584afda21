"""``path="auto"`` on real Spark (``spark_plugin.shuffle.driver.route``): a tiny input takes Spark's
exchange, a large one (by the optimizer's statistics) arrowbeat's; both equal Spark's own result,
and each choice with its reason is a ``shuffle_metrics`` row.

The run's shared ``shuffle_cluster`` (``tests/harness/apps.py``). The "large" input is large by
statistics only: without cost-based optimisation Spark estimates an equi-join of two ranges as the
product of their sizes (here ~10**10 bytes), while it really yields a few thousand rows.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame

from arrow_shuffle import ShuffleConfigError
from spark_plugin.compat.plan_stats import plan_size
from spark_plugin.shuffle import group_apply, partition_apply, release, shuffle_of
from spark_plugin.shuffle.driver.route import SPARK_BELOW, flush_routes, route_of
from tests.harness.apps import ShuffleCluster

pytestmark = pytest.mark.spark
SUMMARY = "k int, n bigint, sx double"


def summarize(table: pa.Table) -> pa.Table:
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int32()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sx": pa.array([pc.sum(table.column("x")).as_py()], pa.float64()),
        }
    )


def keyed(df: DataFrame) -> DataFrame:
    return df.selectExpr(
        "CASE WHEN id % 13 = 0 THEN NULL ELSE CAST(pmod(hash(id), 40) AS INT) END AS k",
        "cast(id % 100 AS double) / 4 AS x",
    )


def route_rows(cluster: ShuffleCluster) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    table = cluster.tables / "shuffle_metrics"
    if not (table / "_delta_log").is_dir():  # no shuffle of the shared application recorded yet
        return []
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    return [r for r in rows if r["side"] == "route"]


def test_auto_takes_sparks_path_for_a_tiny_input_and_arrowbeats_for_a_large_one(
    shuffle_cluster: ShuffleCluster,
) -> None:
    spark = shuffle_cluster.spark
    flush_routes()  # rows of earlier tests of the shared application: on the table before we look
    earlier = {r["shuffle_id"] for r in route_rows(shuffle_cluster)}
    tiny = keyed(spark.range(0, 1000, numPartitions=2))
    large = keyed(spark.range(0, 3000, numPartitions=2).join(spark.range(0, 3000, numPartitions=2), "id"))
    tiny_bytes, large_bytes = plan_size(tiny).bytes, plan_size(large).bytes
    assert tiny_bytes is not None and tiny_bytes < SPARK_BELOW["group"].default
    assert large_bytes is not None and large_bytes >= SPARK_BELOW["group"].default

    def want(df: DataFrame) -> Counter[tuple[Any, ...]]:
        rows = df.groupBy("k").applyInArrow(summarize, SUMMARY).collect()
        return Counter((r.k, r.n, round(r.sx, 6)) for r in rows)

    def got(out: DataFrame) -> Counter[tuple[Any, ...]]:
        return Counter((r.k, r.n, round(r.sx, 6)) for r in out.collect())

    small_out = group_apply(tiny, ["k"], summarize, SUMMARY, path="auto")
    small_route = route_of(small_out)
    assert small_route is not None and small_route.path == "spark", small_route
    assert got(small_out) == want(tiny)
    with pytest.raises(ShuffleConfigError, match="Spark's exchange"):
        shuffle_of(small_out)
    assert release(small_out) == 0

    large_out = group_apply(large, ["k"], summarize, SUMMARY, path="auto")
    large_route = route_of(large_out)
    assert large_route is not None and large_route.path == "arrowbeat", large_route
    assert got(large_out) == want(large)
    large_id = shuffle_of(large_out).shuffle_id
    release(large_out)  # writes the shuffle's rows, its route row among them
    flush_routes()  # the Spark-path row is written in the background: wait for it

    recorded = {r["shuffle_id"]: r for r in route_rows(shuffle_cluster) if r["shuffle_id"] not in earlier}
    assert large_id in recorded
    mine = json.loads(recorded[large_id]["detail"])["route"]
    assert mine["path"] == "arrowbeat" and mine["reason"] == large_route.reason
    assert recorded[large_id]["bytes"] == large_bytes
    spark_rows = [r for r in recorded.values() if json.loads(r["detail"])["route"]["path"] == "spark"]
    assert [json.loads(r["detail"])["route"]["reason"] for r in spark_rows] == [small_route.reason]
    assert spark_rows[0]["bytes"] == tiny_bytes


def test_the_key_forces_a_path_per_query_and_the_argument_wins(shuffle_cluster: ShuffleCluster) -> None:
    spark = shuffle_cluster.spark
    df = keyed(spark.range(0, 3000, numPartitions=2))
    key = "spark.arrowbeat.shuffle.path"

    def per_key(batches: Any) -> Any:
        """Rows per key seen by this task: equal on both paths when each key is in one partition."""
        received = list(batches)
        if not received:
            return
        table = pa.Table.from_batches(received)
        counts = table.group_by("k", use_threads=False).aggregate([([], "count_all")])
        yield from counts.rename_columns(["k", "n"]).to_batches()

    schema = "k int, n bigint"
    spark.conf.set(key, "arrowbeat")
    try:
        forced = partition_apply(df, 3, ["k"], per_key, schema)
        assert route_of(forced) is not None and route_of(forced).path == "arrowbeat"  # type: ignore[union-attr]
        forced_rows = Counter((r.k, r.n) for r in forced.collect())
        assert sum(n for _, n in forced_rows) == 3000
        release(forced)
        spark_path = partition_apply(df, 3, ["k"], per_key, schema, path="spark")
        assert route_of(spark_path).reason == "forced: path=spark"  # type: ignore[union-attr]
        assert Counter((r.k, r.n) for r in spark_path.collect()) == forced_rows
    finally:
        spark.conf.unset(key)
    assert route_of(partition_apply(df, 3, ["k"], per_key, schema)) is None  # unset: as before


def test_a_small_input_is_planned_from_its_size_with_no_map_job_ahead(
    shuffle_cluster: ShuffleCluster,
) -> None:
    """Issue 25, item 2 (cut the small cells' fixed cost): with Spark's partition count and
    ``adaptive=auto``, an input the optimizer sizes small gets its reduce tasks from that size, so
    calling ``group_apply`` runs no map job and caches no status rows; keys stay whole and the
    result is Spark's. ``adaptive=true``, and an input whose estimate may be low (``explode``),
    still run the map side first and pack by the real sizes."""
    spark = shuffle_cluster.spark
    sc = spark.sparkContext
    df = keyed(spark.range(0, 3000, numPartitions=2))

    def jobs_during(group: str, call: Any) -> tuple[DataFrame, list[int]]:
        sc.setJobGroup(group, "what calling group_apply runs")
        try:
            out = call()
            return out, list(sc.statusTracker().getJobIdsForGroup(group))
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    want = Counter(
        (r.k, r.n, round(r.sx, 6)) for r in df.groupBy("k").applyInArrow(summarize, SUMMARY).collect()
    )
    planned, jobs = jobs_during("arrowbeat-planned", lambda: group_apply(df, ["k"], summarize, SUMMARY))
    assert jobs == []
    with shuffle_of(planned) as handle:
        assert handle.persisted is None
        groups = handle.groups
        assert groups is not None and [i for g in groups for i in g] == list(range(5))
        assert len(groups) <= sc.defaultParallelism
        assert Counter((r.k, r.n, round(r.sx, 6)) for r in planned.collect()) == want
        reads = [r for r in handle.reports() if r["side"] == "read"]
        assert sorted(tuple(r["reducers"]) for r in reads) == [(g.start, g.stop - 1) for g in groups]

    spark.conf.set("spark.arrowbeat.shuffle.adaptive", "true")
    try:
        measured, jobs = jobs_during("arrowbeat-measured", lambda: group_apply(df, ["k"], summarize, SUMMARY))
    finally:
        spark.conf.unset("spark.arrowbeat.shuffle.adaptive")
    assert jobs, "adaptive=true runs the map side when called"
    with shuffle_of(measured) as handle:
        assert handle.persisted is not None and handle.groups is not None
        assert Counter((r.k, r.n, round(r.sx, 6)) for r in measured.collect()) == want

    exploded = keyed(
        spark.range(0, 300, numPartitions=2).selectExpr("explode(sequence(id * 10, id * 10 + 9)) AS id")
    )
    assert plan_size(exploded).grows == "Generate"
    grown, jobs = jobs_during("arrowbeat-grows", lambda: group_apply(exploded, ["k"], summarize, SUMMARY))
    assert jobs, "an estimate that may be low is not planned by"
    with shuffle_of(grown) as handle:
        assert handle.persisted is not None
        assert Counter((r.k, r.n, round(r.sx, 6)) for r in grown.collect()) == want
