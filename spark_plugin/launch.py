"""How users turn arrowbeat on: ``spark-submit`` flags and ``SparkSession.builder`` settings.

Both come from one list of ``(key, value)`` pairs, so the two ways cannot drift apart.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from spark_plugin.errors import SetupError

PLUGIN_CLASS = "arrowbeat.ArrowBeatPlugin"
DELTA_VERSION = "4.0.1"
_ROOT = Path(__file__).resolve().parent.parent


def jar_paths() -> list[str]:
    """The launcher jar and the Delta jars: ``$ARROWBEAT_JARS`` (comma-separated) or the set-up cache."""
    override = os.environ.get("ARROWBEAT_JARS")
    if override:
        jars = [p for p in override.split(",") if p]
    else:
        cache = _ROOT / ".cache"
        jars = [
            str(cache / "launcher" / "arrowbeat-launcher.jar"),
            str(cache / "jars" / f"delta-spark_2.13-{DELTA_VERSION}.jar"),
            str(cache / "jars" / f"delta-storage-{DELTA_VERSION}.jar"),
        ]
    missing = [j for j in jars if not Path(j).is_file()]
    if missing:
        raise SetupError(f"missing {', '.join(missing)}: run `make setup` in {_ROOT} (or set ARROWBEAT_JARS)")
    return jars


PYTHON_DAEMON_MODULE = "spark_plugin.python_daemon"


def workers_run_arrowbeat_python(python: str) -> bool:
    """Do PySpark's workers run ``python`` (so they can import arrowbeat's daemon module)?

    They run ``PYSPARK_PYTHON``; the paths are compared as given, not resolved (a venv's python
    is a link to the system one, which lacks the venv's packages)."""
    workers = os.environ.get("PYSPARK_PYTHON")
    return bool(workers) and os.path.abspath(str(workers)) == os.path.abspath(python)


def spark_settings(python: str | None = None, delta: bool = True) -> list[tuple[str, str]]:
    """The Spark conf entries that turn arrowbeat (and Delta) on.

    When the workers run arrowbeat's Python, also its worker daemon (``python_daemon``), which
    saves every Python task of the application a re-read of ``pyspark.zip`` on Python < 3.12.
    Otherwise the daemon stays PySpark's: a module the workers cannot import would fail them all."""
    python = python or os.environ.get("PYSPARK_PYTHON") or sys.executable
    settings = [
        ("spark.jars", ",".join(jar_paths())),
        ("spark.plugins", PLUGIN_CLASS),
        ("spark.arrowbeat.python", python),
    ]
    if workers_run_arrowbeat_python(python):
        settings.append(("spark.python.daemon.module", PYTHON_DAEMON_MODULE))
    if delta:
        settings += [
            ("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension"),
            ("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"),
        ]
    return settings


def submit_flags(python: str | None = None, delta: bool = True) -> list[str]:
    """``spark-submit`` arguments: ``--jars ...`` then one ``--conf key=value`` per setting."""
    flags: list[str] = []
    for key, value in spark_settings(python, delta):
        flags += ["--jars", value] if key == "spark.jars" else ["--conf", f"{key}={value}"]
    return flags


def configure(builder: Any, python: str | None = None, delta: bool = True) -> Any:
    """Adds arrowbeat (and Delta) to a ``SparkSession.Builder``; returns the builder for chaining."""
    for key, value in spark_settings(python, delta):
        builder = builder.config(key, value)
    return builder
