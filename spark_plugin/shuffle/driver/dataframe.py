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

Partition counts follow Spark's: an explicit count in ``repartition``/``partition_apply`` is kept
exactly; otherwise (and for ``group_apply`` always) the count is an upper bound, and with
``spark.arrowbeat.shuffle.adaptive`` on the map side runs when the function is called and contiguous
reduce partitions are packed into tasks by their real sizes (``adaptive``, ``_coalesced``), as AQE
packs a ``groupBy``'s between query stages; an input the optimizer sizes as small gets its tasks
from that size, with no map job ahead (``adaptive.planned_groups``, ``_planned``).

Settings are read through ``spark_plugin.settings.config`` (``from_spark_conf``), the one declaration of
every ``spark.arrowbeat.*`` key: the application's ``SparkConf``, with the session's runtime conf
winning for the keys settable per query (``readHostLocalDisk``). A bad setting raises that
module's ``ConfigError`` naming the key and the expected form; a bad call argument (unknown
column, ``num_partitions=0``, unknown mode) raises the engine's ``ShuffleConfigError``.

Spark Connect sessions (no SparkContext, no py4j, no accumulators; what the session is comes from
``spark_plugin.compat.connect``): the application's settings are the session's conf, less the
entries Spark withholds from clients (the secret: tasks get it from their own agent,
``tasks.keyed``); a shuffle id is a probe job's stage id, offset above Spark's own shuffle ids
(``session``); the map side runs when the function is called (as an adaptive shuffle's does) and
its status rows are the map tasks' reports; ``release`` runs as one task inside the cluster.
Reduce tasks report nowhere there, so ``shuffle_metrics`` gets the map side's rows only (written
by ``release()``, not at exit).
``mode="pipelined"`` and ``spark.arrowbeat.ssl.enabled`` are refused when called, naming what to
use instead. ``map_in_arrow`` chains the same way on both.

Life cycle: ``shuffle_of(out)`` is the shuffle's handle: ``release()`` (or ``with``) deletes its
map outputs in every agent that reported one and appends its rows to the ``shuffle_metrics``
Delta table; agents delete everything when their executor ends, and release forgotten shuffles
after ``spark.arrowbeat.shuffle.ttl``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from spark_plugin.compat.accumulators import discard as discard_accumulator
from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.compat.connect import is_connect, unsupported
from spark_plugin.compat.plan_stats import PlanSize, plan_size
from spark_plugin.errors import ConfigError
from spark_plugin.history.storage import tables_root
from spark_plugin.settings.config import OPTIONS, ArrowBeatConfig, from_spark_conf
from spark_plugin.settings.tls import from_config as tls_from_config
from spark_plugin.settings.units import parse_duration
from spark_plugin.shuffle.agent_layout import written_by
from spark_plugin.shuffle.driver.adaptive import (
    CoalesceSettings,
    coalesce,
    planned_groups,
    route_keys,
    settings_from_sql_conf,
)
from spark_plugin.shuffle.driver.direct_scan import BATCH_ROWS, DirectScan, plan_direct_scan, scan_function
from spark_plugin.shuffle.driver.route import (
    Route,
    record_spark_path,
    report,
    route_of,
    routed,
    spark_group_apply,
    spark_partition_apply,
    spark_repartition,
)
from spark_plugin.shuffle.driver.route import mark as mark_route
from spark_plugin.shuffle.driver.session import (
    app_id,
    arrow_batch_rows,
    conf_entries,
    conf_value,
    default_parallelism,
    new_shuffle_id,
)
from spark_plugin.shuffle.map_output import check_keys
from spark_plugin.shuffle.worker.tasks import (
    CARRIED_DDL,
    REPORT_COLUMNS,
    STATUS_DDL,
    ShufflePlan,
    agent_client,
    carry_function,
    group_consumer,
    map_function,
    partition_consumer,
    passthrough,
    reduce_function,
    release_function,
    server_transport,
    unreported,
    write_reports,
)

log = logging.getLogger("arrowbeat.shuffle")

MODES = ("materialized", "pipelined")
"""``materialized``: map outputs written as files, read by reduce tasks in a later stage
(recoverable); ``pipelined``: map and reduce tasks in one stage, streaming under credits."""

DEPRECATED_MODES = {"blocking": "materialized"}
"""Old mode names still accepted, with a ``DeprecationWarning``."""

Coalescing = bool | tuple[range, ...]
"""How a shuffle's reduce partitions become tasks: ``False`` one task each, ``True`` packed by their
real sizes once the map side ran (eagerly), a tuple: these groups, planned from the optimizer's size."""

