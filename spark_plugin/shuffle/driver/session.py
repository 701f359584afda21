"""What planning a shuffle needs to know about its session, classic or Spark Connect.

A classic session answers through its SparkContext (py4j). A Spark Connect session has none, so:

- the application's conf is the session's (``spark.conf.getAll``: Spark copies the application's
  ``SparkConf`` into every session's conf), minus what Spark Connect withholds from clients
  (``spark.redaction.regex``: the arrowbeat secret, generated TLS keys, cloud credentials);
- the application id is ``spark.app.id``;
- a shuffle id comes from a one-task probe job: its stage id is unique in the application
  (Spark's DAGScheduler numbers stages with one counter), offset by ``STAGE_IDS_FROM`` so it never
  meets the ids ``SparkContext.newShuffleId`` hands out to classic sessions (counted up from 0);
- the default parallelism is ``spark.default.parallelism`` if set, else the number of partitions
  Spark gives ``spark.range`` (its leaf-node default parallelism), counted by the same probe.

Which kind of session it is comes from ``spark_plugin.compat.connect``, never from a version,
and is asked once per public call: ``SessionView.of`` resolves the session (its kind, the
application's conf as it may see it, then arrowbeat's settings and the application id on first
use) where a public function is called, and the view is passed down; every helper here takes a
view (or, from tests and rare callers, a session it resolves with ``as_view``).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from spark_plugin.compat.connect import is_connect
from spark_plugin.compat.pandas_udf import PandasConversion

log = logging.getLogger("arrowbeat.shuffle")

STAGE_IDS_FROM = 1 << 30
"""Shuffle ids made from stage ids start here: far above Spark's own shuffle-id counter, and with
room below 2**31 (ids travel as int32) for 2**30 stages."""
PROBE_ROWS = 1 << 16
"""Rows of the parallelism probe's range: every one of its partitions gets some (at most this many)."""
_PROBE_SCHEMA = "stage bigint, partition int"
_warned_fallback = False


_APPLICATION_CONF: weakref.WeakKeyDictionary[Any, tuple[str, dict[str, str]]] = weakref.WeakKeyDictionary()
_APPLICATION_CONF_LOCK = threading.Lock()


def _application_conf(context: Any) -> dict[str, str]:
    """A classic SparkContext's ``SparkConf`` (in its order), read once per application.

    ``getConf()`` copies the conf entry by entry through py4j (three calls per entry): 40-60 ms for
    a few hundred entries, and a shuffle call needed it three times, ``release`` once more: a
    quarter of a second of a 400 k-row ``partition_apply``. Spark fixes an application's conf when
    its context starts (runtime settings live in the session's SQL conf, read apart), so one copy
    per SparkContext (and application id: a context stopped and another started) serves all."""
    application = str(context.applicationId)
    with _APPLICATION_CONF_LOCK:
        cached = _APPLICATION_CONF.get(context)
    if cached is not None and cached[0] == application:
        return cached[1]
    entries = {str(k): str(v) for k, v in context.getConf().getAll()}
    with _APPLICATION_CONF_LOCK:
        _APPLICATION_CONF[context] = (application, entries)
    return entries


class SessionView:
    """One session as a shuffle call sees it, resolved once where a public function is called and
    passed down: whether it is Spark Connect, and (read on first use, then kept) the application's
    conf as this session may see it, arrowbeat's settings and the application id."""

    def __init__(self, spark: Any, connect: bool) -> None:
        self.spark = spark
        self.connect = connect
        self.settings: Any = None
        """``shuffle_settings``' answer for this call (an ``ArrowBeatConfig``), kept on first use."""
        self._app_conf: dict[str, str] | None = None
        self._app_id: str | None = None

    @classmethod
    def of(cls, spark: Any) -> SessionView:
        return cls(spark, is_connect(spark))

    @property
    def app_conf(self) -> dict[str, str]:
        """The application's conf: every entry, or (Spark Connect) every one not withheld."""
        if self._app_conf is None:
            self._app_conf = (
                _client_conf(self.spark) if self.connect else _application_conf(self.spark.sparkContext)
            )
        return self._app_conf

    def conf_value(self, key: str, default: str) -> str:
        """One entry of the application's conf (``SparkConf`` classic, the session's on Connect)."""
        if not self.connect:
            return self.app_conf.get(key) or default
        return str(self.spark.conf.get(key, default) or default)

    def app_id(self) -> str:
        """The application id (``spark.app.id`` on Spark Connect)."""
        if self._app_id is None:
            if not self.connect:
                self._app_id = str(self.spark.sparkContext.applicationId)
            else:
                found = self.spark.conf.get("spark.app.id", None)
                if not found:
                    raise ShuffleConfigError("this Spark Connect session does not show spark.app.id")
                self._app_id = str(found)
        return self._app_id


def as_view(session: Any) -> SessionView:
    """``session`` if it is a view already, else its view (resolved now)."""
    return session if isinstance(session, SessionView) else SessionView.of(session)


def _client_conf(spark: Any) -> dict[str, str]:
    """A Spark Connect session's conf: every entry Spark does not withhold from clients."""
    entries = getattr(spark.conf, "getAll", None)
    if not isinstance(entries, dict):
        raise ShuffleConfigError(
            f"this Spark Connect session's conf has no getAll mapping (found {type(entries).__name__}): "
            "arrowbeat cannot read the application's settings through it"
        )
    return {str(k): str(v) for k, v in entries.items() if v is not None}


def conf_entries(session: Any) -> list[tuple[str, str]]:
    """The application's conf as this session may see it (``SessionView.app_conf``)."""
    return list(as_view(session).app_conf.items())


def app_id(session: Any) -> str:
    """The application id (``SessionView.app_id``)."""
    return as_view(session).app_id()


