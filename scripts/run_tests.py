"""``make test``'s primary cell: the tests that start no JVM and the two Spark shards side by side,
then the chaos soak alone.

The three wait on different things: the JVM-less tests on sockets, deadlines and child processes
of their own (about a minute of CPU in three and a half minutes), the Spark tests on executors,
heartbeat timeouts, flush intervals and Spark's scheduler. Run one after the other, the machine
idles through much of each; side by side, they fill each other's waits. The Spark tests are split
by module into two shards (``tests/harness/shards.py``). The chaos soak's short form (tests marked
``chaos``) runs last and alone: it asserts that no executor is ever falsely timed out while faults
are injected, which it should prove on a machine busy with nothing else.

Each run is its own pytest session, with its own run marker (``harness.procs.MARKER``),
leftover-process check and scratch folder, which holds its ``local-cluster`` work dirs too
(``harness.env``: its own ``SPARK_HOME``). The first shard and the chaos
soak print as they go; the other runs' output is kept in ``.cache/test-logs/`` and printed when
they have finished. The exit status is non-zero when any run fails.

The output ends with every run's exit status and the ids of its failed and erroring tests
(``FAILED``/``ERROR`` lines, collection and teardown errors included), read from the JUnit XML
report each run writes beside its log (``.cache/test-logs/<run>.xml``): a failure in a run whose
output scrolled by long before is named at the end, not only counted.

    python -m scripts.run_tests [PYTEST ARGS]     extra arguments go to every run

Only the standard library is imported here: the venv's pytest is run as a child.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "test-logs"
MARKER = "ARROWBEAT_TEST_RUN"  # harness.procs.MARKER: each run draws its own
NOTHING_SELECTED = 5
"""pytest's exit status when arguments (``-k``, a path) leave a run no test: not a failure,
unless it is every run's."""


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


def summary(codes: dict[str, int], reports: dict[str, Path]) -> str:
    """The end of ``make test``'s output: each run's exit status, then its failed test ids."""
    lines = ["", "---- every run's exit status and failed tests ----"]
    for name, code in codes.items():
        lines.append(f"{name}: exit {code}")
        if code in (0, NOTHING_SELECTED):
            continue
        failed = failed_ids(reports[name]) or ["(its report names no failed test: see its output above)"]
        lines += [f"  {line}" for line in failed]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    spark = "spark and not chaos"
    reports = {
        "tests without a JVM": LOGS / "no-jvm.xml",
        "Spark shard 2/2": LOGS / "spark-2.xml",
        "Spark shard 1/2": LOGS / "spark-1.xml",
        "chaos soak": LOGS / "chaos.xml",
    }
    for report in reports.values():
        report.unlink(missing_ok=True)  # a report left by an earlier run must not stand for this one
    no_jvm = _pytest(python, "not spark", reports["tests without a JVM"], argv)
    logged = {
        "tests without a JVM": (LOGS / "no-jvm.log", no_jvm),
        "Spark shard 2/2": (
            LOGS / "spark-2.log",
            _pytest(python, spark, reports["Spark shard 2/2"], argv, "--spark-shard", "2/2"),
        ),
    }
    codes: dict[str, int] = {}
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, (log_path, command) in logged.items():
            with log_path.open("wb") as log:
                children[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        shard_one = _pytest(python, spark, reports["Spark shard 1/2"], argv, "--spark-shard", "1/2")
        codes["Spark shard 1/2"] = subprocess.call(shard_one, cwd=ROOT, env=env)
        for name, child in children.items():
            codes[name] = child.wait()
    finally:
        for child in children.values():
            if child.poll() is None:  # interrupted: end the runs we started
                child.terminate()
                child.wait(30)
    for name, (log_path, _) in logged.items():
        print(f"\n---- {name} ({log_path.relative_to(ROOT)}) ----", flush=True)
        sys.stdout.write(log_path.read_text(errors="replace"))
    print(f"\n---- the chaos soak, alone (after {time.monotonic() - started:.0f}s) ----", flush=True)
    chaos = subprocess.call(_pytest(python, "chaos", reports["chaos soak"], argv), cwd=ROOT, env=env)
    codes["chaos soak"] = chaos
    took = time.monotonic() - started
    print(summary(codes, reports), flush=True)
    outcome = ", ".join(f"{name} exit {code}" for name, code in codes.items())
    print(f"\nprimary cell: {outcome}, {took:.0f}s", flush=True)
    if all(code == NOTHING_SELECTED for code in codes.values()):
        print("no test selected by these arguments", flush=True)
        return 1
    return 0 if all(code in (0, NOTHING_SELECTED) for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
