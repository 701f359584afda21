"""An Arrow pipeline on arrowbeat's shuffle next to the same pipeline on Spark's (spark-submit-able).

Data: ``mapInArrow`` generates ``--rows`` rows (int64 ``key`` over 100k values, three float64,
one short string). Two pipelines, each timed on Spark's shuffle and on arrowbeat's, in one
application so both see the same machine:

1. generate -> shuffle by key -> per-group Arrow aggregation
   (Spark: ``groupBy("key").applyInArrow``; arrowbeat: ``arrow_shuffle.group_apply``);
2. cached DataFrame -> repartition by key -> ``mapInArrow``
   (Spark: ``repartition(n, "key").mapInArrow``; arrowbeat: ``arrow_shuffle.partition_apply``),
   plus the same ``mapInArrow`` with no shuffle: the JVM -> Arrow floor no shuffle removes.

Every pipeline ends in Spark's ``noop`` sink, so all of it is computed and nothing is collected.
The functions here are shared with ``benchmarks/shuffle_vs_spark.py``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

KEYS = 100_000
DATA_DDL = "key bigint, a double, b double, c double, tag string"
AGG_DDL = "key bigint, n bigint, sum_a double, mean_b double, max_c double"
MAPPED_DDL = "key bigint, y double, tag string"


def generator(rows: int, parts: int) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow`` function: partition ``i`` of ``spark.range(parts)`` yields its share of rows."""

    def gen(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for part in batch.column(0).to_pylist():
                rng = np.random.default_rng(part)
                left = rows // parts + (1 if part < rows % parts else 0)
                while left > 0:
                    n = min(left, 1 << 17)
                    left -= n
                    key = rng.integers(0, KEYS, n, dtype=np.int64)
                    tag = pa.array(np.char.add("t", (key % 97).astype(str)))
                    yield pa.record_batch(
                        {
                            "key": key,
                            "a": rng.random(n),
                            "b": rng.random(n),
                            "c": rng.random(n),
                            "tag": tag,
                        }
                    )

    return gen


def generated(spark: SparkSession, rows: int, parts: int, chained: bool = False) -> DataFrame:
    """The generated data; ``chained`` marks it for arrowbeat's map-side chaining (same rows)."""
    seeds = spark.range(0, parts, numPartitions=parts)
    if chained:
        from spark_plugin.shuffle import map_in_arrow

        return map_in_arrow(seeds, generator(rows, parts), DATA_DDL)
    return seeds.mapInArrow(generator(rows, parts), DATA_DDL)


def aggregate(group: pa.Table) -> pa.Table:
    """One group -> one row (the per-group Arrow aggregation of pipeline 1)."""
    return pa.table(
        {
            "key": pa.array([group.column("key")[0].as_py()], pa.int64()),
            "n": pa.array([group.num_rows], pa.int64()),
            "sum_a": pa.array([pc.sum(group.column("a")).as_py()], pa.float64()),
            "mean_b": pa.array([pc.mean(group.column("b")).as_py()], pa.float64()),
            "max_c": pa.array([pc.max(group.column("c")).as_py()], pa.float64()),
        }
    )


def transform(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Per batch Arrow work (the ``mapInArrow`` of pipeline 2)."""
    for b in batches:
        y = pc.add(pc.multiply(b.column("a"), b.column("b")), b.column("c"))
        yield pa.record_batch({"key": b.column("key"), "y": y, "tag": b.column("tag")})


def run_noop(df: DataFrame) -> float:
    """Compute all of ``df`` into Spark's ``noop`` sink; seconds taken."""
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def pipelines(spark: SparkSession, rows: int, parts: int, reducers: int) -> dict[str, Callable[[], float]]:
    """The timed steps by name; each returns seconds. ``cached`` must be built first."""
    from spark_plugin.shuffle import group_apply, partition_apply, shuffle_of

    state: dict[str, Any] = {}

    def spark_group() -> float:
        return run_noop(generated(spark, rows, parts).groupBy("key").applyInArrow(aggregate, AGG_DDL))

    def arrow_group() -> float:
        """The generator chained into the map task (``arrow_shuffle.map_in_arrow``)."""
        source = generated(spark, rows, parts, chained=True)
        out = group_apply(source, ["key"], aggregate, AGG_DDL, num_partitions=reducers)
        with shuffle_of(out):
            return run_noop(out)

    def arrow_group_unchained() -> float:
        """The same on a plain ``mapInArrow`` DataFrame: its rows go through the JVM once."""
        out = group_apply(generated(spark, rows, parts), ["key"], aggregate, AGG_DDL, num_partitions=reducers)
        with shuffle_of(out):
            return run_noop(out)

    def cache() -> float:
        started = time.perf_counter()
        state["cached"] = generated(spark, rows, parts).cache()
        state["cached"].count()
        return time.perf_counter() - started

    def floor() -> float:
        return run_noop(state["cached"].mapInArrow(transform, MAPPED_DDL))

    def spark_repartition() -> float:
        return run_noop(state["cached"].repartition(reducers, "key").mapInArrow(transform, MAPPED_DDL))

    def arrow_repartition() -> float:
        out = partition_apply(state["cached"], reducers, ["key"], transform, MAPPED_DDL)
        with shuffle_of(out):
            return run_noop(out)

    def uncache() -> float:
        state["cached"].unpersist(blocking=True)
        return 0.0

    return {
        "spark_group": spark_group,
        "arrow_group": arrow_group,
        "arrow_group_unchained": arrow_group_unchained,
        "cache": cache,
        "floor": floor,
        "spark_repartition": spark_repartition,
        "arrow_repartition": arrow_repartition,
        "uncache": uncache,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--parts", type=int, default=8, help="map partitions of the generated data")
    parser.add_argument("--reducers", type=int, default=8, help="shuffle partitions")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("arrowbeat-arrow-pipeline").getOrCreate()
    # Spark's own groupBy().applyInArrow is the baseline: arrowbeat must not take it over (the
    # installed wheel's default, groupedMap=auto, would for inputs this large).
    spark.conf.set("spark.arrowbeat.shuffle.groupedMap", "off")
    for warm_up in pipelines(spark, 100_000, 2, 2).values():  # start Python workers, load classes
        warm_up()
    steps = pipelines(spark, args.rows, args.parts, args.reducers)
    t = {name: step() for name, step in steps.items()}
    floor = t["floor"]
    lines = [
        f"rows={args.rows:,} map partitions={args.parts} shuffle partitions={args.reducers}",
        "1. generate -> shuffle by key -> per-group Arrow aggregation",
        f"   Spark groupBy().applyInArrow             {t['spark_group']:7.2f} s",
        f"   arrowbeat group_apply (chained map)      {t['arrow_group']:7.2f} s   "
        f"{t['spark_group'] / t['arrow_group']:.2f}x",
        f"   arrowbeat group_apply (plain mapInArrow) {t['arrow_group_unchained']:7.2f} s   "
        f"{t['spark_group'] / t['arrow_group_unchained']:.2f}x",
        "2. cached -> repartition by key -> mapInArrow",
        f"   no shuffle (floor)                       {floor:7.2f} s",
        f"   Spark repartition + mapInArrow           {t['spark_repartition']:7.2f} s   "
        f"shuffle cost {t['spark_repartition'] - floor:6.2f} s",
        f"   arrowbeat partition_apply                {t['arrow_repartition']:7.2f} s   "
        f"shuffle cost {t['arrow_repartition'] - floor:6.2f} s",
    ]
    print("\n".join(lines))
    spark.stop()


if __name__ == "__main__":
    main()
