"""How users turn arrowbeat on: ``spark-submit`` flags and ``SparkSession.builder`` settings.

Both come from one list of ``(key, value)`` pairs, so the two ways cannot drift apart.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from spark_plugin.compat import versions
from spark_plugin.errors import SetupError

PLUGIN_CLASS = "arrowbeat.ArrowBeatPlugin"
LAUNCHER_JAR = "arrowbeat-launcher.jar"
# Where a wheel carries the launcher jar (the build hook in build_backend/ compiles it there).
PACKAGE_JARS = Path(__file__).resolve().parent.parent / "jars"  # spark_plugin/jars in a wheel
_ROOT = Path(__file__).resolve().parents[2]
# Where `make setup` puts the jars in a source checkout.
_CACHE = _ROOT / ".cache"
_log = logging.getLogger(__name__)


def launcher_jar() -> str:
    """The launcher jar. First match wins: the jar inside this package (``spark_plugin/jars/``,
    where a wheel puts it); else the source checkout's ``.cache/launcher/`` (where ``make setup``
    builds it; the checkout's editable install finds it there, its package dir never holds a jar)."""
    candidates = [PACKAGE_JARS / LAUNCHER_JAR, _CACHE / "launcher" / LAUNCHER_JAR]
    launcher = next((c for c in candidates if c.is_file()), None)
    if launcher is None:
        raise SetupError(
            f"the arrowbeat launcher jar is missing: looked for {' and '.join(map(str, candidates))}. "
            "Install arrowbeat from a wheel (`pip install arrowbeat-*.whl` carries it), run "
            "`make setup` in a source checkout, or set ARROWBEAT_JARS"
        )
    return str(launcher)


def jar_paths(spark_version: str | None = None) -> list[str]:
    """The jars for ``--jars``: the launcher, and Delta's for this Spark when a local copy exists.

    ``$ARROWBEAT_JARS`` (comma-separated) is taken as given. Otherwise the launcher
    (:func:`launcher_jar`), plus the Delta jars that match ``spark_version`` (default: the Spark
    that ``spark-submit`` runs) when the checkout's ``.cache/jars/`` has them; an installed wheel
    has none, and Spark resolves Delta itself (see :func:`delta_package`)."""
    override = os.environ.get("ARROWBEAT_JARS")
    if override:
        jars = [p for p in override.split(",") if p]
        missing = [j for j in jars if not Path(j).is_file()]
        if missing:
            raise SetupError(f"ARROWBEAT_JARS names missing files: {', '.join(missing)}")
        return jars
    delta = versions.delta_jars(spark_version or versions.running_spark_version())
    local = [_CACHE / "jars" / name for name in delta.file_names()]
    have_delta = bool(local) and all(j.is_file() for j in local)
    return [launcher_jar()] + ([str(j) for j in local] if have_delta else [])


def delta_package(jars: list[str], spark_version: str | None = None) -> str | None:
    """Delta's Maven coordinates for ``spark.jars.packages`` when ``jars`` carry no Delta jar
    (Spark then fetches them through its own Ivy resolution); None when they do, or when this Spark
    has no Delta release (:func:`spark_plugin.compat.versions.delta_jars` says why)."""
    if any("delta-spark" in Path(j).name for j in jars):
        return None
    delta = versions.delta_jars(spark_version or versions.running_spark_version())
    return delta.coordinates[0] if delta.available else None


def notices(delta: bool = True, spark_version: str | None = None) -> list[str]:
    """What a user should know about this Spark before starting: a Spark outside the supported
    minors, a missing Delta release for it (when Delta was asked for), too old pyarrow or pandas."""
    version = spark_version or versions.running_spark_version()
    found = [versions.spark_support(version).message, versions.delta_jars(version).reason if delta else None]
    return [n for n in found if n] + versions.library_problems()


PYTHON_DAEMON_MODULE = "spark_plugin.python_worker.daemon"