_PER_QUERY_FIELDS = (
    "shuffle_read_host_local",
    "shuffle_adaptive",
    "shuffle_reduce_memory_bytes",
    "shuffle_direct_scan",
)
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
        self.connect = is_connect(spark)
        """Made from a Spark Connect session: no accumulator, reports from the eager map side."""
        self._reports = None if self.connect else spark.sparkContext.accumulator([], _ListParam())
        self._collected: list[dict[str, Any]] = []
        self._let_go: Callable[[], Any] | None = None
        """Drops the accumulator's reports from PySpark's registry (``compat.accumulators``): at
        release, or when the handle is gone (then nothing could read them any more)."""
        if self._reports is not None:
            self._let_go = weakref.finalize(self, discard_accumulator, self._reports.aid)
        self._written_keys: set[tuple[str, int, str, bool]] = set()
        self._lock = threading.Lock()
        self.released = False
        self.persisted: DataFrame | None = None
        """The status rows of an adaptive shuffle, persisted when its map side ran (``_coalesced``)."""
        self.groups: list[range] | None = None
        """The reduce partitions each task of an adaptive shuffle reads: once the map side ran, or
        planned from the input's size (then ``persisted`` stays None)."""
        _LIVE.add(self)

    @property
    def shuffle_id(self) -> int:
        return self.plan.shuffle_id

    def reporter(self) -> Callable[[dict[str, Any]], None]:
        """What tasks call with their report: an accumulator's ``add``, or on Spark Connect (no
        accumulators) nothing: the map side's reports come back as its status rows instead."""
        acc = self._reports
        if acc is None:
            return unreported

        def report(row: dict[str, Any]) -> None:
            acc.add([row])

        return report

    def collected(self, reports: Iterable[dict[str, Any]]) -> None:
        """Reports the driver rebuilt itself (the map side's, from its status rows on Spark Connect)."""
        with self._lock:
            self._collected.extend(reports)

    def reports(self) -> list[dict[str, Any]]:
        """Every map and reduce task report received so far (successful task attempts only).

        On Spark Connect only the map side's, rebuilt from the status rows collected when the
        shuffle was made: reduce tasks, and map tasks Spark reruns later, report nowhere there."""
        received = [] if self._reports is None else list(self._reports.value)
        return received + list(self._collected)

    def agents(self) -> set[tuple[str, int]]:
        return {(str(r["control"][0]), int(r["control"][1])) for r in self.reports() if r["control"]}

    def flush_metrics(self) -> int:
        """Append the reports not yet written to the ``shuffle_metrics`` table; returns rows written.

        One row per (side, partition, attempt number, recomputed or not), however often the
        DataFrame is evaluated: a second evaluation (or an accumulator update Spark applies twice)
        repeats a key already written and is dropped; a recomputed partition is a row of its own,
        marked ``recomputed``."""
        from spark_plugin.history.shuffle_metrics import append_rows

        with self._lock:
            everything = self.reports()
            recomputed = {str(a) for r in everything if r["side"] == "read" for _, a in r["recomputed_maps"]}
            damaged = self._damaged_outputs(everything, recomputed)
            fresh = []
            for report in everything:
                if report["side"] == "write" and report["attempt"] in recomputed:
                    report["recomputed"] = True  # readers name the map outputs of a recomputation
                found = damaged.get(int(report["partition"])) if report["side"] == "write" else None
                if found is not None and _stage(report["attempt"]) > found[0]:
                    report["recomputed"] = True  # written again: its first output was damaged
                    report["corrupt"] = found[1]
                key = _metric_key(report)
                if key in self._written_keys:
                    continue
                self._written_keys.add(key)
                fresh.append(report)
                if report["side"] == "write" and report["recomputed"]:
                    log.warning(
                        "shuffle %s: map partition %s was recomputed on executor %s",
                        self.shuffle_id,
                        report["partition"],
                        report["executor"],
                    )
            if not fresh:
                return 0
            try:
                append_rows(_tables_location(self.spark), self.plan.app_id, self.shuffle_id, fresh)
            except BaseException:
                self._written_keys.difference_update(_metric_key(r) for r in fresh)
                raise
            return len(fresh)

    def _damaged_outputs(
        self, reports: list[dict[str, Any]], recomputed: set[str]
    ) -> dict[int, tuple[int, dict[str, str]]]:
        """Map partition -> the stage of its output that was found damaged, and where and how
        (the agents removed the damaged files and keep what they found, ``corrupt_outputs``).
        Asked only when some map partition was written in more than one stage, or a reader named a
        recomputation: when every map partition reran, no reader can tell. Empty on Spark Connect
        (no secret here) and for agents that are gone."""
        stages: dict[int, set[int]] = {}
        for r in reports:
            if r["side"] == "write" and _stage(r["attempt"]) >= 0:
                stages.setdefault(int(r["partition"]), set()).add(_stage(r["attempt"]))
        rewritten = any(len(s) > 1 for s in stages.values())
        if not (rewritten or recomputed) or self.connect:
            return {}
        executors = {
            (str(r["control"][0]), int(r["control"][1])): str(r["executor"]) for r in reports if r["control"]
        }
        found: dict[int, tuple[int, dict[str, str]]] = {}
        for address in sorted(self.agents()):
            try:
                with agent_client(self.plan, address) as client:
                    for partition, path, detail in client.corrupt_outputs(self.shuffle_id):
                        where = {"executor": executors.get(address, ""), "file": path, "found": detail}
                        found[int(partition)] = (_stage(written_by(path) or ""), where)
            except ShuffleError as exc:
                log.info("damaged outputs of shuffle %s not asked of %s: %s", self.shuffle_id, address, exc)
        return found

    def release(self) -> int:
        """Delete this shuffle's data in every agent that reported some; returns bytes freed.

        Only agents the map tasks named: the driver knows no path of an executor's disks. Files
        of an attempt that never reported go with the TTL sweep or their executor."""
        with self._lock:
            if self.released:
                return 0
            self.released = True
        if self.mode == "pipelined":  # its map tasks unregister as they end; whatever is left goes
            _forget_pipelined(self.plan.app_id, self.shuffle_id)
        freed = self._release_from_cluster() if self.connect else self._release_from_here()
        if self.persisted is not None:
            with contextlib.suppress(Exception):  # the session may be stopping
                self.persisted.unpersist()
        try:
            self.flush_metrics()
        except Exception as exc:  # metrics must never turn a release into a failure
            log.warning("shuffle_metrics rows of shuffle %s not written: %s", self.shuffle_id, exc)
        self._keep_reports()
        _LIVE.discard(self)
        return freed

    def _keep_reports(self) -> None:
        """Move the task reports out of PySpark's accumulator registry into this handle: a
        released shuffle takes no more, and PySpark would keep them for the process's life (20 MB
        per 1,000 shuffles of a streaming query); they go with the handle."""
        acc = self._reports
        if acc is None:
            return
        with self._lock:
            self._collected[:0] = list(acc.value)
            self._reports = None
        if self._let_go is not None:
            self._let_go()

    def _release_from_here(self) -> int:
        """The driver process calls each agent (it is in the cluster and holds the secret)."""
        freed = 0
        for address in sorted(self.agents()):
            try:
                with agent_client(self.plan, address) as client:
                    freed += client.release(self.shuffle_id)
            except ShuffleError as exc:  # an agent that is gone took its data with it
                log.info("release of shuffle %s: %s", self.shuffle_id, exc)
        return freed

    def _release_from_cluster(self) -> int:
        """A Spark Connect client may be outside the cluster and never sees the secret: one task
        calls the agents instead (``tasks.release_function``), keyed by its own agent."""
        agents = sorted(self.agents())
        if not agents:
            return 0
        try:
            table = (
                self.spark.range(0, 1, numPartitions=1)
                .mapInArrow(release_function(self.plan, agents), "freed bigint")
                .toArrow()
            )
        except Exception as exc:  # a stopped session: the agents' TTL and exit clean up
            log.info("release of shuffle %s: its release task did not run: %s", self.shuffle_id, exc)
            return 0
        return int(sum(v or 0 for v in table.column("freed").to_pylist()))

    def __enter__(self) -> ShuffleHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _tables_location(spark: SparkSession) -> Any:
    """``spark.arrowbeat.tables.path`` of the application as this session sees it (on Spark
    Connect, without the conf entries Spark withholds from clients, e.g. cloud credentials)."""
    from spark_plugin.history.storage import locate

    entries = conf_entries(spark)
    root = tables_root(from_spark_conf(entries), dict(entries))
    return root if isinstance(root, Path) else locate(root, dict(entries))


