"""``make test``'s primary cell: the tests that start no JVM and three Spark shards side by side,
then the chaos soak alone; with ``--matrix``, the version matrix's other cells too.

The runs wait on different things: the JVM-less tests on sockets, deadlines and child processes
of their own (about a minute of CPU in three and a half minutes), the Spark tests on executors,
heartbeat timeouts, flush intervals and Spark's scheduler. Run one after the other, the machine
idles through much of each; side by side, they fill each other's waits. Three lanes run at once:

- the first Spark shard, printing as it goes;
- the second Spark shard;
- the JVM-less tests, then the third Spark shard (the installed wheel's modules, which assert no
  timing).

With ``--matrix`` each lane then runs its share of the matrix's other cells, one at a time
(``scripts.matrix run CELL``: the cell's venv, built first if missing, runs the compatibility
subset; about 40 s each): the lanes end within a minute of each other, and no cell runs beside
more than two other sessions.

The shards are split by module (``tests/harness/shards.py``). The chaos soak's short form (tests
marked ``chaos``) runs last and alone: it asserts that no executor is ever falsely timed out while
faults are injected, which it should prove on a machine busy with nothing else.

Each run is its own pytest session, with its own run marker (``harness.procs.MARKER``),
leftover-process check and scratch folder, which holds its ``local-cluster`` work dirs too
(``harness.env``: its own ``SPARK_HOME``). The first shard and the chaos soak print as they go; the
other runs' output is kept in ``.cache/test-logs/`` and printed when they have finished. The exit
status is non-zero when any run fails.

The whole run has a budget (``--budget SECONDS``, default ``BUDGET_S``): CI ends a run that
overstays its own limit with nothing said about the runs still going, so at the budget every
run still going is stopped as an interrupted ``make test`` stops it (pytest then prints where it
was), the chaos soak does not start, and the summary names what was stopped.

The output ends with every run's exit status and the ids of its failed and erroring tests
(``FAILED``/``ERROR`` lines, collection and teardown errors included), read from the JUnit XML
report each run writes beside its log (``.cache/test-logs/<run>.xml``; a matrix cell's is
``matrix-<cell>.xml``): a failure in a run whose output scrolled by long before is named at the
end, not only counted.

    python -m scripts.run_tests [--matrix] [--budget SECONDS] [PYTEST ARGS]
                                                   extra arguments go to every primary-cell run

Only the standard library is imported here: the venv's pytest is run as a child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts import matrix

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "test-logs"
MARKER = "ARROWBEAT_TEST_RUN"  # harness.procs.MARKER: each run draws its own
NOTHING_SELECTED = 5
"""pytest's exit status when arguments (``-k``, a path) leave a run no test: not a failure,
unless it is every run's."""
START_FAILED = 127
"""The exit status given to a run whose command could not be started (as a shell gives it)."""
NOT_RUN = -1
"""The status of a run that never started: its lane was interrupted before it."""
BUDGET_S = 4000.0
"""Seconds for the whole of ``make test``: the slowest clean runs here took about 2,600 s, and CI
allows 5,400 s for a fresh machine's set-up (about 10 minutes), this and the demo (about 8)."""


def _pytest(python: str, marks: str, report: Path, extra: list[str], *options: str) -> list[str]:
    # No cache plugin: three sessions at once would overwrite each other's ``lastfailed``.
    pytest = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--durations=15"]
    # xunit1: each test case names its file, from which its pytest id is rebuilt (``failed_ids``).
    junit = [f"--junitxml={report}", "-o", "junit_family=xunit1"]
    return [*pytest, *junit, "-m", marks, *options, *extra, "tests"]


def failed_ids(report: Path) -> list[str]:
    """``FAILED <test id>`` or ``ERROR <test id>`` for every test case of a run's JUnit XML report
    that failed or errored (a fixture's set-up or teardown, a module that did not collect); empty
    when the report has none, or a line saying the report is missing or unreadable (a run that
    crashed or was killed before pytest wrote it)."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError) as exc:
        return [f"(no report {report.name}: {type(exc).__name__}; see the run's output)"]
    found: list[str] = []
    for case in root.iter("testcase"):
        for outcome, tag in (("FAILED", "failure"), ("ERROR", "error")):
            if case.find(tag) is not None:
                line = f"{outcome} {_test_id(case)}"
                if line not in found:
                    found.append(line)
    return found


def _test_id(case: ET.Element) -> str:
    """pytest's id (``tests/x/test_y.py::Class::test[param]``) from an xunit1 test case: its
    ``file``, the classes after the module in its dotted ``classname``, and its ``name``."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file")
    if not file:
        return ".".join(p for p in (classname, name) if p)
    module = file.removesuffix(".py").replace("/", ".")
    if not classname and name == module:  # the module did not collect: the case is the file
        return file
    classes = classname[len(module) + 1 :].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *filter(None, classes), name])


