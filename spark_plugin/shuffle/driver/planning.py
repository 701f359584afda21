"""Building a shuffle's lazy plan on the driver: the map side (rows, a chained ``mapInArrow``, or a
direct scan of Parquet files), the status rows' exchange, and the reduce side, in Spark's own
stages.

Partition counts follow Spark's: an explicit count in ``repartition``/``partition_apply`` is kept
exactly; otherwise (and for ``group_apply`` always) the count is an upper bound, and with
``spark.arrowbeat.shuffle.adaptive`` on the map side runs when the function is called and
contiguous reduce partitions are packed into tasks by their real sizes (``adaptive``,
``_coalesced``), as AQE packs a ``groupBy``'s between query stages; an input the optimizer sizes as
small gets its tasks from that size, with no map job ahead (``adaptive.planned_groups``,
``_planned``).

Spark Connect sessions (no SparkContext, no py4j, no accumulators; ``spark_plugin.compat.connect``):
the application's settings are the session's conf, less the entries Spark withholds from clients
(the secret: tasks get it from their own agent, ``output_recovery.keyed``); a shuffle id is a
probe job's stage id, offset above Spark's own shuffle ids (``session``); the map side runs when
the function is called (as an adaptive shuffle's does) and its status rows are the map tasks'
reports. ``mode="pipelined"`` and ``spark.arrowbeat.ssl.enabled`` are refused there when called,
naming what to use instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.compat.arrow_schema import to_arrow_schema
from spark_plugin.compat.connect import unsupported
from spark_plugin.compat.plan_stats import PlanSize, plan_size
from spark_plugin.errors import ConfigError
from spark_plugin.settings.config import ArrowBeatConfig
from spark_plugin.settings.tls import from_config as tls_from_config
from spark_plugin.shuffle.driver.adaptive import (
    CoalesceSettings,
    coalesce,
    planned_groups,
    route_keys,
    settings_from_sql_conf,
)
from spark_plugin.shuffle.driver.direct_scan import BATCH_ROWS, DirectScan, plan_direct_scan, scan_function
from spark_plugin.shuffle.driver.handle import ShuffleHandle, _attached, _rendezvous, shuffle_of
from spark_plugin.shuffle.driver.route import (
    Route,
    record_spark_path,
    report,
)
from spark_plugin.shuffle.driver.route import mark as mark_route
from spark_plugin.shuffle.driver.session import (
    SessionView,
    arrow_batch_rows,
    as_view,
    default_parallelism,
    new_shuffle_id,
    spark_of,
)
from spark_plugin.shuffle.driver.shuffle_settings import (
    _retry_wait_s,
    _sql_conf,
    adaptive_enabled,
    shuffle_settings,
)
from spark_plugin.shuffle.map_output import check_keys
from spark_plugin.shuffle.plan import CARRIED_DDL, STATUS_DDL, ShufflePlan
from spark_plugin.shuffle.worker.map_task import (
    REPORT_COLUMNS,
    attempt_stage,
    carry_function,
    map_function,
    write_reports,
)
from spark_plugin.shuffle.worker.reduce_task import (
    reduce_function,
)

log = logging.getLogger("arrowbeat.shuffle")

WRITE_UDF, READ_UDF = "arrowbeat_shuffle_write", "arrowbeat_shuffle_read"
"""The Python UDF names of the map and reduce sides: what ``explain()`` and the Spark UI's SQL
tab show for an arrowbeat shuffle (Spark names a UDF after its function)."""

Coalescing = bool | tuple[range, ...]
"""How a shuffle's reduce partitions become tasks: ``False`` one task each, ``True`` packed by their
real sizes once the map side ran (eagerly), a tuple: these groups, planned from the optimizer's size."""


def _routed_out(out: DataFrame, route: Route | None) -> DataFrame:
    """Record a decided route: with the shuffle's own rows (arrowbeat's path), or on its own."""
    if route is None:
        return out
    if route.path == "spark":
        record_spark_path(out.sparkSession, route)
    else:
        shuffle_of(out).collected([report(route)])
    return mark_route(out, route)