def _stage(attempt: object) -> int:
    """The stage of a materialized map attempt (``stage.taskAttemptId.attemptNumber``); -1 for
    any other (a pipelined one names no stage)."""
    text = str(attempt)
    return int(text.split(".")[0]) if re.fullmatch(r"\d+\.\d+\.\d+", text) else -1


def _metric_key(report: dict[str, Any]) -> tuple[str, int, str, bool]:
    """A report's identity in ``shuffle_metrics``: side, partition, Spark's attempt number (the
    last part of ``stage.taskAttemptId.attemptNumber``) and whether it was a recomputation."""
    return (
        str(report["side"]),
        int(report["partition"]),
        str(report["attempt"]).rsplit(".", 1)[-1],
        bool(report["recomputed"]),
    )


_LIVE: weakref.WeakSet[ShuffleHandle] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """Metrics of shuffles never released, written at interpreter exit. Not those of Spark
    Connect sessions: locating the tables asks the server, and a client's gRPC retries against a
    server already gone would hold the exit for minutes."""
    for handle in list(_LIVE):
        if handle.connect:
            continue
        with contextlib.suppress(Exception):  # best effort: the session may be gone
            handle.flush_metrics()


def _attached(df: DataFrame, name: str) -> Any:
    """What this module attached to ``df`` under ``name``, or None. Read from the instance itself:
    a Spark Connect DataFrame answers unknown attributes by asking the server for its columns."""
    return getattr(df, "__dict__", {}).get(name)


def shuffle_of(df: DataFrame) -> ShuffleHandle:
    """The shuffle behind a DataFrame returned by this module."""
    handle = _attached(df, "_arrowbeat_shuffle")
    route = route_of(df)
    if not isinstance(handle, ShuffleHandle) and route is not None:
        raise ShuffleConfigError(
            f"this DataFrame ran on Spark's exchange, not arrowbeat's ({route.reason}): it has no "
            "arrowbeat shuffle; pass path='arrowbeat' to force one"
        )
    if not isinstance(handle, ShuffleHandle):
        raise ShuffleConfigError(
            "this DataFrame was not produced by arrow_shuffle.repartition/group_apply/partition_apply"
        )
    return handle


