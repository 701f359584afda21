"""The environment of every test run and benchmark: loopback only, the venv's Python everywhere,
the checkout on every Python process's path, Spark dirs in a scratch folder, and the run marker
that ``harness.procs`` finds its processes by.

Every benchmark calls :func:`prepare` before it starts anything, and ``tests/conftest.py`` calls
:func:`for_tests` (``prepare`` and the tests' JVM options), so a benchmark gets the same
environment as the suite without importing the suite's conftest.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import MutableMapping
from pathlib import Path

from harness.procs import MARKER
from scripts.matrix import WHEELHOUSE

ROOT = Path(__file__).resolve().parents[1]
SPARK_HOME_DIR = "spark-home"
"""The run's own Spark home, in its scratch folder (``_spark_home``)."""
_scratch: Path | None = None


def prepare() -> Path:
    """Sets this process's environment for the run (once; later calls change nothing) and returns
    the run's scratch folder, for warehouses, tables and logs."""
    global _scratch
    if _scratch is not None:
        return _scratch
    _scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-tests-"))
    atexit.register(clean_up)  # also when no test ran (collection only, an error) and for benchmarks
    # ``tests``, ``benchmarks`` and ``harness`` are not installed: they run from the checkout. Spark's
    # Python workers unpickle functions of test modules by reference and import them from here, so every
    # process the run starts gets the checkout on its path (Spark merges PYTHONPATH into theirs).
    if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault(MARKER, uuid.uuid4().hex)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_WORKER_DIR"] = str(_scratch / "work")
    os.environ["SPARK_LOCAL_DIRS"] = str(_scratch / "local")
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    os.environ["SPARK_HOME"] = str(_spark_home(_scratch / SPARK_HOME_DIR))
    return _scratch


def _spark_home(home: Path) -> Path:
    """The installed pyspark as a Spark home of the run's own: a folder of links to every entry
    of the package but ``work``.

    Why: ``local-cluster``'s Workers put their executor dirs (logs, fetched files, the executors'
    working directories) in ``$SPARK_HOME/work`` and ignore ``SPARK_WORKER_DIR``. Left at the
    package, that is inside site-packages and shared by every run on the machine; two runs side
    by side (``scripts/run_tests.py``'s shards) even share dirs, since local-cluster application
    ids are the second they started and a counter that starts at 0 in each application's Master.
    Here each run's work dirs are in its scratch folder, removed with it."""
    import pyspark

    package = Path(pyspark.__file__).resolve().parent
    home.mkdir(parents=True, exist_ok=True)
    for entry in package.iterdir():
        if entry.name != "work" and not (home / entry.name).exists():
            (home / entry.name).symlink_to(entry)
    return home


TEST_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1",)
"""Every JVM a test starts compiles with C1 alone. A test's JVMs live seconds to a minute on
small data, where C2's optimising compiles cost more CPU than they ever pay back: one
local-cluster application started, run through a shuffle and a pandas UDF and stopped took
40 CPU s (25 s wall) with the JVM's default tiers, 22 (18 s) with C1 alone, and the Spark tests
are CPU-bound on 2 cores. Behaviour is the same (the compiler tier changes no semantics; the
collector stays G1, the one users run). Benchmarks keep the JVM's defaults: they measure what
users run. (The chaos test runs ``harness.chaos`` as its child, with the test's options: it
asserts invariants, not speed.)"""


def for_tests() -> Path:
    """``prepare``, the tests' JVM options (``TEST_JVM_OPTIONS``, through ``JAVA_TOOL_OPTIONS``,
    which every JVM reads: Spark's driver, executors, standalone daemons, Maven) and the matrix's
    ``WHEELHOUSE`` for their pip runs (``PIP_FIND_LINKS``: the installed wheel's venv and its
    resolutions beside every supported pyspark take each pyspark's wheel from there); called by the
    suite's conftest, never by a benchmark. Options already set come first and are kept."""
    scratch = prepare()
    for option in TEST_JVM_OPTIONS:
        with_java_option(os.environ, option)
    if WHEELHOUSE.is_dir():  # beside any the machine sets (pip reads the variable as a list)
        links = os.environ.get("PIP_FIND_LINKS", "").split()
        if str(WHEELHOUSE) not in links:
            os.environ["PIP_FIND_LINKS"] = " ".join([*links, str(WHEELHOUSE)])
    return scratch


def with_java_option(env: MutableMapping[str, str], option: str) -> None:
    """Adds ``option`` to ``env``'s ``JAVA_TOOL_OPTIONS`` unless it is there, keeping what is."""
    have = env.get("JAVA_TOOL_OPTIONS", "").split()
    if option not in have:
        env["JAVA_TOOL_OPTIONS"] = " ".join([*have, option])


def local_cluster_work() -> Path:
    """Where ``local-cluster`` Workers put executor dirs: ``$SPARK_HOME/work``, the run's own
    (``_spark_home``)."""
    return prepare() / SPARK_HOME_DIR / "work"


def clean_up() -> None:
    """Removes the scratch folder, this run's executor dirs with it (the end of a run)."""
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
