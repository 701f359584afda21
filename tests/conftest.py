"""Environment for every test: loopback only, the venv's Python everywhere, the checkout on every
Python process's path, Spark dirs in a temp folder, and a final check that the run left no
process behind."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.procs import MARKER, end, ours, wait_until

_SCRATCH = Path(tempfile.mkdtemp(prefix="arrowbeat-tests-"))
ROOT = Path(__file__).resolve().parent.parent
# ``tests`` (and ``benchmarks``) are not installed: they run from the checkout. Spark's Python
# workers unpickle functions of test modules by reference and import them from here, so every
# process the run starts gets the checkout on its path (Spark merges PYTHONPATH into theirs).
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
os.environ.setdefault(MARKER, uuid.uuid4().hex)
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_WORKER_DIR"] = str(_SCRATCH / "work")
os.environ["SPARK_LOCAL_DIRS"] = str(_SCRATCH / "local")
os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")


def _local_cluster_work() -> Path:
    """Where ``local-cluster`` Workers put executor dirs: ``$SPARK_HOME/work``, inside the pyspark
    package (they ignore ``SPARK_WORKER_DIR``); each run removes its own."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "work"


_WORK_BEFORE = set(os.listdir(_local_cluster_work())) if _local_cluster_work().is_dir() else set()


def remove_own_work_dirs() -> list[str]:
    """Delete the executor dirs ``local-cluster`` applications of this run left in site-packages
    (those that appeared since the run started and no live process works in); returns them."""
    import psutil

    work = _local_cluster_work()
    if not work.is_dir():
        return []
    new = [work / name for name in os.listdir(work) if name not in _WORK_BEFORE]
    busy: set[Path] = set()
    for proc in psutil.process_iter(["cwd"]):
        cwd = proc.info.get("cwd") or ""
        busy.update(d for d in new if cwd.startswith(f"{d}{os.sep}") or cwd == str(d))
    removed = [d for d in new if d not in busy]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return [d.name for d in removed]


@pytest.fixture(scope="session")
def scratch() -> Path:
    """A per-run folder for warehouses, tables and logs."""
    return _SCRATCH


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """After the suite, nothing this run started may still run (JVMs, executors, agents, RMs)."""
    yield
    gone = wait_until(lambda: not ours(), timeout_s=20)
    leftovers = [" ".join(p.cmdline())[:160] for p in ours()]
    end(ours())
    shutil.rmtree(_SCRATCH, ignore_errors=True)
    remove_own_work_dirs()
    assert gone, f"processes left running after the tests: {leftovers}"
