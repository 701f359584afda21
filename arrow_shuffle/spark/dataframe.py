"""Arrow shuffle for PySpark DataFrames: ``repartition``, ``group_apply``, ``partition_apply``.

The driver side. Each call builds one lazy plan and returns a DataFrame::

    df.mapInArrow(map_fn, STATUS)              map stage: rows -> map-output files in the agents
      .repartition(R, "rk")                    Spark shuffles only the tiny status rows
      .mapInArrow(reduce_fn, schema)           reduce stage: Arrow straight from the files/agents

so the data goes Python -> Arrow IPC -> Python with no JVM rows in between, while Spark's own
scheduler tracks map outputs (one status per map partition), runs the stages and recomputes lost
map partitions (see ``tasks``). ``rk`` takes, for reduce partition ``r``, a value Spark's hash
partitioner sends to partition ``r``, so reduce task ``r`` reads exactly shuffle partition ``r``.
That is ``mode="materialized"`` (the default: map outputs materialized as files, what Flink
calls a BLOCKING result; ``"blocking"`` is a deprecated alias). ``mode="pipelined"`` runs map
and reduce tasks in one stage, streaming under credits (``pipelined``). A DataFrame made by
``map_in_arrow`` is *chained*: its function runs inside the map task, so generated batches never
become JVM rows at all.

Settings are read through ``spark_plugin.config`` (``from_spark_conf``), the one declaration of
every ``spark.arrowbeat.*`` key: the application's ``SparkConf``, with the session's runtime conf
winning for the keys settable per query (``readHostLocalDisk``). A bad setting raises that
module's ``ConfigError`` naming the key and the expected form; a bad call argument (unknown
column, ``num_partitions=0``, unknown mode) raises the engine's ``ShuffleConfigError``.

Life cycle: ``shuffle_of(out)`` is the shuffle's handle: ``release()`` (or ``with``) deletes its
map outputs in every agent that reported one and appends its rows to the ``shuffle_metrics``
Delta table; agents delete everything when their executor ends, and release forgotten shuffles
after ``spark.arrowbeat.shuffle.ttl``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import random
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from arrow_shuffle.spark.agent_client import MapOutputClient, announced_agents
from arrow_shuffle.spark.agent_service import shuffle_root
from arrow_shuffle.spark.map_output import check_keys
from arrow_shuffle.spark.tasks import (
    STATUS_DDL,
    ShufflePlan,
    client_transport,
    group_consumer,
    map_function,
    partition_consumer,
    passthrough,
    reduce_function,
    server_transport,
)
from spark_plugin.config import OPTIONS, ArrowBeatConfig, from_spark_conf
from spark_plugin.errors import ConfigError
from spark_plugin.tls import from_config as tls_from_config

log = logging.getLogger("arrowbeat.shuffle")

MODES = ("materialized", "pipelined")
"""``materialized``: map outputs written as files, read by reduce tasks in a later stage
(recoverable); ``pipelined``: map and reduce tasks in one stage, streaming under credits."""

DEPRECATED_MODES = {"blocking": "materialized"}
"""Old mode names still accepted, with a ``DeprecationWarning``."""

_PER_QUERY_FIELDS = ("shuffle_read_host_local",)
"""``ArrowBeatConfig`` fields whose key the session's runtime conf may override per query."""


