"""Which exchange a shuffle call takes: arrowbeat's or Spark's own, decided before it shuffles.

AQE turns a sort-merge join into a broadcast join when a side's size statistics are under
``spark.sql.autoBroadcastJoinThreshold``; this module does the same for arrowbeat's shuffle.
arrowbeat's exchange has a fixed cost Spark's has not (a second Python stage, a map job run
eagerly to coalesce by real sizes, agents' streams), which only pays for itself past some input
size. Below it, the call runs as the equivalent Spark call:

- ``group_apply`` / ``applyInArrow``: ``df.groupBy(*keys).applyInArrow(func, schema)``;
- the pandas forms: ``df.groupBy(*keys).applyInPandas(func, schema)`` (the groupedMap hook);
- ``partition_apply``: ``df.repartition([n,] *keys).mapInArrow(func, schema)``;
- ``repartition``: ``df.repartition([n,] *keys)``.

What it knows before the shuffle is the optimizer's ``sizeInBytes`` of the input
(``compat.plan_stats``): a file scan's file sizes, a ``range``'s rows x row size, a cached
relation's real in-memory size once materialized (the benchmark's inputs), estimates above them.
Without statistics (Spark Connect: no py4j) the call keeps arrowbeat's path with the reason
``no statistics``. The map side's real sizes, known once an adaptive shuffle's map job ran, come
too late to choose by (the map work is done); they are in the same ``shuffle_metrics`` rows.

**The thresholds** (``SPARK_BELOW``) were measured on this machine (2 cores, shared with other
work; load average 2.7-5.6 while measuring): ``python -m benchmarks.shuffle_matrix --rows
200000,1000000,2000000,4000000`` then ``--rows 20000,8000000`` (``--repeat 2 --no-dask``) print each
input's optimizer size and, per cell, Spark's and arrowbeat's best-of-2 times; an operation's
threshold lies between the largest input on which Spark's path won (over both key shapes) and
the smallest on which arrowbeat's did. ``MEASURED`` holds the table; the site's "Choosing the
exchange" page (docs/concepts/routing.md) too.

A key forces a path (``spark.arrowbeat.shuffle.path=auto|arrowbeat|spark``, settable per query), a
call's ``path=`` argument wins over it. Each decision made (``auto`` or forced, not the unset
default) is one ``shuffle_metrics`` row: side ``route``, ``bytes`` the estimate (-1: none),
``detail`` ``{"route": {"path", "reason", "op", "threshold_bytes"}}``; a call taking arrowbeat's
path writes it with its shuffle's rows, one taking Spark's under a shuffle id of its own,
batched by the metrics sink's writer (``metrics_sink``: one commit per ``BATCH_S``;
``flush_routes`` writes now).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.compat.plan_stats import PlanSize, plan_size
from spark_plugin.settings.config import from_spark_conf, key_of
from spark_plugin.shuffle.driver import metrics_sink
from spark_plugin.shuffle.driver.session import app_id, as_view, conf_entries, new_shuffle_id, spark_of

log = logging.getLogger("arrowbeat.shuffle")

PATHS = ("auto", "arrowbeat", "spark")
"""A call's ``path``: decide by size, or force one exchange."""
OPS = ("group", "partition")
"""``group``: a grouped map (``group_apply``, ``applyInArrow``/``applyInPandas``, cogroup: both
inputs' sizes summed); ``partition``: ``partition_apply`` and ``repartition``."""


@dataclass(frozen=True)
class Route:
    """One call's exchange and why."""

    path: str
    """``arrowbeat`` or ``spark``."""
    reason: str
    estimated_bytes: int | None
    """The optimizer's size of the input (summed over a cogroup's two); None without statistics."""
    op: str = "group"
    threshold_bytes: int | None = None
    """The size under which ``auto`` takes Spark's path for this call; None when forced."""
    seconds: float = 0.0
    """What deciding cost (reading the statistics)."""
    size: PlanSize | None = None
    """The statistics read, kept so that planning the shuffle does not read them again."""


@dataclass(frozen=True)
class Crossover:
    """Where Spark's path stops winning for one operation: below ``default`` bytes with Spark's
    partition count (200, AQE), below ``explicit`` with a count given in the call."""

    default: int
    explicit: int

    def below(self, explicit_partitions: bool) -> int:
        return self.explicit if explicit_partitions else self.default