def _plan(
    df: DataFrame, num_partitions: int, key_columns: Sequence[str], mode: str, session: SessionView
) -> tuple[SessionView, ShufflePlan, ArrowBeatConfig]:
    """The shuffle's plan and the settings it was made with; ``mode`` is already checked."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int) or num_partitions < 1:
        raise ShuffleConfigError(
            f"num_partitions={num_partitions!r} is out of range: expected an integer >= 1"
        )
    schema = to_arrow_schema(df.schema)
    check_keys(schema, list(key_columns))
    settings = shuffle_settings(session)
    if settings.ssl_enabled and session.connect:
        raise ShuffleConfigError(
            unsupported(
                "an arrowbeat shuffle with spark.arrowbeat.ssl.enabled=true",
                "Spark Connect withholds the TLS key from clients and the tasks could not rebuild it",
                "use a classic SparkSession for it, or Spark's own shuffle (df.repartition, groupBy)",
            )
        )
    plan = ShufflePlan(
        app_id=session.app_id(),
        shuffle_id=new_shuffle_id(session),
        root=settings.shuffle_dir,  # resolved on each executor (shuffle_roots), as its user
        secret=settings.secret,  # empty on Spark Connect: the tasks ask their agents (output_recovery.keyed)
        key_columns=tuple(key_columns),
        num_partitions=num_partitions,
        schema_ipc=schema.serialize().to_pybytes(),
        route_keys=route_keys(num_partitions),
        memory_bytes=settings.shuffle_map_memory_bytes,
        reduce_memory_bytes=settings.shuffle_reduce_memory_bytes,
        read_host_local=settings.shuffle_read_host_local,
        checksum=settings.shuffle_checksum,
        lost_wait_s=_retry_wait_s(session),
        tls=tls_from_config(settings),  # the driver's SparkConf holds what the executors got
    )
    return session, plan, settings


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
    session: SessionView,
    plan: ShufflePlan,
    mode: str,
    consume: Callable[[int, Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    out_schema: StructType,
    adaptive: Coalescing = False,
) -> DataFrame:
    handle = ShuffleHandle(session, plan, mode)
    report = handle.reporter()
    chained = _attached(df, "_arrowbeat_chain")
    if mode == "pipelined":
        from spark_plugin.shuffle.worker.pipelined import pipelined_function

        source, pre = chained if chained is not None else (df, None)
        maps = _check_pipelined(session.spark, source, plan.num_partitions)
        fn = pipelined_function(plan, maps, _rendezvous(session, plan).address, report, consume, pre)
        reducers = _reducer_rows(session.spark, plan.num_partitions)
        pipelined: DataFrame = source.mapInArrow(fn, out_schema).union(reducers.mapInArrow(fn, out_schema))
        _check_one_stage(pipelined, maps, plan.num_partitions)
        pipelined._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
        return pipelined
    statuses = map_side(df, plan, report, session=session)
    return reduce_side(
        session, plan, handle, statuses, reduce_function(plan, report, consume), out_schema, adaptive
    )


def map_side(
    df: DataFrame,
    plan: ShufflePlan,
    report: Callable[[dict[str, Any]], None],
    map_offset: int = 0,
    session: SessionView | None = None,
) -> DataFrame:
    """The status rows of ``df``'s map tasks (a chained ``map_in_arrow``/``map_in_pandas`` runs
    inside them)."""
    # A chained mapInArrow runs inside the map task (no JVM in between), after a direct scan if any.
    source, pre = _attached(df, "_arrowbeat_chain") or (df, None)
    view = session or as_view(source.sparkSession)
    scan = _direct_scan(source, view, chained=pre is not None)
    if scan is not None:  # the map tasks read the Parquet files themselves
        rows = arrow_batch_rows(view) if pre is not None else BATCH_ROWS
        read: Callable[[Iterable[pa.RecordBatch]], Iterable[pa.RecordBatch]] = scan_function(scan, rows)
        if pre is not None:
            read = _then(read, pre)
        source, pre = _split_numbers(view.spark, len(scan.tasks)), read
    statuses: DataFrame = source.mapInArrow(
        _named(map_function(plan, report, pre, map_offset=map_offset), WRITE_UDF), STATUS_DDL
    )
    return statuses


def _direct_scan(df: DataFrame, session: SessionView, chained: bool) -> DirectScan | None:
    """How the map tasks read ``df``'s Parquet files themselves (``direct_scan``), or None: an
    optimisation never fails the call (anything it raises keeps Spark's scan)."""
    if not shuffle_settings(session).shuffle_direct_scan:
        return None
    try:
        scan = plan_direct_scan(df, to_arrow_schema(df.schema), chained, session)
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


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    return fn


def reduce_side(
    session: SessionView,
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
        statuses, tasks = _eager_map_side(session, plan, handle, statuses, coalesced)
    out = statuses.repartition(tasks, "rk").mapInArrow(_named(reduce_fn, READ_UDF), out_schema)
    out._arrowbeat_shuffle = handle  # type: ignore[attr-defined]
    return out


def _eager_map_side(
    session: SessionView, plan: ShufflePlan, handle: ShuffleHandle, statuses: DataFrame, coalesced: bool
) -> tuple[DataFrame, int]:
    """Run the map side now; with ``coalesced``, pack contiguous reduce partitions into tasks by
    their real sizes. Returns the status rows (re-routed to their coalesced task) and the number
    of tasks.

    Packing is what AQE does between query stages, done between the map side and the reduce
    side. The map stage runs here, once: its status rows are persisted, so the reduce side and
    any later evaluation read them instead of rerunning the maps (lost ones are recomputed from
    lineage, with their map outputs), each stamped with the executor that shuffles it
    (``map_task.carry_function``). On Spark Connect the map side always runs here: the rows
    it collects are also the map tasks' reports (which agents hold outputs to release), since
    there are no accumulators to carry them."""
    from pyspark import StorageLevel

    settings = None
    if coalesced:  # read before the maps run: a bad setting must not leave their outputs behind
        settings = settings_from_sql_conf(_sql_conf(session), lambda: default_parallelism(session))
    statuses = statuses.persist(StorageLevel.MEMORY_AND_DISK)
    handle.persisted = statuses
    columns = list(REPORT_COLUMNS) if handle.connect else ["reduce", "attempt", "bytes"]
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
    return statuses.mapInArrow(carry_function(plan, map_stage_of(table)), CARRIED_DDL), tasks


def map_stage_of(table: pa.Table) -> int:
    """The stage the map job ran as: the first of its status rows' attempts (``stage.task.attempt``;
    a map task retried within the job keeps its stage)."""
    stages = [attempt_stage(str(a)) for a in table.column("attempt").to_pylist() if a]
    return min(stages, default=-1)


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
    (a JVM projection: no stage of its own), and the number of tasks.

    The per-reducer keys are one SQL array literal, parsed once: built as columns, each key cost
    a ``lit`` of several py4j calls (0.15 s for 200 reducers, between the map job and the reduce
    job)."""
    from pyspark.sql import functions as F

    keys = route_keys(len(groups))
    handle.groups = groups
    literal = ", ".join(str(int(keys[task])) for task, group in enumerate(groups) for _ in group)
    rk = F.expr(f"CAST(element_at(array({literal}), `reduce` + 1) AS BIGINT)")
    return statuses.withColumn("rk", rk), len(groups)


_PARSED_SCHEMAS: dict[tuple[str, str], StructType] = {}


_PARSED_SCHEMAS_MAX = 256


def _struct(session: SessionView | SparkSession, schema: StructType | str) -> StructType:
    """A DDL schema string as Spark parses it. Parsing takes an empty DataFrame (30-40 ms of py4j
    per call): kept per string and ``spark.sql.timestampType``, the one setting that changes what
    a DDL string means (``timestamp``: with or without time zone)."""
    if isinstance(schema, StructType):
        return schema
    spark = spark_of(session)
    key = (schema, str(spark.conf.get("spark.sql.timestampType", None) or ""))
    parsed = _PARSED_SCHEMAS.get(key)
    if parsed is None:
        parsed = spark.createDataFrame([], schema).schema
        if len(_PARSED_SCHEMAS) >= _PARSED_SCHEMAS_MAX:
            _PARSED_SCHEMAS.clear()
        _PARSED_SCHEMAS[key] = parsed
    return parsed


def _partitions(
    df: DataFrame,
    num_partitions: int | None,
    key_columns: Sequence[str],
    mode: str,
    exact: bool,
    size: PlanSize | None = None,
    others: Sequence[DataFrame] = (),
    session: SessionView | None = None,
) -> tuple[SessionView, ShufflePlan, Coalescing]:
    """The plan, and how its reduce partitions become tasks (``Coalescing``).

    An explicit count is kept exactly where Spark keeps it (``exact``: ``df.repartition(n, ...)``)
    and is the upper bound elsewhere; without one the upper bound is Spark's own
    (``spark.sql.adaptive.coalescePartitions.initialPartitionNum``, else
    ``spark.sql.shuffle.partitions``), as for Spark's shuffles. ``session``: the view the public
    call resolved (resolved here for internal callers that have none)."""
    view = session or as_view(df.sparkSession)
    if mode == "pipelined" and view.connect:
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
        runtime = view.spark.conf
        initial = runtime.get("spark.sql.adaptive.coalescePartitions.initialPartitionNum", None)
        shuffle_partitions = runtime.get("spark.sql.shuffle.partitions", None) or "200"
        raw = initial if initial not in (None, "", "<undefined>") else shuffle_partitions
        try:
            n = int(str(raw))
        except ValueError as exc:
            raise ConfigError([f"spark.sql.shuffle.partitions={raw!r}: expected an integer >= 1"]) from exc
    view, plan, settings = _plan(df, n, key_columns, mode, view)
    sql_conf = _sql_conf(view)
    adaptive = (
        mode == "materialized"
        and not (exact and num_partitions is not None)
        and adaptive_enabled(settings, sql_conf)
    )
    if not adaptive:
        return view, plan, False
    planned = _planned(view, plan, settings, sql_conf, size, [df, *others])
    return view, plan, True if planned is None else tuple(planned)


def _planned(
    session: SessionView,
    plan: ShufflePlan,
    settings: ArrowBeatConfig,
    sql_conf: dict[str, str],
    size: PlanSize | None,
    inputs: Sequence[DataFrame],
) -> list[range] | None:
    """The tasks of an adaptive shuffle planned from the optimizer's size of its ``inputs`` (``size``
    if the caller read it already), or None: measure the real sizes (``adaptive=true``, Spark
    Connect, no statistics, an estimate that may be low, or one too large to plan by)."""
    if settings.shuffle_adaptive != "auto" or plan.num_partitions < 2 or session.connect:
        return None
    if size is None:
        sizes = [plan_size(frame) for frame in inputs]
        known = [s.bytes for s in sizes if s.bytes is not None]
        grows = next((s.grows for s in sizes if s.grows), "")
        size = PlanSize(sum(known), grows=grows) if len(known) == len(sizes) else PlanSize(None)
    if size.bytes is None or size.grows:
        return None
    coalescing = settings_from_sql_conf(sql_conf, lambda: default_parallelism(session))
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
