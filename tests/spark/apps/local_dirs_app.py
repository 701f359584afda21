"""A spark-submit application: one Arrow shuffle, and where its map outputs were on disk.

``local_dirs_app.py DIR [DIR ...]``: runs ``arrow_shuffle.repartition`` with the map outputs
still held, lists the ``*.arrows`` files under each of the given directories (Spark's local dirs
of this run), releases the shuffle, lists again, and prints ``APP-RESULT {json}``: the files per
directory before and after, and whether the shuffle's rows equal Spark's own ``groupBy``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession


def outputs_under(dirs: list[str]) -> dict[str, int]:
    return {d: sum(1 for _ in Path(d).rglob("*.arrows")) for d in dirs}


def main() -> int:
    from spark_plugin.shuffle import release, repartition

    dirs = sys.argv[1:]
    spark = SparkSession.builder.getOrCreate()
    df = spark.range(0, 50_000, numPartitions=8).selectExpr("id", "id % 97 AS k")
    out = repartition(df, 6, "k")
    ours = sorted(tuple(r) for r in out.groupBy("k").count().collect())
    spark_own = sorted(tuple(r) for r in df.groupBy("k").count().collect())
    held = outputs_under(dirs)
    freed = release(out)
    print(
        "APP-RESULT "
        + json.dumps(
            {"held": held, "after": outputs_under(dirs), "freed": freed, "equal": ours == spark_own}
        ),
        flush=True,
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