def conf_value(session: Any, key: str, default: str) -> str:
    """One entry of the application's conf (``SessionView.conf_value``)."""
    return as_view(session).conf_value(key, default)


def _probe(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The probe's task: its stage id and partition (module level: pickled by reference)."""
    from pyspark import TaskContext

    for _ in batches:
        pass
    ctx = TaskContext.get()
    if ctx is None:
        raise ShuffleError("the shuffle-id probe ran outside a Spark task")
    yield pa.record_batch(
        [pa.array([ctx.stageId()], pa.int64()), pa.array([ctx.partitionId()], pa.int32())],
        names=["stage", "partition"],
    )


def probe(spark: Any, count_parallelism: bool = False) -> tuple[int, int]:
    """Run one probe job: ``(a stage id of its own, partitions it had)``.

    With ``count_parallelism`` the job is ``spark.range`` with Spark's default partitioning (one
    task per partition); else one task."""
    source = spark.range(0, PROBE_ROWS) if count_parallelism else spark.range(0, 1, numPartitions=1)
    table = source.mapInArrow(_probe, _PROBE_SCHEMA).toArrow()
    stages = set(table.column("stage").to_pylist())
    if len(stages) != 1:
        raise ShuffleError(f"the shuffle-id probe ran in stages {sorted(stages)}; expected one")
    return int(stages.pop()), len(set(table.column("partition").to_pylist()))


def shuffle_id_from_stage(stage: int) -> int:
    """A shuffle id made from a stage id (``STAGE_IDS_FROM`` up), or ``ShuffleError`` past int32."""
    if not 0 <= stage < (1 << 31) - STAGE_IDS_FROM:
        raise ShuffleError(f"stage id {stage} leaves no room for a shuffle id below 2**31")
    return STAGE_IDS_FROM + stage


def new_shuffle_id(session: Any) -> int:
    """A shuffle id unique in the application.

    Classic: the SparkContext's own counter (``SparkContext.newShuffleId``, public in the JVM's
    bytecode), unique also across Python processes sharing one SparkContext (notebooks). Spark
    Connect (or a JVM without that method, with one warning): a probe job's stage id, offset.
    Random ids could collide (they did at 31 bits)."""
    global _warned_fallback
    view = as_view(session)
    spark = view.spark
    if not view.connect:
        try:
            return int(spark.sparkContext._jsc.sc().newShuffleId())
        except Exception as exc:  # py4j raises its own types; any failure means: not there
            if not _warned_fallback:
                _warned_fallback = True
                log.warning(
                    "SparkContext.newShuffleId is not callable here (%s): arrowbeat numbers its "
                    "shuffles by probe-job stage ids instead (one tiny job per shuffle)",
                    type(exc).__name__,
                )
    stage, _ = probe(spark)
    return shuffle_id_from_stage(stage)


def default_parallelism(session: Any) -> int:
    """The application's default parallelism, as Spark's adaptive coalescing reads it."""
    view = as_view(session)
    spark = view.spark
    if not view.connect:
        return int(spark.sparkContext.defaultParallelism)
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        try:
            return max(1, int(str(configured)))
        except ValueError:
            pass  # Spark would refuse it too; count what it really does
    _, partitions = probe(spark, count_parallelism=True)
    return partitions


def spark_of(session: Any) -> Any:
    """The SparkSession of a view, or the session itself."""
    return session.spark if isinstance(session, SessionView) else session


def sql_conf(session: Any, key: str, default: str) -> str:
    """One SQL setting as the session sees it: ``spark.conf.set``, the application's conf, else
    *this Spark's* default for the key (``default`` only where this Spark has no such key).

    Spark's defaults move between versions, and PySpark's workers convert with the effective
    value: ``spark.sql.session.timeZone`` is unset until a user sets it, yet the workers get the
    JVM's zone (a pandas result with a timestamp column needs it from pyspark 4.2), and
    ``...pandas.convertToArrowArraySafely`` is ``true`` in this Spark where older ones had ``false``.
    ``spark.conf.get(key)`` without a default answers the effective value."""
    try:
        value = spark_of(session).conf.get(key)
    except Exception:  # a key this Spark does not define (py4j or Connect raise their own types)
        value = None
    return default if value in (None, "", "<undefined>") else str(value)


def sql_flag(session: Any, key: str, default: str) -> bool:
    """A boolean SQL setting as ``sql_conf`` reads it."""
    return sql_conf(session, key, default).strip().lower() == "true"


def pandas_conversion(session: Any) -> PandasConversion:
    """The settings PySpark's pandas UDF workers would convert with in this session (read once,
    when the plan is made, and shipped with it)."""
    return PandasConversion(
        timezone=sql_conf(session, "spark.sql.session.timeZone", "") or None,
        safecheck=sql_flag(session, "spark.sql.execution.pandas.convertToArrowArraySafely", "false"),
        assign_cols_by_name=sql_flag(
            session, "spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName", "true"
        ),
        prefer_int_ext_dtype=sql_flag(
            session, "spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype", "false"
        ),
        int_to_decimal_coercion=sql_flag(
            session, "spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled", "false"
        ),
        large_var_types=sql_flag(session, "spark.sql.execution.arrow.useLargeVarTypes", "false"),
    )


def arrow_batch_rows(session: Any) -> int:
    """``spark.sql.execution.arrow.maxRecordsPerBatch`` (<= 0: no limit, as in Spark)."""
    text = sql_conf(session, "spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
    try:
        rows = int(text)
    except ValueError:
        raise ShuffleConfigError(
            f"spark.sql.execution.arrow.maxRecordsPerBatch={text!r}: expected an integer"
        ) from None
    return rows if rows > 0 else 1 << 62