def release(df: DataFrame) -> int:
    """Release the shuffle behind ``df`` (see ``ShuffleHandle.release``); 0 for a call that was
    routed to Spark's exchange (``route``), which holds nothing of arrowbeat's."""
    if route_of(df) is not None and not isinstance(_attached(df, "_arrowbeat_shuffle"), ShuffleHandle):
        return 0
    return shuffle_of(df).release()


def _routed_out(out: DataFrame, route: Route | None) -> DataFrame:
    """Record a decided route: with the shuffle's own rows (arrowbeat's path), or on its own."""
    if route is None:
        return out
    if route.path == "spark":
        record_spark_path(out.sparkSession, route)
    else:
        shuffle_of(out).collected([report(route)])
    return mark_route(out, route)


# -- building the plan ---------------------------------------------------------------------------
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
    settings = from_spark_conf(conf_entries(spark), overrides)
    # Spark Connect never shows a client the secret: the driver-side process's address says the
    # plugin is on, and the tasks get the secret from their agents.
    if not settings.secret and not (is_connect(spark) and settings.rm_address):
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
) -> tuple[SparkSession, ShufflePlan, ArrowBeatConfig]:
    """The shuffle's plan and the settings it was made with; ``mode`` is already checked."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
        raise ShuffleConfigError(
            f"num_partitions={num_partitions!r} is out of range: expected an integer >= 1"
        )
    spark = df.sparkSession
    schema = to_arrow_schema(df.schema)
    check_keys(schema, list(key_columns))
    settings = shuffle_settings(spark)
    if settings.ssl_enabled and is_connect(spark):
        raise ShuffleConfigError(
            unsupported(
                "an arrowbeat shuffle with spark.arrowbeat.ssl.enabled=true",
                "Spark Connect withholds the TLS key from clients and the tasks could not rebuild it",
                "use a classic SparkSession for it, or Spark's own shuffle (df.repartition, groupBy)",
            )
        )
    plan = ShufflePlan(
        app_id=app_id(spark),
        shuffle_id=new_shuffle_id(spark),
        root=settings.shuffle_dir,  # resolved on each executor (shuffle_roots), as its user
        secret=settings.secret,  # empty on Spark Connect: the tasks ask their agents (tasks.keyed)
        key_columns=tuple(key_columns),
        num_partitions=num_partitions,
        schema_ipc=schema.serialize().to_pybytes(),
        route_keys=route_keys(num_partitions),
        memory_bytes=settings.shuffle_map_memory_bytes,
        reduce_memory_bytes=settings.shuffle_reduce_memory_bytes,
        read_host_local=settings.shuffle_read_host_local,
        checksum=settings.shuffle_checksum,
        lost_wait_s=_retry_wait_s(spark),
        tls=tls_from_config(settings),  # the driver's SparkConf holds what the executors got
    )
    return spark, plan, settings


def _retry_wait_s(spark: SparkSession) -> float:
    """``spark.shuffle.io.retryWait`` (Spark reads it in seconds: a bare number is seconds)."""
    text = conf_value(spark, "spark.shuffle.io.retryWait", "5s")
    try:
        return parse_duration(text, bare_unit="s")
    except ValueError:
        raise ConfigError([f"spark.shuffle.io.retryWait={text!r}: expected a duration like 5s"]) from None


_ADAPTIVE_SQL_KEYS = (
    "spark.sql.adaptive.enabled",
    "spark.sql.adaptive.coalescePartitions.enabled",
    "spark.sql.adaptive.advisoryPartitionSizeInBytes",
    "spark.sql.adaptive.coalescePartitions.minPartitionSize",
    "spark.sql.adaptive.coalescePartitions.parallelismFirst",
    "spark.sql.adaptive.coalescePartitions.minPartitionNum",
)


def _sql_conf(spark: SparkSession) -> dict[str, str]:
    """The session's adaptive-execution settings that are set (Spark's defaults apply otherwise)."""
    found = {}
    for key in _ADAPTIVE_SQL_KEYS:
        value = spark.conf.get(key, None)
        if value is not None and value != "<undefined>":
            found[key] = str(value)
    return found


def adaptive_enabled(settings: ArrowBeatConfig, sql_conf: dict[str, str]) -> bool:
    """``spark.arrowbeat.shuffle.adaptive``: ``true``/``false``, or ``auto`` = what AQE would do
    (``spark.sql.adaptive.enabled`` and ``...coalescePartitions.enabled``, both true by default)."""
    if settings.shuffle_adaptive != "auto":
        return settings.shuffle_adaptive == "true"
    on = (
        sql_conf.get("spark.sql.adaptive.enabled", "true"),
        sql_conf.get("spark.sql.adaptive.coalescePartitions.enabled", "true"),
    )
    return all(v.strip().lower() == "true" for v in on)


_rendezvous_lock = threading.Lock()
_rendezvous_of: dict[str, Any] = {}


def _rendezvous(spark: SparkSession, plan: ShufflePlan) -> Any:
    """The driver's rendezvous for pipelined map tasks, one per application, started on first use
    (and the previous application's closed).

    It holds running shuffles only: map tasks unregister as they end, ``ShuffleHandle.release``
    forgets the rest, and what nobody touched for ``spark.arrowbeat.shuffle.ttl`` is swept."""
    from spark_plugin.shuffle.driver.rendezvous import Rendezvous

    app = spark.sparkContext.applicationId
    with _rendezvous_lock:
        found = _rendezvous_of.get(app)
        if found is None:
            # A process runs one SparkContext at a time: an earlier application's is over.
            for ended in _rendezvous_of.values():
                ended.close()
            _rendezvous_of.clear()
            host = conf_value(spark, "spark.driver.host", "127.0.0.1")
            ttl_s = shuffle_settings(spark).shuffle_ttl_s
            found = _rendezvous_of[app] = Rendezvous(
                plan.secret, host, transport=server_transport(plan), ttl_s=ttl_s
            )
        return found


def _forget_pipelined(app: str, shuffle: int) -> None:
    """Drop a released pipelined shuffle's rendezvous entries (in this process: no call)."""
    with _rendezvous_lock:
        found = _rendezvous_of.get(app)
    if found is not None:
        found.forget(shuffle)


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


def _reducer_rows(spark: SparkSession, num_partitions: int) -> DataFrame:
    """One row per reduce task, in a plan that reports no output partitioning.

    ``spark.range`` reports ``SinglePartition`` for one partition, and so does a one-partition map
    side; Spark 4.1+ (``spark.sql.unionOutputPartitioning``, on by default) then runs a union of
    such children partition by partition, putting the map task and its reducer in ONE task, which
    waits on itself. An RDD scan reports an unknown partitioning, which never matches another, so
    the union keeps its children's tasks apart on every version."""
    rows = spark.sparkContext.parallelize([(i,) for i in range(num_partitions)], num_partitions)
    return spark.createDataFrame(rows, "id bigint")


def _check_one_stage(pipelined: DataFrame, maps: int, num_partitions: int) -> None:
    """Refuse a plan Spark would not run as ``maps + num_partitions`` separate tasks.

    Asks the planned RDD itself, so a future Spark that merges union partitions in a new way is
    refused with a clear error instead of a map task waiting for reducers that run after it."""
    tasks = pipelined.rdd.getNumPartitions()
    if tasks != maps + num_partitions:
        raise ShuffleConfigError(
            f"mode='pipelined' needs its {maps} map and {num_partitions} reduce tasks as separate tasks "
            f"of one stage, but this Spark plans their union as {tasks} tasks (it merges the union's "
            "partitions, e.g. spark.sql.unionOutputPartitioning), so a map task would wait on reducers "
            "that cannot run: use mode='materialized'"
        )


def _build(
    df: DataFrame,
    spark: SparkSession,
    plan: ShufflePlan,
    mode: str,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    out_schema: StructType,
    adaptive: Coalescing = False,
) -> DataFrame:
    handle = ShuffleHandle(spark, plan, mode)
    report = handle.reporter()
    chained = _attached(df, "_arrowbeat_chain")
    if mode == "pipelined":
        from spark_plugin.shuffle.worker.pipelined import pipelined_function

        source, pre = chained if chained is not None else (df, None)
        maps = _check_pipelined(spark, source, plan.num_partitions)
        fn = pipelined_function(plan, maps, _rendezvous(spark, plan).address, report, consume, pre)
        reducers = _reducer_rows(spark, plan.num_partitions)
        pipelined: DataFrame = source.mapInArrow(fn, out_schema).union(reducers.mapInArrow(fn, out_schema))
        _check_one_stage(pipelined, maps, plan.num_partitions)
        pipelined._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
        return pipelined
    statuses = map_side(df, plan, report)
    return reduce_side(
        spark, plan, handle, statuses, reduce_function(plan, report, consume), out_schema, adaptive
    )


def map_side(
    df: DataFrame, plan: ShufflePlan, report: Callable[[dict[str, Any]], None], map_offset: int = 0
) -> DataFrame:
    """The status rows of ``df``'s map tasks (a chained ``map_in_arrow``/``map_in_pandas`` runs
    inside them)."""
    # A chained mapInArrow runs inside the map task (no JVM in between), after a direct scan if any.
    source, pre = _attached(df, "_arrowbeat_chain") or (df, None)
    scan = _direct_scan(source, chained=pre is not None)
    if scan is not None:  # the map tasks read the Parquet files themselves
        rows = arrow_batch_rows(source.sparkSession) if pre is not None else BATCH_ROWS
        read: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]] = scan_function(scan, rows)
        if pre is not None:
            read = _then(read, pre)
        source, pre = _split_numbers(source.sparkSession, len(scan.tasks)), read
    statuses: DataFrame = source.mapInArrow(
        _named(map_function(plan, report, pre, map_offset=map_offset), WRITE_UDF), STATUS_DDL
    )
    return statuses


