"""Building and fully stopping PySpark sessions with arrowbeat on, for tests and benchmarks."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from spark_plugin import configure

DELTA_SNAPSHOT_PARTITIONS = ("spark.databricks.delta.snapshotPartitions", "2")
"""Delta rebuilds a table's state in 50 partitions by default: 50 tasks per read of a history
table, each small, which on a 2-core test machine costs tens of seconds per streaming query."""


def build_session(
    master: str, scratch: Path, name: str, conf: dict[str, str] | None = None, delta: bool = True
) -> SparkSession:
    """A session on ``master`` with arrowbeat (and Delta, unless ``delta`` is False) on, small
    memory, no UI, dirs in ``scratch``."""
    builder: Any = (
        SparkSession.builder.master(master)
        .appName(name)
        .config("spark.driver.memory", "1g")
        .config("spark.executor.memory", "512m")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={scratch / 'derby'}")
    )
    builder = configure(builder, delta=delta)
    # Spark's own grouped-map calls are the baselines of tests and benchmarks: never taken over
    # unless one sets the key (the default, auto, would for large inputs where the hook is in).
    builder = builder.config("spark.arrowbeat.shuffle.groupedMap", "off")
    if delta:
        builder = builder.config(*DELTA_SNAPSHOT_PARTITIONS)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()  # type: ignore[no-any-return]


def stop_session(spark: SparkSession) -> None:
    """Stops the session *and* its gateway JVM, so the next module starts from nothing."""
    spark.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        proc = getattr(gateway, "proc", None)
        gateway.shutdown()
        if proc is not None:
            proc.stdin.close()
            proc.wait(timeout=30)
    SparkContext._gateway = None
    SparkContext._jvm = None


@contextlib.contextmanager
def sql_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """The session's runtime conf with ``settings`` for the queries planned inside; each key's
    previous value (or its absence) is put back after."""
    before = {k: spark.conf.get(k, None) for k in settings}
    for k, v in settings.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)