def summary(
    codes: dict[str, int],
    reports: Mapping[str, Path],
    seconds: Mapping[str, float] | None = None,
    stopped: frozenset[str] = frozenset(),
) -> str:
    """The end of ``make test``'s output: each run's exit status and seconds (and whether the
    budget stopped it), then its failed test ids."""
    lines = ["", "---- every run's exit status and failed tests ----"]
    for name, code in codes.items():
        took = f" in {seconds[name]:.0f}s" if seconds and name in seconds else ""
        lines.append(
            f"{name}: exit {code}{took}" + (" (stopped: the budget was spent)" if name in stopped else "")
        )
        if code in (0, NOTHING_SELECTED):
            continue
        if code == NOT_RUN:
            lines.append("  (not started)")
            continue
        failed = failed_ids(reports[name]) or ["(its report names no failed test: see its output above)"]
        lines += [f"  {line}" for line in failed]
    return "\n".join(lines)


def _options(argv: list[str]) -> tuple[bool, float, list[str]]:
    """``--matrix``, ``--budget SECONDS``, and the arguments left for pytest."""
    rest, budget = list(argv), BUDGET_S
    if "--budget" in rest:
        at = rest.index("--budget")
        try:
            budget = float(rest[at + 1])
        except (IndexError, ValueError):
            raise SystemExit("--budget: expected a number of seconds, e.g. --budget 3600") from None
        if not budget > 0:
            raise SystemExit(f"--budget {rest[at + 1]}: expected a positive number of seconds")
        del rest[at : at + 2]
    return "--matrix" in rest, budget, [word for word in rest if word != "--matrix"]


def matrix_cells() -> list[str]:
    """The matrix's other cells (``scripts.matrix``), in order."""
    return [cell.name for cell in matrix.CELLS if not cell.primary]


def _dealt(cells: list[str], lanes: int) -> list[list[str]]:
    """The cells dealt out over the lanes, one each in turn, the first to the first lane."""
    return [cells[k::lanes] for k in range(lanes)]


Step = tuple[str, Path | None, list[str]]
"""A run: its name, the file its output goes to (``None``: this process's own output, printed as
it goes) and its command."""