def _direct_scan(df: DataFrame, chained: bool) -> DirectScan | None:
    """How the map tasks read ``df``'s Parquet files themselves (``direct_scan``), or None: an
    optimisation never fails the call (anything it raises keeps Spark's scan)."""
    if not shuffle_settings(df.sparkSession).shuffle_direct_scan:
        return None
    try:
        scan = plan_direct_scan(df, to_arrow_schema(df.schema), chained)
    except Exception as exc:
        scan = f"planning it failed ({type(exc).__name__}: {exc})"
    if isinstance(scan, str):
        log.debug("the map side takes Spark's scan: %s", scan)
        return None
    log.info(
        "the map side reads %d Parquet files (%d row groups) directly, in %d tasks",
        scan.files,
        scan.row_groups,
        len(scan.tasks),
    )
    return scan


def _split_numbers(spark: SparkSession, tasks: int) -> DataFrame:
    """One partition per map task, holding its split number (``direct_scan.scan_function``)."""
    return spark.range(0, tasks, 1, tasks)


def _then(
    first: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]],
    second: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]],
) -> Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]]:
    return lambda batches: second(first(batches))


WRITE_UDF, READ_UDF = "arrowbeat_shuffle_write", "arrowbeat_shuffle_read"
"""The Python UDF names of the map and reduce sides: what ``explain()`` and the Spark UI's SQL
tab show for an arrowbeat shuffle (Spark names a UDF after its function)."""


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    return fn


