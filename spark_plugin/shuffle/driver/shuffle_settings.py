"""A shuffle call's settings on the driver: the application's ``spark.arrowbeat.*`` keys with the
session's runtime conf winning for the keys settable per query, the SQL keys adaptive shuffles
follow, and the call's mode.

Settings are read through ``spark_plugin.settings.config`` (``from_spark_conf``), the one
declaration of every ``spark.arrowbeat.*`` key. A bad setting raises that module's ``ConfigError``
naming the key and the expected form; an unknown mode raises the engine's ``ShuffleConfigError``.
"""

from __future__ import annotations

import warnings

from pyspark.sql import SparkSession

from arrow_shuffle.errors import ShuffleConfigError
from spark_plugin.errors import ConfigError
from spark_plugin.settings.config import OPTIONS, ArrowBeatConfig, from_spark_conf
from spark_plugin.settings.units import parse_duration
from spark_plugin.shuffle.driver.session import SessionView, as_view, conf_value

MODES = ("materialized", "pipelined")
"""``materialized``: map outputs written as files, read by reduce tasks in a later stage
(recoverable); ``pipelined``: map and reduce tasks in one stage, streaming under credits."""


DEPRECATED_MODES = {"blocking": "materialized"}
"""Old mode names still accepted, with a ``DeprecationWarning``."""


_PER_QUERY_FIELDS = (
    "shuffle_read_host_local",
    "shuffle_adaptive",
    "shuffle_reduce_memory_bytes",
    "shuffle_direct_scan",
)
"""``ArrowBeatConfig`` fields whose key the session's runtime conf may override per query."""


# -- building the plan ---------------------------------------------------------------------------
def _key(field: str) -> str:
    """The declared ``spark.arrowbeat.*`` key of an ``ArrowBeatConfig`` field."""
    return next(o.key for o in OPTIONS if o.field == field)


def shuffle_settings(session: SessionView | SparkSession) -> ArrowBeatConfig:
    """The application's arrowbeat settings as this session sees them, for planning a shuffle.

    The application's ``SparkConf`` is what the plugin started with; the session's runtime conf
    (``spark.conf.set``) wins only for keys declared settable per query. Raises ``ConfigError``
    for a malformed setting, and when the plugin is not on (no secret: no agents to shuffle to).
    Read once per view (the call that resolved it)."""
    view = as_view(session)
    if view.settings is not None:
        return view.settings  # type: ignore[no-any-return]
    overrides: dict[str, str] = {}
    for field in _PER_QUERY_FIELDS:
        key = _key(field)
        value = view.spark.conf.get(key, None)
        if value:
            overrides[key] = str(value)
    settings = from_spark_conf(list(view.app_conf.items()), overrides)
    # Spark Connect never shows a client the secret: the driver-side process's address says the
    # plugin is on, and the tasks get the secret from their agents.
    if not settings.secret and not (view.connect and settings.rm_address):
        raise ConfigError(
            [
                f"{_key('secret')} is unset: arrowbeat is not on in this application; "
                "set spark.plugins=arrowbeat.ArrowBeatPlugin (see spark_plugin.configure)"
            ]
        )
    view.settings = settings
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


def _retry_wait_s(session: SessionView | SparkSession) -> float:
    """``spark.shuffle.io.retryWait`` (Spark reads it in seconds: a bare number is seconds)."""
    text = conf_value(session, "spark.shuffle.io.retryWait", "5s")
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


def _sql_conf(session: SessionView | SparkSession) -> dict[str, str]:
    """The session's adaptive-execution settings that are set (Spark's defaults apply otherwise)."""
    runtime = as_view(session).spark.conf
    found = {}
    for key in _ADAPTIVE_SQL_KEYS:
        value = runtime.get(key, None)
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
