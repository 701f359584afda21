"""The environment of every test run and benchmark: loopback only, the venv's Python everywhere,
the checkout on every Python process's path, Spark dirs in a scratch folder, and the run marker
that ``tests.harness.procs`` finds its processes by.

``tests/conftest.py`` and every benchmark call :func:`prepare` before they start anything, so a
benchmark gets the same environment as the suite without importing the suite's conftest.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from tests.harness.procs import MARKER

ROOT = Path(__file__).resolve().parents[2]
NO_JVM = "ARROWBEAT_TESTS_NO_JVM"
"""Set when this run starts no JVM beside another that does (``scripts/run_tests.py``): the work
dirs that appear meanwhile are the other run's, and it removes them."""
_scratch: Path | None = None
_work_before: set[str] = set()


def prepare() -> Path:
    """Sets this process's environment for the run (once; later calls change nothing) and returns
    the run's scratch folder, for warehouses, tables and logs."""
    global _scratch, _work_before
    if _scratch is not None:
        return _scratch
    _scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-tests-"))
    # ``tests`` (and ``benchmarks``) are not installed: they run from the checkout. Spark's Python
    # workers unpickle functions of test modules by reference and import them from here, so every
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
    work = _local_cluster_work()
    _work_before = set(os.listdir(work)) if work.is_dir() else set()
    return _scratch


def _local_cluster_work() -> Path:
    """Where ``local-cluster`` Workers put executor dirs: ``$SPARK_HOME/work``, inside the pyspark
    package (they ignore ``SPARK_WORKER_DIR``); each run removes its own."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "work"


def remove_own_work_dirs() -> list[str]:
    """Delete the executor dirs ``local-cluster`` applications of this run left in site-packages
    (those that appeared since :func:`prepare` and no live process works in); returns them."""
    import psutil

    work = _local_cluster_work()
    if _scratch is None or not work.is_dir() or os.environ.get(NO_JVM):
        return []
    new = [work / name for name in os.listdir(work) if name not in _work_before]
    busy: set[Path] = set()
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd") or ""
        busy.update(d for d in new if cwd.startswith(f"{d}{os.sep}") or cwd == str(d))
    removed = [d for d in new if d not in busy]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return [d.name for d in removed]


def clean_up() -> None:
    """Removes the scratch folder and this run's executor dirs (the end of a run)."""
    if _scratch is not None:
        shutil.rmtree(_scratch, ignore_errors=True)
    remove_own_work_dirs()
