"""arrowbeat as a user gets it from ``pip install``: a wheel built from a clean export of this
checkout, installed into a fresh venv outside it, run with no trace of the checkout (no
``PYTHONPATH``, no ``.cache/`` jars, none of the test run's ``PYSPARK_*``).

Built once per test run (``installed_wheel``, session scope, registered in ``tests/conftest.py``:
a module that imported it would get a second build) for ``tests/test_wheel.py`` and
``tests/spark/test_packed_env.py``; each step's seconds are kept in ``Installed.timings``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPARK_LOCK = Path("/tmp/arrowbeat-spark.lock")


@dataclass
class Installed:
    wheel: Path
    venv: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return next(self.venv.glob("lib/python3.*/site-packages"))

    def env(self, **extra: str) -> dict[str, str]:
        """A user's environment with this venv first on the PATH and as PySpark's Python."""
        env = clean_env()
        env["PATH"] = os.pathsep.join([str(self.venv / "bin"), env["PATH"]])
        env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = str(self.python)
        env.update(extra)
        return env


HOOK_PROBE = (
    "import sys\n"
    "from pyspark.sql.pandas.group_ops import PandasGroupedOpsMixin, PandasCogroupedOps\n"
    "from pyspark.sql.classic.dataframe import DataFrame\n"
    "methods = (DataFrame.groupBy, PandasGroupedOpsMixin.applyInPandas,\n"
    "           PandasCogroupedOps.applyInArrow)\n"
    "print(*(getattr(m, '__arrowbeat_wrapped__', False) for m in methods))\n"
    "print('spark_plugin.shuffle.driver.takeover' in sys.modules)\n"
)
"""A script that imports only PySpark and prints whether its grouped-map methods are wrapped (three
words), then whether arrowbeat's take-over code was imported (it must not be before a call)."""


def hook_probe(python: Path, cwd: Path, env: dict[str, str]) -> list[str]:
    """``HOOK_PROBE``'s four words, run by ``python`` in ``cwd`` (no JVM): ``True True True False``
    where the start-up line (``arrowbeat.pth``) is installed."""
    done = subprocess.run(
        [str(python), "-c", HOOK_PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def clean_env() -> dict[str, str]:
    """This process's environment less the test run's settings that point into the checkout
    (``PYTHONPATH`` would even make pip take the checkout's egg-info for an installed arrowbeat)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "ARROWBEAT_JARS"))}
    for key in ("PYTHONPATH", "SPARK_HOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    checkout_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != checkout_bin)
    return env


def export_checkout(dest: Path) -> Path:
    """The files git would commit (tracked, plus new files that are not ignored), copied to
    ``dest``: a fresh clone's tree, without ``.venv``, ``.cache`` or build leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not exported
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def timed(
    timings: dict[str, float],
    step: str,
    command: list[str],
    extra_env: dict[str, str] | None = None,
    **kwargs: object,
) -> None:
    started = time.monotonic()
    env = {**clean_env(), **(extra_env or {})}
    done = subprocess.run(command, capture_output=True, text=True, env=env, **kwargs)  # type: ignore[call-overload]
    timings[step] = round(time.monotonic() - started, 1)
    assert done.returncode == 0, f"{step} failed: {command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """``pip wheel`` (with build isolation: its build requirements come from the index, as on a
    fresh machine) of the exported checkout, then ``pip install`` of it into a new venv."""
    base = tmp_path_factory.mktemp("wheel")
    timings: dict[str, float] = {}
    source = export_checkout(base / "src")
    dist = base / "dist"
    # The launcher's API jars as `make setup` fetched them (`make wheel` passes them the same way):
    # without them the build backend runs Maven five times into a temporary folder, ~20 CPU-s.
    kept = ROOT / ".cache" / "launcher" / "classpath"
    timed(
        timings,
        "pip wheel",
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(source)],
        {"ARROWBEAT_LAUNCHER_CLASSPATH": str(kept)} if kept.is_dir() else None,
    )
    (wheel,) = dist.glob("arrowbeat-*.whl")
    venv = base / "venv"
    timed(timings, "venv", [sys.executable, "-m", "venv", str(venv)])
    installed = Installed(wheel, venv, timings)
    # The primary cell's exact set (as CI tests it); what pip resolves without it, for every
    # supported pyspark, is tests/test_wheel.py's business.
    lock = ROOT / "locks" / "spark-4.2.txt"
    timed(
        timings,
        "pip install",
        [str(installed.python), "-m", "pip", "install", "-q", "-c", str(lock), str(wheel)],
        cwd=base,
    )
    print(f"installed the wheel: {timings}")
    return installed


def _holds(path: Path) -> bool:
    """Is ``path`` open in this process: inherited from ``flock path command`` that started it?"""
    fds = Path("/proc/self/fd")
    for fd in fds.iterdir() if fds.is_dir() else ():
        with contextlib.suppress(OSError):
            if os.readlink(fd) == str(path):
                return True
    return False


@contextlib.contextmanager
def spark_lock() -> Iterator[None]:
    """One Spark application at a time on a shared development machine (``/tmp/arrowbeat-spark.lock``,
    as ``flock`` takes it); a no-op when this process was started under that lock already."""
    if _holds(SPARK_LOCK):
        yield
        return
    with SPARK_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