def reduce_side(
    spark: SparkSession,
    plan: ShufflePlan,
    handle: ShuffleHandle,
    statuses: DataFrame,
    reduce_fn: Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    out_schema: StructType,
    adaptive: Coalescing,
) -> DataFrame:
    """The reduce stage over ``statuses`` (coalesced by real sizes when ``adaptive`` is True, into
    its groups when it is a tuple of them); the result carries ``handle``."""
    tasks = plan.num_partitions
    if isinstance(adaptive, tuple) and not handle.connect:  # planned: no map job ahead
        statuses, tasks = _regrouped(plan, handle, statuses, list(adaptive))
    elif (coalesced := adaptive is True and plan.num_partitions > 1) or handle.connect:
        # Spark Connect: the map side's reports are its status rows
        statuses, tasks = _eager_map_side(spark, plan, handle, statuses, coalesced)
    out = statuses.repartition(tasks, "rk").mapInArrow(_named(reduce_fn, READ_UDF), out_schema)
    out._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
    return out


def _eager_map_side(
    spark: SparkSession, plan: ShufflePlan, handle: ShuffleHandle, statuses: DataFrame, coalesced: bool
) -> tuple[DataFrame, int]:
    """Run the map side now; with ``coalesced``, pack contiguous reduce partitions into tasks by
    their real sizes. Returns the status rows (re-routed to their coalesced task) and the number
    of tasks.

    Packing is what AQE does between query stages, done between the map side and the reduce
    side. The map stage runs here, once: its status rows are persisted, so the reduce side and
    any later evaluation read them instead of rerunning the maps (lost ones are recomputed from
    lineage, with their map outputs), each stamped with the executor that shuffles it
    (``tasks.carry_function``). On Spark Connect the map side always runs here: the rows
    it collects are also the map tasks' reports (which agents hold outputs to release), since
    there are no accumulators to carry them."""
    from pyspark import StorageLevel

    settings = None
    if coalesced:  # read before the maps run: a bad setting must not leave their outputs behind
        settings = settings_from_sql_conf(_sql_conf(spark), lambda: default_parallelism(spark))
    statuses = statuses.persist(StorageLevel.MEMORY_AND_DISK)
    handle.persisted = statuses
    columns = list(REPORT_COLUMNS) if handle.connect else ["reduce", "bytes"]
    try:
        # One stage: the map tasks themselves, their (map, reduce) rows collected as they are
        # cached (an aggregation would add a shuffle and a stage for a few thousand numbers).
        table = statuses.select(*columns).toArrow()
    except BaseException:
        handle.release()  # nobody gets a handle to this shuffle: its outputs go now
        raise
    if handle.connect:
        handle.collected(write_reports(table))
    tasks = plan.num_partitions
    if settings is not None:
        statuses, tasks = _coalesced(plan, handle, statuses, table, settings)
    # Spark shuffles a cached partition from wherever it reads it, off its owner once the locality
    # wait runs out: stamped, rows carried off their owner go with it if it loses its outputs.
    return statuses.mapInArrow(carry_function(plan), CARRIED_DDL), tasks


def _coalesced(
    plan: ShufflePlan, handle: ShuffleHandle, statuses: DataFrame, table: pa.Table, settings: CoalesceSettings
) -> tuple[DataFrame, int]:
    """The status rows re-routed to contiguous groups of reduce partitions, packed by the sizes
    in ``table`` (its ``reduce`` and ``bytes`` columns), and the number of groups."""
    sizes = [0] * plan.num_partitions
    reducers, bytes_ = table.column("reduce").to_pylist(), table.column("bytes").to_pylist()
    for reducer, size in zip(reducers, bytes_, strict=True):
        sizes[int(reducer)] += int(size or 0)
    groups = coalesce(sizes, settings)
    log.info(
        "shuffle %s: %d reduce partitions (%d bytes) coalesced into %d tasks",
        plan.shuffle_id,
        plan.num_partitions,
        sum(sizes),
        len(groups),
    )
    return _regrouped(plan, handle, statuses, groups)