MEASURED = """\
ratio = Spark / arrowbeat, best of 2 per side; input = the cached relation's optimizer size
rows   input      group default  group n=8    repart default  repart n=8   (uniform, hot keys)
20k    0.59 MB    0.84  1.06     1.37  1.37   0.37  0.58      0.53  0.48
200k   5.9 MB     1.27  1.10     1.19  1.36   0.48  0.57      0.76  0.50
1M     29 MB      1.13  0.96     1.44  1.59   0.88  0.75      0.92  0.77
2M     59 MB      0.97  1.08     1.59  1.51   0.82  0.93      0.72  0.82
4M     117 MB     1.40  1.28     1.65  1.42   0.95  0.92      0.90  1.14
8M     235 MB     1.46  1.50     1.73  1.56   0.95  1.06      1.20  1.42
20M    587 MB     (issue 25's run on main: every cell >= 1.216)
group, Spark's count: crossover between 0.59 MB and 5.9 MB -> 2 MiB; with a count in the call
arrowbeat won every cell -> 0. repart, Spark's count: about even at 117-235 MB (a rerun at 4M: 1.13,
0.93), won from 587 MB -> 256 MiB;
with a count: about even at 117 MB (rerun: 1.12, 1.25), won at 235 MB -> 128 MiB. Load average
2.7-6.2 on 2 cores, shared.

Remeasured (issue 25 item 2) once an input the optimizer sizes under the advisory size x the
default parallelism (128 MiB here) runs with no eager map job (``adaptive.planned_groups``),
best of 3, load 3.0-4.9:
rows   input      group default   repart default
20k    0.59 MB    1.42  1.67
200k   5.9 MB     1.84  2.10
1M     29 MB                      0.88  0.73
2M     59 MB                      1.11  0.95
4M     117 MB                     1.18  1.14
8M     235 MB                     1.02  1.03   (over 128 MiB: measured coalescing, eager)
repart, Spark's count: Spark won at 59 MB (hot keys), arrowbeat from 117 MB -> 80 MiB. group,
Spark's count: arrowbeat won at every size with 5,003 keys, but with 40 keys Spark's path won at
12 kB, 240 kB and 2.4 MB (0.67, 0.56, 0.57): the size alone does not tell, the 2 MiB stays.
"""
"""The measurement the thresholds come from (see the module docstring)."""

SPARK_BELOW: dict[str, Crossover] = {
    "group": Crossover(default=2 << 20, explicit=0),
    "partition": Crossover(default=80 << 20, explicit=128 << 20),
}
"""Input sizes (optimizer bytes) under which Spark's exchange was measured faster (``MEASURED``);
0: arrowbeat's won every cell measured, so ``auto`` never takes Spark's."""


def decide(
    op: str,
    size: PlanSize,
    path: str,
    explicit_partitions: bool = False,
    thresholds: dict[str, Crossover] | None = None,
) -> Route:
    """The route for an input of ``size``: pure, so the rules are tested without Spark.

    ``path`` is ``auto``, ``arrowbeat`` or ``spark`` (already resolved from argument and key)."""
    if op not in OPS:
        raise ShuffleConfigError(f"op={op!r}: expected one of {', '.join(OPS)}")
    if path not in PATHS:
        raise ShuffleConfigError(f"path={path!r}: expected one of {', '.join(PATHS)}")
    if path != "auto":
        return Route(path, f"forced: path={path}", size.bytes, op)
    limit = (thresholds or SPARK_BELOW)[op].below(explicit_partitions)
    if size.bytes is None:
        return Route("arrowbeat", f"no statistics ({size.why_not})", None, op, limit)
    if size.bytes < limit:
        reason = f"input {size.bytes:,} bytes < {limit:,}: Spark's exchange measured faster"
        return Route("spark", reason, size.bytes, op, limit)
    reason = f"input {size.bytes:,} bytes >= {limit:,}: arrowbeat's exchange measured faster"
    return Route("arrowbeat", reason, size.bytes, op, limit)


def resolve_path(spark: Any, path: str | None, unset: str = "arrowbeat") -> tuple[str, bool]:
    """The path to take and whether anyone asked for one: the call's ``path``, else the session's
    ``spark.arrowbeat.shuffle.path`` (runtime conf first), else ``unset`` (not asked)."""
    if path is not None:
        if path not in PATHS:
            raise ShuffleConfigError(f"path={path!r}: expected one of {', '.join(PATHS)}")
        return path, True
    key = key_of("shuffle_path")
    override = spark_of(spark).conf.get(key, None)
    overrides = {key: str(override)} if override not in (None, "", "<undefined>") else {}
    configured = from_spark_conf(_app_entry(spark, key), overrides).shuffle_path  # the one key
    if configured:
        return configured, True
    if unset not in PATHS:
        raise ShuffleConfigError(f"unset={unset!r}: expected one of {', '.join(PATHS)}")
    return unset, False


def _app_entry(spark: Any, key: str) -> list[tuple[str, str]]:
    """The application conf's entry for ``key`` (none or one). Classic: one lookup in the live
    ``SparkConf`` (copying the whole conf costs a py4j round trip per entry, tens of
    milliseconds per call); Spark Connect: the session's conf."""
    view = as_view(spark)
    live = None if view.connect else getattr(view.spark.sparkContext, "_conf", None)
    if live is None:
        return [(k, v) for k, v in conf_entries(view) if k == key]
    value = live.get(key, None)
    return [] if value is None else [(key, str(value))]