class Lane(threading.Thread):
    """Commands run one after the other, each logged to its own file (or printed as it goes) and
    its exit status and seconds kept in ``codes`` and ``seconds``. A command that cannot start
    gets ``START_FAILED`` and the lane goes on. Each runs in a process group of its own, so
    ``stop`` (an interrupted ``make test``, or the budget spent) ends it and whatever it started
    (its Spark JVMs): first as Ctrl-C would, so pytest tears its fixtures down."""

    def __init__(self, steps: Sequence[Step], env: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.steps, self.env = steps, env
        self.codes: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._current: subprocess.Popen[bytes] | None = None
        self._stopped = False
        self._lock = threading.Lock()  # a step starts, or the lane stops: never both at once

    def run(self) -> None:
        for name, log_path, command in self.steps:
            with self._lock:
                if self._stopped:
                    return
                began = time.monotonic()
                try:
                    with open(log_path, "wb") if log_path else contextlib.nullcontext() as log:
                        child = subprocess.Popen(
                            command, cwd=ROOT, env=self.env, stdout=log, stderr=log, start_new_session=True
                        )
                except OSError as exc:
                    self.codes[name] = START_FAILED
                    print(f"{name}: could not start {command[0]}: {exc}", file=sys.stderr, flush=True)
                    continue
                self._current = child
            self.codes[name] = child.wait()
            self.seconds[name] = time.monotonic() - began

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            child = self._current
        if child is not None and child.poll() is None:
            for sig, grace_s in ((signal.SIGINT, 60.0), (signal.SIGTERM, 20.0), (signal.SIGKILL, 20.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(grace_s)
                    break
        self.join(30)


def main(argv: list[str]) -> int:
    with_matrix, budget_s, argv = _options(argv)
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + budget_s
    spark = "spark and not chaos"
    reports: dict[str, Path] = {
        "tests without a JVM": LOGS / "no-jvm.xml",
        "Spark shard 1/3": LOGS / "spark-1.xml",
        "Spark shard 2/3": LOGS / "spark-2.xml",
        "Spark shard 3/3": LOGS / "spark-3.xml",
        "chaos soak": LOGS / "chaos.xml",
        # A cell that ends before pytest writes its report is named in the summary as having none.
        **{f"matrix cell {name}": matrix.junit_report(name) for name in matrix_cells()},
    }
    for report in reports.values():
        report.unlink(missing_ok=True)  # a report left by an earlier run must not stand for this one

    def shard(k: int) -> list[str]:
        return _pytest(python, spark, LOGS / f"spark-{k}.xml", argv, "--spark-shard", f"{k}/3")

    # Each lane ends with its share of the matrix's cells (each builds its venv first, if missing).
    tails = _dealt(matrix_cells() if with_matrix else [], 3)

    def cells(names: list[str], printed: bool = False) -> list[Step]:
        return [
            (
                f"matrix cell {name}",
                None if printed else LOGS / f"matrix-{name}.log",
                [python, "-m", "scripts.matrix", "run", name],
            )
            for name in names
        ]

    # The first lane prints as it goes; the others' output is printed when they have ended.
    first = Lane([("Spark shard 1/3", None, shard(1)), *cells(tails[0], printed=True)], env)
    second = Lane([("Spark shard 2/3", LOGS / "spark-2.log", shard(2)), *cells(tails[1])], env)
    third_steps: list[Step] = [
        ("tests without a JVM", LOGS / "no-jvm.log", _pytest(python, "not spark", LOGS / "no-jvm.xml", argv)),
        ("Spark shard 3/3", LOGS / "spark-3.log", shard(3)),
        *cells(tails[2]),
    ]
    third = Lane(third_steps, env)
    chaos = Lane([("chaos soak", None, _pytest(python, "chaos", LOGS / "chaos.xml", argv))], env)
    lanes = (first, second, third)
    stopped = _run_until(lanes, deadline)
    for lane in lanes[1:]:
        for name, log_path, _ in lane.steps:
            if log_path is not None and log_path.exists() and name in lane.codes:
                print(f"\n---- {name} ({log_path.relative_to(ROOT)}) ----", flush=True)
                sys.stdout.write(log_path.read_text(errors="replace"))
    if not stopped:
        print(f"\n---- the chaos soak, alone (after {time.monotonic() - started:.0f}s) ----", flush=True)
        stopped = _run_until((chaos,), deadline)
    else:
        print(
            f"\n---- the budget of {budget_s:.0f}s was spent: the chaos soak does not start ----", flush=True
        )
    codes = {name: lane.codes.get(name, NOT_RUN) for lane in (*lanes, chaos) for name, _, _ in lane.steps}
    seconds = {name: s for lane in (*lanes, chaos) for name, s in lane.seconds.items()}
    took = time.monotonic() - started
    print(summary(codes, reports, seconds, stopped), flush=True)
    outcome = ", ".join(f"{name} exit {code}" for name, code in codes.items())
    print(f"\nprimary cell{' and matrix' if with_matrix else ''}: {outcome}, {took:.0f}s", flush=True)
    if all(code == NOTHING_SELECTED for code in codes.values()):
        print("no test selected by these arguments", flush=True)
        return 1
    return 0 if all(code in (0, NOTHING_SELECTED) for code in codes.values()) else 1


def _run_until(lanes: tuple[Lane, ...], deadline: float) -> frozenset[str]:
    """Starts the lanes and waits for them until ``deadline`` (``time.monotonic``); then, or when
    interrupted, stops those still going. The names of the runs the deadline stopped."""
    stopped: set[str] = set()
    try:
        for lane in lanes:
            lane.start()
        for lane in lanes:
            lane.join(max(0.0, deadline - time.monotonic()))
        for lane in lanes:
            if lane.is_alive():
                stopped.update(name for name, _, _ in lane.steps if name not in lane.codes)
        if stopped:
            print(f"\n---- the budget is spent: stopping {', '.join(sorted(stopped))} ----", flush=True)
    finally:
        for lane in lanes:
            if lane.is_alive():  # the budget spent, or interrupted: end the runs we started
                lane.stop()
    return frozenset(stopped)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