def _regrouped(
    plan: ShufflePlan, handle: ShuffleHandle, statuses: DataFrame, groups: list[range]
) -> tuple[DataFrame, int]:
    """The status rows re-routed so that task ``t`` reads the reduce partitions of ``groups[t]``
    (a JVM projection: no stage of its own), and the number of tasks."""
    from pyspark.sql import functions as F

    keys = route_keys(len(groups))
    per_reducer = [keys[task] for task, group in enumerate(groups) for _ in group]
    handle.groups = groups
    rk = F.element_at(F.array(*[F.lit(k) for k in per_reducer]), F.col("reduce") + 1).cast("bigint")
    return statuses.withColumn("rk", rk), len(groups)


_PARSED_SCHEMAS: dict[tuple[str, str], StructType] = {}
_PARSED_SCHEMAS_MAX = 256


def _struct(spark: SparkSession, schema: StructType | str) -> StructType:
    """A DDL schema string as Spark parses it. Parsing takes an empty DataFrame (30-40 ms of py4j
    per call): kept per string and ``spark.sql.timestampType``, the one setting that changes what
    a DDL string means (``timestamp``: with or without time zone)."""
    if isinstance(schema, StructType):
        return schema
    key = (schema, str(spark.conf.get("spark.sql.timestampType", None) or ""))
    parsed = _PARSED_SCHEMAS.get(key)
    if parsed is None:
        parsed = spark.createDataFrame([], schema).schema
        if len(_PARSED_SCHEMAS) >= _PARSED_SCHEMAS_MAX:
            _PARSED_SCHEMAS.clear()
        _PARSED_SCHEMAS[key] = parsed
    return parsed


def map_in_arrow(
    df: DataFrame,
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
) -> DataFrame:
    """``df.mapInArrow(func, schema)`` that an arrowbeat shuffle after it *chains*.

    The result is an ordinary DataFrame. When it is the input of ``repartition``,
    ``group_apply`` or ``partition_apply``, the map task runs ``func`` and the shuffle write in
    one Python worker (Flink's operator chaining), so its batches never become JVM rows."""
    out = df.mapInArrow(func, schema)
    out._arrowbeat_chain = (df, func)  # type: ignore[attr-defined]
    return out


def map_in_pandas(
    df: DataFrame,
    func: Callable[[Iterator[Any]], Iterator[Any]],
    schema: StructType | str,
) -> DataFrame:
    """``df.mapInPandas(func, schema)`` that an arrowbeat shuffle after it *chains*, as
    ``map_in_arrow``: inside the map task, its frames are converted as Spark converts them
    (``compat.pandas_udf``) and go to the shuffle without becoming JVM rows."""
    from spark_plugin.shuffle.driver.session import pandas_conversion
    from spark_plugin.shuffle.worker.grouped_map import pandas_batches

    out = df.mapInPandas(func, schema)
    declared = out.schema
    out._arrowbeat_chain = (  # type: ignore[attr-defined]
        df,
        pandas_batches(func, declared, to_arrow_schema(declared), pandas_conversion(df.sparkSession)),
    )
    return out


def _partitions(
    df: DataFrame,
    num_partitions: int | None,
    key_columns: Sequence[str],
    mode: str,
    exact: bool,
    size: PlanSize | None = None,
    others: Sequence[DataFrame] = (),
) -> tuple[SparkSession, ShufflePlan, Coalescing]:
    """The plan, and how its reduce partitions become tasks (``Coalescing``).

    An explicit count is kept exactly where Spark keeps it (``exact``: ``df.repartition(n, ...)``)
    and is the upper bound elsewhere; without one the upper bound is Spark's own
    (``spark.sql.adaptive.coalescePartitions.initialPartitionNum``, else
    ``spark.sql.shuffle.partitions``), as for Spark's shuffles."""
    spark = df.sparkSession
    if mode == "pipelined" and is_connect(spark):
        raise ShuffleConfigError(
            unsupported(
                "mode='pipelined'",
                "its map tasks meet their readers at a rendezvous in the driver's Python process, "
                "which a Spark Connect client is not",
                "use mode='materialized' (the default)",
            )
        )
    n = num_partitions
    if n is None:
        initial = spark.conf.get("spark.sql.adaptive.coalescePartitions.initialPartitionNum", None)
        shuffle_partitions = spark.conf.get("spark.sql.shuffle.partitions", None) or "200"
        raw = initial if initial not in (None, "", "<undefined>") else shuffle_partitions
        try:
            n = int(str(raw))
        except ValueError as exc:
            raise ConfigError([f"spark.sql.shuffle.partitions={raw!r}: expected an integer >= 1"]) from exc
    spark, plan, settings = _plan(df, n, key_columns, mode)
    sql_conf = _sql_conf(spark)
    adaptive = (
        mode == "materialized"
        and not (exact and num_partitions is not None)
        and adaptive_enabled(settings, sql_conf)
    )
    if not adaptive:
        return spark, plan, False
    planned = _planned(spark, plan, settings, sql_conf, size, [df, *others])
    return spark, plan, True if planned is None else tuple(planned)