def workers_run_arrowbeat_python(python: str) -> bool:
    """Do PySpark's workers run ``python`` (so they can import arrowbeat's daemon module)?

    They run ``PYSPARK_PYTHON``; the paths are compared as given, not resolved (a venv's python
    is a link to the system one, which lacks the venv's packages)."""
    workers = os.environ.get("PYSPARK_PYTHON")
    return bool(workers) and os.path.abspath(str(workers)) == os.path.abspath(python)


PACKED_ENV_NAME = "env"
PACKED_PYTHON = f"./{PACKED_ENV_NAME}/bin/python"


def packed_env_settings(archive: str, driver_python: str | None = None) -> list[tuple[str, str]]:
    """Executors run ``archive`` (a ``python -m spark_plugin pack`` environment), unpacked by Spark
    as ``./env`` in each executor's working directory: PySpark's workers and arrowbeat's agent use
    its ``./env/bin/python``. The driver side (client mode: no archive is unpacked there) keeps
    ``driver_python`` (default: this interpreter) for PySpark and arrowbeat alike."""
    driver_python = driver_python or sys.executable
    return [
        ("spark.archives", f"{Path(archive).absolute()}#{PACKED_ENV_NAME}"),
        ("spark.pyspark.python", PACKED_PYTHON),
        ("spark.pyspark.driver.python", driver_python),
        ("spark.arrowbeat.python", PACKED_PYTHON),
        ("spark.arrowbeat.driver.python", driver_python),
    ]


def spark_settings(
    python: str | None = None, delta: bool = True, archive: str | None = None
) -> list[tuple[str, str]]:
    """The Spark conf entries that turn arrowbeat (and Delta) on.

    When the workers run arrowbeat's Python, also its worker daemon (``python_worker.daemon``), which
    saves every Python task of the application a re-read of ``pyspark.zip`` on Python < 3.12.
    Otherwise the daemon stays PySpark's: a module the workers cannot import would fail them all.
    With ``archive`` (a packed environment, see :func:`packed_env_settings`) the workers run it,
    and ``python`` is the driver side's interpreter."""
    spark_version = versions.running_spark_version()
    jars = jar_paths(spark_version)
    settings = [("spark.jars", ",".join(jars)), ("spark.plugins", PLUGIN_CLASS)]
    if archive:
        settings += packed_env_settings(archive, python)
        settings.append(("spark.python.daemon.module", PYTHON_DAEMON_MODULE))
    else:
        python = python or os.environ.get("PYSPARK_PYTHON") or sys.executable
        settings.append(("spark.arrowbeat.python", python))
        if workers_run_arrowbeat_python(python):
            settings.append(("spark.python.daemon.module", PYTHON_DAEMON_MODULE))
    # No Delta release for this Spark: its session extension would not load (notices() says so).
    delta = delta and versions.delta_jars(spark_version).available
    package = delta_package(jars, spark_version)
    if delta and package:
        settings.append(("spark.jars.packages", package))
    if delta:
        settings += [
            ("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"),
            ("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"),
        ]
    return settings


_SUBMIT_OPTIONS = {
    "spark.jars": "--jars",
    "spark.jars.packages": "--packages",
    "spark.archives": "--archives",
}


def submit_flags(python: str | None = None, delta: bool = True, archive: str | None = None) -> list[str]:
    """``spark-submit`` arguments: ``--jars``/``--packages``/``--archives`` for the settings that
    spark-submit has an option for, one ``--conf key=value`` for each other."""
    flags: list[str] = []
    for key, value in spark_settings(python, delta, archive):
        option = _SUBMIT_OPTIONS.get(key)
        flags += [option, value] if option else ["--conf", f"{key}={value}"]
    return flags


def configure(builder: Any, python: str | None = None, delta: bool = True, archive: str | None = None) -> Any:
    """Adds arrowbeat (and Delta) to a ``SparkSession.Builder``; returns the builder for chaining.
    What :func:`notices` finds is logged as warnings."""
    for notice in notices(delta):
        _log.warning("arrowbeat: %s", notice)
    for key, value in spark_settings(python, delta, archive):
        builder = builder.config(key, value)
    return builder
