"""The version matrix: one cell per supported Spark minor, each an exact, locked environment.

``pyproject.toml`` declares ranges; each cell pins one tested set of them in ``locks/<cell>.txt``
(pip constraints), resolved from the cell's seeds by ``lock``. The primary cell (the newest Spark
that Delta has a release for) is the checkout's ``.venv`` and runs the whole suite; every other
cell has a venv under ``.cache/venvs/`` and runs the compatibility subset (tests marked
``compat``). Python versions, pyarrow (oldest and newest) and pandas 2 and 3 are spread across the
cells.

    python -m scripts.matrix list                 the cells that run the compatibility subset
    python -m scripts.matrix venv CELL            create or refresh the cell's venv (cached by lock)
    python -m scripts.matrix wheelhouse           build every cell's pyspark wheel once (WHEELHOUSE)
    python -m scripts.matrix run CELL [ARGS]      run the subset there (ARGS go to pytest)
    python -m scripts.matrix run-all [--jobs N]   every non-primary cell, N at a time (default 3)
    python -m scripts.matrix lock CELL            re-resolve locks/CELL.txt from the cell's seeds
    python -m scripts.matrix delta-jars           the Delta jars (Maven coordinates) of every Spark minor
    python -m scripts.matrix table                the table of the cells (README; the site generates it)

Only the standard library is imported here: ``make`` runs it before any venv exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "locks"
VENVS = ROOT / ".cache" / "venvs"
WHEELHOUSE = ROOT / ".cache" / "wheelhouse"
"""Each cell's pyspark as a wheel, built once from its sdist (about 455 MB; PyPI has no wheel of
it). pip neither keeps that download in its HTTP cache nor reuses its own built wheel for it: every
venv, install and resolution that named a pyspark fetched and unpacked the sdist again, nine
times in a fresh machine's ``make test``. Every pip run of the project's set-up and tests looks
here first (``--find-links``; ``PIP_FIND_LINKS`` for the tests' own, ``harness.env``) and takes
the wheel of the same version from here: no fetch, no build."""
COMPAT_TESTS = (
    "tests/compat",
    "tests/spark/test_launcher_compat.py",
    "tests/spark_plugin/shuffle/test_pandas_groups.py",
)
"""Where the tests marked ``compat`` live: a cell collects these, not all of ``tests/`` (three cells
at once each importing some 1,500 tests cost about ten CPU-seconds apiece). ``tests/test_matrix.py``
checks that no test elsewhere carries the mark."""


@dataclass(frozen=True)
class Cell:
    name: str
    python: str
    """The interpreter's minor version: found as ``pythonX.Y`` on PATH, else through pyenv."""
    seeds: tuple[str, ...]
    """What ``lock`` resolves the cell from: pins of the versions this cell stands for."""
    extras: str = "test"
    primary: bool = False

    @property
    def lock(self) -> Path:
        return LOCKS / f"{self.name}.txt"

    @property
    def venv(self) -> Path:
        return ROOT / ".venv" if self.primary else VENVS / self.name


CELLS = (
    Cell(
        "spark-4.2",
        "3.11",
        ("pyspark==4.2.1", "pyarrow==21.0.0", "pandas==2.2.3"),
        extras="dev",
        primary=True,
    ),
    # The oldest of everything arrowbeat supports (pyarrow 16: see spark_plugin/compat/versions.py).
    Cell(
        "spark-4.0",
        "3.11",
        (
            *("pyspark==4.0.5", "pyarrow==16.0.0", "pandas==2.0.3", "numpy==1.26.4", "deltalake==1.5.1"),
            *("grpcio==1.74.0", "grpcio-status==1.74.0", "protobuf==6.31.1"),
        ),
    ),
    Cell("spark-4.1", "3.13", ("pyspark==4.1.4", "pyarrow==26.0.1", "pandas==3.1.1")),
    Cell("spark-4.3", "3.12", ("pyspark==4.3.0", "pyarrow==26.0.1", "pandas==3.1.1")),
)


def cell(name: str) -> Cell:
    for c in CELLS:
        if c.name == name:
            return c
    raise SystemExit(f"matrix: no cell {name!r}; the cells are {', '.join(c.name for c in CELLS)}")


def _is_python(path: str, version: str) -> bool:
    """Does ``path`` run Python ``version``? (A pyenv shim on PATH may not, for a version that is
    installed but not selected.)"""
    try:
        done = subprocess.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == version


def interpreter(version: str) -> str:
    """A Python ``version`` (``"3.13"``): pyenv's newest ``3.13.x`` if pyenv has one, else
    ``python3.13`` on PATH."""
    candidates: list[str] = []
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = Path(
            subprocess.run([pyenv, "root"], capture_output=True, text=True, check=True).stdout.strip()
        )
        installed = sorted(
            (p for p in (root / "versions").glob(f"{version}.*") if (p / "bin" / "python").is_file()),
            key=lambda p: tuple(int(x) for x in p.name.split(".") if x.isdigit()),
        )
        candidates += [str(p / "bin" / "python") for p in reversed(installed)]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    for candidate in candidates:
        if _is_python(candidate, version):
            return candidate
    raise SystemExit(
        f"matrix: no Python {version}: install it (pyenv install {version}, or apt-get install "
        f"python{version} python{version}-venv) so that python{version} is on PATH"
    )


def _stamp(c: Cell) -> str:
    """What a venv was made from: the lock, the project's declared dependencies, the interpreter."""
    digest = hashlib.sha256(c.lock.read_bytes())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    digest.update(c.python.encode())
    return digest.hexdigest()


def _pip(python: Path, *args: str) -> None:
    links = ["--find-links", str(WHEELHOUSE)] if args[0] in ("install", "wheel") else []
    subprocess.run(
        [str(python), "-m", "pip", "-q", "--disable-pip-version-check", *args, *links], check=True, cwd=ROOT
    )


def pyspark_wheel(c: Cell) -> Path:
    """The wheel of the pyspark ``c``'s lock pins, in ``WHEELHOUSE``: built there (fetched once)
    when missing."""
    version = locked(c, "pyspark")
    found = sorted(WHEELHOUSE.glob(f"pyspark-{version}-*.whl"))
    if found:
        return found[0]
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    _pip(Path(sys.executable), "wheel", "--no-deps", "--wheel-dir", str(WHEELHOUSE), f"pyspark=={version}")
    [built] = WHEELHOUSE.glob(f"pyspark-{version}-*.whl")
    print(f"matrix: built {built.name} in {time.monotonic() - began:.0f} s", flush=True)
    return built


def venv(c: Cell) -> Path:
    """Creates or refreshes ``c``'s venv from its lock; does nothing when it is up to date."""
    if not c.lock.is_file():
        raise SystemExit(f"matrix: {c.lock} is missing: run `python -m scripts.matrix lock {c.name}`")
    stamp_file = c.venv / ".matrix-stamp"
    stamp = _stamp(c)
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return c.venv
    pyspark_wheel(c)
    python = c.venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([interpreter(c.python), "-m", "venv", str(c.venv)], check=True)
    _pip(python, "install", "--upgrade", "pip")
    _pip(python, "install", "-c", str(c.lock), "-e", f".[{c.extras}]")
    stamp_file.write_text(stamp)
    return c.venv


def lock(c: Cell) -> None:
    """Resolves the cell's seeds plus the project's ranges in a scratch venv and freezes them."""
    with tempfile.TemporaryDirectory(prefix=f"arrowbeat-lock-{c.name}-") as scratch:
        subprocess.run([interpreter(c.python), "-m", "venv", scratch], check=True)
        python = Path(scratch) / "bin" / "python"
        _pip(python, "install", "--upgrade", "pip")
        _pip(python, "install", *c.seeds, "-e", f".[{c.extras}]")
        frozen = subprocess.run(
            [str(python), "-m", "pip", "freeze", "--exclude-editable", "--disable-pip-version-check"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    LOCKS.mkdir(exist_ok=True)
    header = (
        f"# The {c.name} cell of the version matrix (Python {c.python}), resolved by\n"
        f"# `python -m scripts.matrix lock {c.name}` from: {' '.join(c.seeds)} + .[{c.extras}]\n"
    )
    c.lock.write_text(header + "".join(sorted(frozen.splitlines(keepends=True), key=str.lower)))
    print(f"matrix: wrote {c.lock.relative_to(ROOT)}")


def junit_report(cell: str) -> Path:
    """The JUnit XML report a cell's run writes, from which ``make test``'s summary reads its
    failed test ids (``scripts/run_tests.py``)."""
    return ROOT / ".cache" / "test-logs" / f"matrix-{cell}.xml"


def run(c: Cell, pytest_args: list[str]) -> int:
    """The compatibility subset in ``c``'s venv; prints what the cell is and how long its venv's
    set-up (pip, on a fresh machine) and its tests took."""
    began = time.monotonic()
    python = venv(c) / "bin" / "python"
    print(f"== matrix cell {c.name}: venv ready in {time.monotonic() - began:.0f} s", flush=True)
    versions = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, pyspark, pyarrow, pandas, numpy; "
            "print(f'Python {sys.version.split()[0]}, pyspark {pyspark.__version__}, pyarrow "
            "{pyarrow.__version__}, pandas {pandas.__version__}, numpy {numpy.__version__}')",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"== matrix cell {c.name}: {versions}", flush=True)
    env = {**os.environ, "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    started = time.monotonic()
    report = ["--junitxml", str(junit_report(c.name)), "-o", "junit_family=xunit1"]
    args = pytest_args or ["-q", "-m", "compat", *report, *COMPAT_TESTS]
    done = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env)
    print(
        f"== matrix cell {c.name}: exit {done.returncode} in {time.monotonic() - started:.0f} s", flush=True
    )
    return done.returncode


def run_all(cells: list[Cell], jobs: int) -> int:
    """The compatibility subset of ``cells``, ``jobs`` cells at a time (each a Spark application
    that mostly waits: on two cores three at once take little longer than one). Each cell's output
    goes to ``.cache/matrix-logs/<cell>.log`` and is printed whole, in order, once all have run."""
    for c in cells:
        venv(c)  # pip, one at a time
    logs = ROOT / ".cache" / "matrix-logs"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pending = list(cells)
    running: list[tuple[Cell, IO[str], subprocess.Popen[bytes]]] = []
    codes: dict[str, int] = {}
    while pending or running:
        while pending and len(running) < jobs:
            c = pending.pop(0)
            out = (logs / f"{c.name}.log").open("w")
            command = [sys.executable, "-m", "scripts.matrix", "run", c.name]
            running.append(
                (c, out, subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
            )
        for item in list(running):
            if item[2].poll() is not None:
                item[1].close()
                codes[item[0].name] = item[2].returncode
                running.remove(item)
        time.sleep(0.5)
    for c in cells:
        print((logs / f"{c.name}.log").read_text(errors="replace"), end="", flush=True)
    failed = sorted(name for name, code in codes.items() if code != 0)
    print(
        f"== matrix: {len(cells)} cells in {time.monotonic() - started:.0f} s, "
        + (f"failed: {', '.join(failed)}" if failed else "all passed"),
        flush=True,
    )
    return 1 if failed else 0


def locked(c: Cell, package: str) -> str:
    """The version ``c``'s lock pins ``package`` at."""
    for line in c.lock.read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package:
            return version.strip()
    raise SystemExit(f"matrix: {c.lock} pins no {package}")


def table() -> str:
    """The README's table of the cells (between ``<!-- matrix-table -->`` markers; a test keeps it)."""
    lines = [
        "| cell | Python | pyspark | pyarrow | pandas | what runs |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for c in CELLS:
        what = "the whole suite, in `.venv`" if c.primary else "the compatibility subset (`-m compat`)"
        pins = " | ".join(locked(c, p) for p in ("pyspark", "pyarrow", "pandas"))
        lines.append(f"| `{c.name}`{' (primary)' if c.primary else ''} | {c.python} | {pins} | {what} |")
    return "\n".join(lines)


def delta_jars() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from spark_plugin.compat.versions import DELTA_ARTIFACTS, delta_jars

    coordinates: list[str] = []
    for major, minor in DELTA_ARTIFACTS:
        coordinates += [c for c in delta_jars(f"{major}.{minor}.0").coordinates if c not in coordinates]
    return coordinates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.matrix")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    sub.add_parser("table")
    sub.add_parser("delta-jars")
    for name in ("venv", "lock"):
        sub.add_parser(name).add_argument("cell")
    sub.add_parser("wheelhouse")
    every = sub.add_parser("run-all")
    every.add_argument("--jobs", type=int, default=3, help="cells at a time")
    runner = sub.add_parser("run")
    runner.add_argument("cell")
    runner.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "list":
        print(" ".join(c.name for c in CELLS if not c.primary))
    elif args.command == "run-all":
        return run_all([c for c in CELLS if not c.primary], max(1, args.jobs))
    elif args.command == "table":
        print(table())
    elif args.command == "delta-jars":
        print(" ".join(delta_jars()))
    elif args.command == "venv":
        print(venv(cell(args.cell)))
    elif args.command == "wheelhouse":
        for c in CELLS:
            pyspark_wheel(c)
    elif args.command == "lock":
        lock(cell(args.cell))
    else:
        return run(cell(args.cell), args.pytest_args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