def _planned(
    spark: SparkSession,
    plan: ShufflePlan,
    settings: ArrowBeatConfig,
    sql_conf: dict[str, str],
    size: PlanSize | None,
    inputs: Sequence[DataFrame],
) -> list[range] | None:
    """The tasks of an adaptive shuffle planned from the optimizer's size of its ``inputs`` (``size``
    if the caller read it already), or None: measure the real sizes (``adaptive=true``, Spark
    Connect, no statistics, an estimate that may be low, or one too large to plan by)."""
    if settings.shuffle_adaptive != "auto" or plan.num_partitions < 2 or is_connect(spark):
        return None
    if size is None:
        sizes = [plan_size(frame) for frame in inputs]
        known = [s.bytes for s in sizes if s.bytes is not None]
        grows = next((s.grows for s in sizes if s.grows), "")
        size = PlanSize(sum(known), grows=grows) if len(known) == len(sizes) else PlanSize(None)
    if size.bytes is None or size.grows:
        return None
    coalescing = settings_from_sql_conf(sql_conf, lambda: default_parallelism(spark))
    groups = planned_groups(plan.num_partitions, size.bytes, coalescing)
    if groups is not None:
        log.info(
            "shuffle %s: %d reduce partitions planned as %d tasks from the input's size (%d bytes)",
            plan.shuffle_id,
            plan.num_partitions,
            len(groups),
            size.bytes,
        )
    return groups


def _size(route: Route | None) -> PlanSize | None:
    """The input's size a route already read (None: not read yet)."""
    return None if route is None else route.size


def repartition(
    df: DataFrame,
    num_partitions: int | None,
    *key_columns: str,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.repartition(num_partitions, *key_columns)``: same rows, each key in one partition.

    ``num_partitions=None`` is ``df.repartition(*key_columns)``: Spark's partition count as the
    upper bound, coalesced by size once the map side has run (``spark.arrowbeat.shuffle.adaptive``);
    an explicit count is kept exactly, as Spark keeps it. ``path``: ``auto``, ``arrowbeat`` or
    ``spark`` (None: ``spark.arrowbeat.shuffle.path``, arrowbeat's when unset; see ``route``)."""
    mode = check_mode(mode)
    route = routed(df, "partition", path, num_partitions is not None)
    if route is not None and route.path == "spark":
        return _routed_out(spark_repartition(df, num_partitions, key_columns), route)
    spark, plan, adaptive = _partitions(df, num_partitions, key_columns, mode, exact=True, size=_size(route))
    return _routed_out(_build(df, spark, plan, mode, passthrough, df.schema, adaptive), route)


def partition_apply(
    df: DataFrame,
    num_partitions: int | None,
    key_columns: Sequence[str],
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.repartition(n, *keys).mapInArrow(func, schema)`` without Arrow -> JVM -> Arrow between.

    ``func`` runs once per reduce task, on every row of its partitions; partition counts as for
    ``repartition`` (``path`` too)."""
    mode = check_mode(mode)
    route = routed(df, "partition", path, num_partitions is not None)
    if route is not None and route.path == "spark":
        out = spark_partition_apply(df, num_partitions, list(key_columns), func, schema)
        return _routed_out(out, route)
    spark, plan, adaptive = _partitions(
        df, num_partitions, list(key_columns), mode, exact=True, size=_size(route)
    )
    out_schema = _struct(spark, schema)
    consume = partition_consumer(func, to_arrow_schema(out_schema))
    return _routed_out(_build(df, spark, plan, mode, consume, out_schema, adaptive), route)


def group_apply(
    df: DataFrame,
    key_columns: Sequence[str],
    func: Callable[[pa.Table], pa.Table],
    schema: StructType | str,
    num_partitions: int | None = None,
    mode: str = "materialized",
    path: str | None = None,
) -> DataFrame:
    """Like ``df.groupBy(*keys).applyInArrow(func, schema)``: ``func`` once per key group.

    Groups are found in Arrow in the reduce task (``grouping.iter_groups``), not by a JVM sort.
    ``num_partitions`` (default: Spark's) is an upper bound: with ``spark.arrowbeat.shuffle.adaptive``
    on (by default when AQE is) the map side runs when this is called and contiguous reduce
    partitions are packed into tasks by their real sizes, as AQE packs a ``groupBy``'s. ``path``:
    ``auto`` (Spark's ``applyInArrow`` for inputs measured faster there), ``arrowbeat`` or ``spark``
    (None: ``spark.arrowbeat.shuffle.path``, arrowbeat's when unset; see ``route``)."""
    mode = check_mode(mode)
    route = routed(df, "group", path, num_partitions is not None)
    if route is not None and route.path == "spark":
        out = spark_group_apply(df, list(key_columns), func, schema, num_partitions)
        return _routed_out(out, route)
    spark, plan, adaptive = _partitions(
        df, num_partitions, list(key_columns), mode, exact=False, size=_size(route)
    )
    out_schema = _struct(spark, schema)
    out_arrow = to_arrow_schema(out_schema)
    consume = group_consumer(
        func, plan.key_columns, plan.schema, out_arrow, memory_bytes=plan.reduce_memory_bytes
    )
    return _routed_out(_build(df, spark, plan, mode, consume, out_schema, adaptive), route)


__all__ = [
    "ShuffleHandle",
    "group_apply",
    "map_in_arrow",
    "map_in_pandas",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]