class _ListParam(AccumulatorParam[list[dict[str, Any]]]):
    """Task reports (one dict per map or reduce task) gathered on the driver."""

    def zero(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []

    def addInPlace(self, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
        a.extend(b)
        return a


class ShuffleHandle:
    """One shuffle: its plan, its task reports, and the way to release it."""

    def __init__(self, spark: SparkSession, plan: ShufflePlan, mode: str) -> None:
        self.spark = spark
        self.plan = plan
        self.mode = mode
        self._reports = spark.sparkContext.accumulator([], _ListParam())
        self._written = 0
        self._lock = threading.Lock()
        self.released = False
        _LIVE.add(self)

    @property
    def shuffle_id(self) -> int:
        return self.plan.shuffle_id

    def reporter(self) -> Callable[[dict[str, Any]], None]:
        acc = self._reports

        def report(row: dict[str, Any]) -> None:
            acc.add([row])

        return report

    def reports(self) -> list[dict[str, Any]]:
        """Every map and reduce task report received so far (successful task attempts only)."""
        return list(self._reports.value)

    def agents(self) -> set[tuple[str, int]]:
        return {(str(r["control"][0]), int(r["control"][1])) for r in self.reports() if r["control"]}

    def flush_metrics(self) -> int:
        """Append the reports not yet written to the ``shuffle_metrics`` table; returns rows written."""
        from spark_plugin.history.shuffle_metrics import append_rows, tables_root_of

        with self._lock:
            reports = self.reports()[self._written :]
            if not reports:
                return 0
            everything = self.reports()
            recomputed = {str(a) for r in everything if r["side"] == "read" for _, a in r["recomputed_maps"]}
            for report in reports:  # readers name the map outputs written by a recomputation
                if report["side"] == "write" and report["attempt"] in recomputed:
                    report["recomputed"] = True
                    log.warning(
                        "shuffle %s: map partition %s was recomputed on executor %s",
                        self.shuffle_id,
                        report["partition"],
                        report["executor"],
                    )
            append_rows(tables_root_of(self.spark), self.plan.app_id, self.shuffle_id, reports)
            self._written += len(reports)
            return len(reports)

    def release(self) -> int:
        """Delete this shuffle's data in every agent that holds some; returns bytes freed."""
        with self._lock:
            if self.released:
                return 0
            self.released = True
        freed = 0
        for address in sorted(self.agents() | _local_agents(self.plan)):
            try:
                with MapOutputClient(
                    address,
                    self.plan.secret,
                    f"agent {address[0]}:{address[1]}",
                    transport=client_transport(self.plan),
                ) as client:
                    freed += client.release(self.shuffle_id)
            except ShuffleError as exc:  # an agent that is gone took its data with it
                log.info("release of shuffle %s: %s", self.shuffle_id, exc)
        try:
            self.flush_metrics()
        except Exception as exc:  # metrics must never turn a release into a failure
            log.warning("shuffle_metrics rows of shuffle %s not written: %s", self.shuffle_id, exc)
        _LIVE.discard(self)
        return freed

    def __enter__(self) -> ShuffleHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_LIVE: weakref.WeakSet[ShuffleHandle] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for handle in list(_LIVE):
        with contextlib.suppress(Exception):  # best effort: the session may be gone
            handle.flush_metrics()


def _local_agents(plan: ShufflePlan) -> set[tuple[str, int]]:
    """Agents announced on this host (executors that ran no task of this shuffle hold nothing,
    but a task that failed before reporting may have left a file)."""
    return {agent.control_address for agent in announced_agents(shuffle_root(plan.root), plan.app_id)}


def shuffle_of(df: DataFrame) -> ShuffleHandle:
    """The shuffle behind a DataFrame returned by this module."""
    handle = getattr(df, "_arrowbeat_shuffle", None)
    if not isinstance(handle, ShuffleHandle):
        raise ShuffleConfigError(
            "this DataFrame was not produced by arrow_shuffle.repartition/group_apply/partition_apply"
        )
    return handle


def release(df: DataFrame) -> int:
    """Release the shuffle behind ``df`` (see ``ShuffleHandle.release``)."""
    return shuffle_of(df).release()


# -- building the plan ---------------------------------------------------------------------------
_route_cache: dict[int, tuple[int, ...]] = {}


def _route_keys(spark: SparkSession, n: int) -> tuple[int, ...]:
    """For each r < n, a bigint that Spark's hash partitioning sends to partition r."""
    cached = _route_cache.get(n)
    if cached is not None:
        return cached
    span = 64 * n
    while True:
        rows = (
            spark.range(0, span)
            .selectExpr(f"pmod(hash(id), {n}) AS p", "id")
            .groupBy("p")
            .min("id")
            .collect()
        )
        found = {int(r[0]): int(r[1]) for r in rows}
        if len(found) == n:
            keys = tuple(found[r] for r in range(n))
            _route_cache[n] = keys
            return keys
        span *= 4


def _key(field: str) -> str:
    """The declared ``spark.arrowbeat.*`` key of an ``ArrowBeatConfig`` field."""
    return next(o.key for o in OPTIONS if o.field == field)


def shuffle_settings(spark: SparkSession) -> ArrowBeatConfig:
    """The application's arrowbeat settings as this session sees them, for planning a shuffle.

    The application's ``SparkConf`` is what the plugin started with; the session's runtime conf
    (``spark.conf.set``) wins only for keys declared settable per query. Raises ``ConfigError``
    for a malformed setting, and when the plugin is not on (no secret: no agents to shuffle to)."""
    overrides: dict[str, str] = {}
    for field in _PER_QUERY_FIELDS:
        key = _key(field)
        value = spark.conf.get(key, None)
        if value:
            overrides[key] = str(value)
    settings = from_spark_conf(spark.sparkContext.getConf().getAll(), overrides)
    if not settings.secret:
        raise ConfigError(
            [
                f"{_key('secret')} is unset: arrowbeat is not on in this application; "
                "set spark.plugins=arrowbeat.ArrowBeatPlugin (see spark_plugin.configure)"
            ]
        )
    return settings


def check_mode(mode: str, stacklevel: int = 2) -> str:
    """The mode's current name; ``ShuffleConfigError`` for an unknown one, a warning for an old one.

    The warning points ``stacklevel`` frames up from the caller (1: the caller itself; 2, for
    the public functions: their caller, the user's code)."""
    current = DEPRECATED_MODES.get(mode)
    if current is not None:
        warnings.warn(
            f"mode={mode!r} is deprecated: use mode={current!r} (same behaviour: map outputs "
            "materialized as files)",
            DeprecationWarning,
            stacklevel=stacklevel + 1,
        )
        return current
    if mode not in MODES:
        raise ShuffleConfigError(f"mode={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _plan(
    df: DataFrame, num_partitions: int, key_columns: Sequence[str], mode: str
) -> tuple[SparkSession, ShufflePlan]:
    """The shuffle's plan; ``mode`` is already checked (``check_mode``)."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
        raise ShuffleConfigError(
            f"num_partitions={num_partitions!r} is out of range: expected an integer >= 1"
        )
    spark = df.sparkSession
    schema = to_arrow_schema(df.schema)
    check_keys(schema, list(key_columns))
    settings = shuffle_settings(spark)
    plan = ShufflePlan(
        app_id=spark.sparkContext.applicationId,
        shuffle_id=random.randrange(1, 1 << 31),
        root=settings.shuffle_dir,  # resolved on each executor (shuffle_root), as its user
        secret=settings.secret,
        key_columns=tuple(key_columns),
        num_partitions=num_partitions,
        schema_ipc=schema.serialize().to_pybytes(),
        route_keys=_route_keys(spark, num_partitions),
        memory_bytes=settings.shuffle_map_memory_bytes,
        read_host_local=settings.shuffle_read_host_local,
        tls=tls_from_config(settings),  # the driver's SparkConf holds what the executors got
    )
    return spark, plan


_rendezvous_lock = threading.Lock()
_rendezvous_of: dict[str, Any] = {}


def _rendezvous(spark: SparkSession, plan: ShufflePlan) -> Any:
    """The driver's rendezvous for pipelined map tasks, one per application, started on first use."""
    from arrow_shuffle.spark.rendezvous import Rendezvous

    app = spark.sparkContext.applicationId
    with _rendezvous_lock:
        found = _rendezvous_of.get(app)
        if found is None:
            host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1") or "127.0.0.1"
            found = _rendezvous_of[app] = Rendezvous(plan.secret, host, transport=server_transport(plan))
        return found


def _check_pipelined(spark: SparkSession, source: DataFrame, num_partitions: int) -> int:
    """Streaming needs every map and reduce task running at once: refuse up front, not deadlock.

    Returns the number of map tasks."""
    slots = spark.sparkContext.defaultParallelism
    maps = source.rdd.getNumPartitions()
    if maps + num_partitions > slots:
        raise ShuffleConfigError(
            f"mode='pipelined' needs {maps} map + {num_partitions} reduce tasks running at once, but the "
            f"application has {slots} task slots: use mode='materialized', fewer partitions or more executors"
        )
    return maps


def _build(
    df: DataFrame,
    spark: SparkSession,
    plan: ShufflePlan,
    mode: str,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    out_schema: StructType,
) -> DataFrame:
    handle = ShuffleHandle(spark, plan, mode)
    report = handle.reporter()
    statuses: DataFrame
    chained = getattr(df, "_arrowbeat_chain", None)
    if mode == "pipelined":
        from arrow_shuffle.spark.pipelined import pipelined_function

        source, pre = chained if chained is not None else (df, None)
        maps = _check_pipelined(spark, source, plan.num_partitions)
        fn = pipelined_function(plan, maps, _rendezvous(spark, plan).address, report, consume, pre)
        reducers = spark.range(0, plan.num_partitions, numPartitions=plan.num_partitions)
        pipelined: DataFrame = source.mapInArrow(fn, out_schema).union(reducers.mapInArrow(fn, out_schema))
        pipelined._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
        return pipelined
    if chained is not None:  # run the producing mapInArrow inside the map task: no JVM in between
        parent, pre = chained
        statuses = parent.mapInArrow(map_function(plan, report, pre), STATUS_DDL)
    else:
        statuses = df.mapInArrow(map_function(plan, report), STATUS_DDL)
    out = statuses.repartition(plan.num_partitions, "rk").mapInArrow(
        reduce_function(plan, report, consume), out_schema
    )
    out._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
    return out


def _struct(spark: SparkSession, schema: StructType | str) -> StructType:
    if isinstance(schema, StructType):
        return schema
    parsed = spark.createDataFrame([], schema).schema
    return parsed


def map_in_arrow(
    df: DataFrame,
    func: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]],
    schema: StructType | str,
) -> DataFrame:
    """``df.mapInArrow(func, schema)`` that an arrowbeat shuffle after it *chains*.

    The result is an ordinary DataFrame. When it is the input of ``repartition``,
    ``group_apply`` or ``partition_apply``, the map task runs ``func`` and the shuffle write in
    one Python worker (Flink's operator chaining), so its batches never become JVM rows."""
    out = df.mapInArrow(func, schema)
    out._arrowbeat_chain = (df, func)  # type: ignore[attr-defined]
    return out


