"""A user's script as the README's quick start writes one, run by the checkout's venv python: a
session built with ``configure`` and ``spark.arrowbeat.shuffle.groupedMap`` set on the builder,
and an unchanged ``df.groupBy("k").applyInPandas(f, schema)``. Nothing of arrowbeat is called for
the job: only the start-up line (``arrowbeat.pth``) can route it.

``python grouped_map_user.py MODE SCRATCH`` prints ``JOB <json>``: whether arrowbeat's exchange is
in the job's plan and its rows; then, with the key set off, ``SPARK <json>``: the same for the same
line on Spark's path (Spark's answer).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from spark_plugin import configure

KEY = "spark.arrowbeat.shuffle.groupedMap"
SCHEMA = "k long, n long, s long"


def stats(pdf: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"k": [pdf["k"].iloc[0]], "n": [len(pdf)], "s": [int(pdf["v"].sum())]})


def described(out: DataFrame) -> dict[str, Any]:
    plan = io.StringIO()
    with contextlib.redirect_stdout(plan):
        out.explain()
    rows = sorted([r["k"], r["n"], r["s"]] for r in out.collect())
    return {"arrowbeat": "arrowbeat_shuffle_write" in plan.getvalue(), "plan": plan.getvalue(), "rows": rows}


def main() -> None:
    mode, scratch = sys.argv[1], sys.argv[2]
    builder = (
        SparkSession.builder.master("local[2]")
        .appName("grouped-map-user")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", f"{scratch}/warehouse")
        .config(KEY, mode)
    )
    spark = configure(builder, delta=False).getOrCreate()
    try:
        df = spark.range(2000).selectExpr("id % 7 AS k", "id AS v")
        print("JOB", json.dumps(described(df.groupBy("k").applyInPandas(stats, SCHEMA))), flush=True)
        spark.conf.set(KEY, "off")
        print("SPARK", json.dumps(described(df.groupBy("k").applyInPandas(stats, SCHEMA))), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