def choose(
    df: DataFrame,
    op: str = "group",
    path: str | None = None,
    *,
    other: DataFrame | None = None,
    explicit_partitions: bool = False,
    unset: str = "auto",
) -> Route:
    """The exchange for shuffling ``df`` (and a cogroup's ``other``) with ``op``.

    ``path`` as the call's argument (None: the key, else ``unset``). For the groupedMap hook:
    ``choose(df, "group")`` under ``groupedMap=auto`` decides by size unless the key forces a path.
    Reading the statistics plans the query (milliseconds); a decision forced by argument or key
    reads them too, for the record."""
    started = time.perf_counter()
    wanted, _ = resolve_path(df.sparkSession, path, unset)
    size = plan_size(df)
    if other is not None:
        second = plan_size(other)
        if size.bytes is None or second.bytes is None:
            size = size if size.bytes is None else second
        else:
            size = PlanSize(size.bytes + second.bytes, grows=size.grows or second.grows)
    route = decide(op, size, wanted, explicit_partitions)
    seconds = time.perf_counter() - started
    return Route(route.path, route.reason, route.estimated_bytes, op, route.threshold_bytes, seconds, size)


def routed(
    df: DataFrame,
    op: str,
    path: str | None,
    explicit_partitions: bool,
    other: DataFrame | None = None,
    session: Any = None,
) -> Route | None:
    """What the explicit API calls ask: None when neither the call nor the key asked for a path
    (arrowbeat's, unrecorded, as before routing existed), else the decision."""
    wanted, asked = resolve_path(session if session is not None else df.sparkSession, path, "arrowbeat")
    if not asked:
        return None
    route = choose(df, op, wanted, other=other, explicit_partitions=explicit_partitions)
    log.info("arrowbeat shuffle route (%s): %s, %s", op, route.path, route.reason)
    return route


# -- Spark's path -------------------------------------------------------------------------------
def spark_group_apply(
    df: DataFrame,
    keys: Sequence[str],
    func: Callable[..., Any],
    schema: StructType | str,
    num_partitions: int | None,
    pandas: bool = False,
) -> DataFrame:
    """Spark's grouped map. An explicit partition count is Spark's ``repartition(n, *keys)``
    first: its hash partitioning already satisfies the grouping, so Spark adds no second exchange."""
    source = df if num_partitions is None else df.repartition(num_partitions, *keys)
    grouped = source.groupBy(*keys)
    return grouped.applyInPandas(func, schema) if pandas else grouped.applyInArrow(func, schema)


def spark_repartition(df: DataFrame, num_partitions: int | None, keys: Sequence[str]) -> DataFrame:
    """Spark's ``df.repartition([n,] *keys)``."""
    if num_partitions is None:
        return df.repartition(*keys)
    return df.repartition(num_partitions, *keys)


def spark_partition_apply(
    df: DataFrame,
    num_partitions: int | None,
    keys: Sequence[str],
    func: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    schema: StructType | str,
) -> DataFrame:
    """Spark's ``df.repartition([n,] *keys).mapInArrow(func, schema)``."""
    return spark_repartition(df, num_partitions, keys).mapInArrow(func, schema)


def mark(out: DataFrame, route: Route) -> DataFrame:
    """Attach the route to the DataFrame it produced (``handle.release`` knows a Spark-path
    result has no arrowbeat shuffle to release)."""
    out._arrowbeat_route = route  # type: ignore[attr-defined]
    return out


def route_of(df: DataFrame) -> Route | None:
    """The route a DataFrame of this package was made by, if one was decided."""
    found = getattr(df, "__dict__", {}).get("_arrowbeat_route")
    return found if isinstance(found, Route) else None


# -- recording ----------------------------------------------------------------------------------
def report(route: Route) -> dict[str, Any]:
    """The route as a task-report-shaped row for ``shuffle_metrics`` (side ``route``)."""
    return {
        "side": "route",
        "partition": 0,
        "attempt": "0",
        "executor": "driver",
        "bytes": -1 if route.estimated_bytes is None else route.estimated_bytes,
        "batches": 0,
        "rows": 0,
        "spill_bytes": 0,
        "blocked_s": 0.0,
        "seconds": route.seconds,
        "recomputed": False,
        "recomputed_maps": [],
        "control": None,
        "route": {
            "path": route.path,
            "reason": route.reason,
            "op": route.op,
            "threshold_bytes": route.threshold_bytes,
        },
    }


def record_spark_path(spark: Any, route: Route) -> int:
    """Queue the row of a call that took Spark's path, under a shuffle id of its own (-1 on Spark
    Connect, where a new id costs a probe job); the metrics sink's writer appends it in the
    background, so the call does not wait for a Delta commit. Returns the id."""
    view = as_view(spark)
    shuffle_id = -1 if view.connect else new_shuffle_id(view)
    try:
        app = app_id(view)
        metrics_sink.enqueue(metrics_sink.destination(view, app), app, shuffle_id, [report(route)])
    except Exception as exc:  # a metric must never fail the user's call
        log.warning("shuffle_metrics route row not recorded: %s", exc)
    return shuffle_id


def flush_routes() -> int:
    """Write the queued Spark-path rows now (``metrics_sink.flush``); returns rows written."""
    return metrics_sink.flush()


__all__ = [
    "OPS",
    "PATHS",
    "Crossover",
    "Route",
    "choose",
    "decide",
    "flush_routes",
    "resolve_path",
    "route_of",
]