def repartition(
    df: DataFrame, num_partitions: int, *key_columns: str, mode: str = "materialized"
) -> DataFrame:
    """Like ``df.repartition(num_partitions, *key_columns)``: same rows, each key in one partition."""
    mode = check_mode(mode)
    spark, plan = _plan(df, num_partitions, key_columns, mode)
    return _build(df, spark, plan, mode, passthrough, df.schema)


def partition_apply(
    df: DataFrame,
    num_partitions: int,
    key_columns: Sequence[str],
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
    mode: str = "materialized",
) -> DataFrame:
    """Like ``df.repartition(n, *keys).mapInArrow(func, schema)`` without Arrow -> JVM -> Arrow between."""
    mode = check_mode(mode)
    spark, plan = _plan(df, num_partitions, list(key_columns), mode)
    out_schema = _struct(spark, schema)
    return _build(df, spark, plan, mode, partition_consumer(func, to_arrow_schema(out_schema)), out_schema)


def group_apply(
    df: DataFrame,
    key_columns: Sequence[str],
    func: Callable[[pa.Table], pa.Table],
    schema: StructType | str,
    num_partitions: int | None = None,
    mode: str = "materialized",
) -> DataFrame:
    """Like ``df.groupBy(*keys).applyInArrow(func, schema)``: ``func`` once per key group.

    Groups are found in Arrow in the reduce task (``grouping.iter_groups``), not by a JVM sort."""
    mode = check_mode(mode)
    spark = df.sparkSession
    n = num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 200)
    spark, plan = _plan(df, n, list(key_columns), mode)
    out_schema = _struct(spark, schema)
    consume = group_consumer(func, plan.key_columns, plan.schema, to_arrow_schema(out_schema))
    return _build(df, spark, plan, mode, consume, out_schema)


__all__ = [
    "ShuffleHandle",
    "group_apply",
    "map_in_arrow",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]
