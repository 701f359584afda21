"""``make test`` ends by naming every failed test of every run (``scripts/run_tests.py``): the ids
come from each run's JUnit XML report. Checked on a real pytest run of a small suite that fails in
every way a run can (a plain test, a parametrized one in a class, a fixture's teardown; a module
that does not import, in a run of its own since pytest then runs nothing), with the exact command
line ``run_tests`` gives its runs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts import run_tests

SUITE = {
    "test_plain.py": "def test_ok():\n    pass\n\ndef test_bad():\n    assert 1 == 2\n",
    "sub/test_nested.py": (
        "import pytest\n\n"
        "class TestGroup:\n"
        "    @pytest.mark.parametrize('n', [1, 2])\n"
        "    def test_param(self, n):\n"
        "        assert n == 1\n\n"
        "@pytest.fixture\n"
        "def broken_teardown():\n"
        "    yield\n"
        "    raise RuntimeError('teardown')\n\n"
        "def test_teardown(broken_teardown):\n"
        "    pass\n"
    ),
}
BROKEN = {"test_broken_import.py": "import no_such_module_anywhere\n"}
"""A module that does not import: pytest runs nothing else in that session."""


def run_suite(root: Path, suite: dict[str, str] = SUITE) -> tuple[int, Path]:
    for name, text in suite.items():
        path = root / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    report = root / "report.xml"
    command = run_tests._pytest(sys.executable, "not spark", report, ["-p", "no:randomly"])
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120)
    return done.returncode, report


def test_every_failed_test_of_a_run_is_named_by_its_pytest_id(tmp_path: Path) -> None:
    code, report = run_suite(tmp_path)
    assert code == 1
    assert sorted(run_tests.failed_ids(report)) == [
        "ERROR tests/sub/test_nested.py::test_teardown",
        "FAILED tests/sub/test_nested.py::TestGroup::test_param[2]",
        "FAILED tests/test_plain.py::test_bad",
    ]


def test_a_module_that_does_not_import_is_named_by_its_file(tmp_path: Path) -> None:
    code, report = run_suite(tmp_path, BROKEN)
    assert code == 2  # interrupted by the collection error
    assert run_tests.failed_ids(report) == ["ERROR tests/test_broken_import.py"]


def test_the_summary_gives_each_runs_exit_status_and_its_failed_ids(tmp_path: Path) -> None:
    _, report = run_suite(tmp_path)
    codes = {"tests without a JVM": 1, "Spark shard 1/3": 0, "Spark shard 2/3": 5, "chaos soak": 1}
    reports: dict[str, Path] = {
        "tests without a JVM": report,
        "chaos soak": tmp_path / "missing.xml",
    }
    reports |= {name: tmp_path / "unused.xml" for name in ("Spark shard 1/3", "Spark shard 2/3")}
    text = run_tests.summary(codes, reports)
    assert "tests without a JVM: exit 1\n  " in text
    assert "  FAILED tests/test_plain.py::test_bad\n" in text
    assert "  FAILED tests/sub/test_nested.py::TestGroup::test_param[2]\n" in text
    assert "Spark shard 1/3: exit 0\nSpark shard 2/3: exit 5\nchaos soak: exit 1\n" in text
    assert "(no report missing.xml: FileNotFoundError; see the run's output)" in text


def test_a_matrix_cell_without_its_report_is_named_beside_the_others_failures(tmp_path: Path) -> None:
    """A matrix cell that ended before pytest wrote its report is named as having none, not left out."""
    _, report = run_suite(tmp_path)
    codes = {"tests without a JVM": 1, "matrix cell x": 1}
    reports = {"tests without a JVM": report, "matrix cell x": tmp_path / "matrix-x.xml"}
    text = run_tests.summary(codes, reports)
    assert "  FAILED tests/test_plain.py::test_bad\n" in text
    assert "(no report matrix-x.xml: FileNotFoundError" in text


def test_a_lane_step_that_cannot_start_fails_and_the_lane_goes_on(tmp_path: Path) -> None:
    """A command that cannot be started (here: no such program) is a failed run, never a
    silently missing one, and the runs after it in its lane still run."""
    steps = [
        ("missing", tmp_path / "missing.log", [str(tmp_path / "no-such-program")]),
        ("after", tmp_path / "after.log", [sys.executable, "-c", "print('ran')"]),
    ]
    lane = run_tests.Lane(steps, {})
    lane.start()
    lane.join(60)
    assert lane.codes == {"missing": run_tests.START_FAILED, "after": 0}
    assert (tmp_path / "after.log").read_text().strip() == "ran"


def overstaying_run(started: Path) -> list[str]:
    """A run that outlasts any test here (two minutes) unless a lane stops it, and touches
    ``started`` once it runs. Python keeps SIGINT ignored when it starts ignored (a make run in the
    background), and the lane's SIGINT then waits out its 60 s grace: the child takes the interrupt
    as a shell's would."""
    code = (
        "import pathlib, signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        f"pathlib.Path({str(started)!r}).touch(); time.sleep(120)"
    )
    return [sys.executable, "-c", code]


def test_a_stopped_lane_ends_its_run_and_starts_no_other(tmp_path: Path) -> None:
    """An interrupted ``make test``: the lane's running command (and its process group) ends, and
    the steps after it never start (the summary counts them ``NOT_RUN``)."""
    started = tmp_path / "started"
    steps = [
        ("long", tmp_path / "long.log", overstaying_run(started)),
        ("next", tmp_path / "next.log", [sys.executable, "-c", "pass"]),
    ]
    lane = run_tests.Lane(steps, {})
    lane.start()
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists()
    lane.stop()
    assert not lane.is_alive()
    assert lane.codes.get("long", 0) != 0 and "next" not in lane.codes


def test_options() -> None:
    assert run_tests._options(["-k", "x"]) == (False, run_tests.BUDGET_S, ["-k", "x"])
    assert run_tests._options(["--matrix", "-x"]) == (True, run_tests.BUDGET_S, ["-x"])
    assert run_tests._options(["--budget", "90", "--matrix", "-x"]) == (True, 90.0, ["-x"])
    for bad in (["--budget"], ["--budget", "soon"], ["--budget", "0"]):
        with pytest.raises(SystemExit, match="--budget"):
            run_tests._options(bad)


def test_at_the_budget_the_runs_still_going_are_stopped_and_named(tmp_path: Path) -> None:
    """A run that overstays the budget is stopped (its process gone, the next step never started)
    and named; a lane that ended in time is not; the summary says which runs the budget stopped."""
    slow = run_tests.Lane(
        [
            ("slow", tmp_path / "slow.log", overstaying_run(tmp_path / "started")),
            ("after slow", tmp_path / "after.log", [sys.executable, "-c", "pass"]),
        ],
        {},
    )
    quick = run_tests.Lane([("quick", tmp_path / "quick.log", [sys.executable, "-c", "pass"])], {})
    began = time.monotonic()
    stopped = run_tests._run_until((slow, quick), time.monotonic() + 3.0)
    assert stopped == {"slow", "after slow"}
    assert not slow.is_alive() and time.monotonic() - began < 60
    assert quick.codes == {"quick": 0} and slow.codes["slow"] != 0 and "after slow" not in slow.codes
    codes = {"slow": slow.codes["slow"], "after slow": run_tests.NOT_RUN, "quick": 0}
    text = run_tests.summary(codes, {n: tmp_path / "none.xml" for n in codes}, quick.seconds, stopped)
    assert f"slow: exit {slow.codes['slow']} (stopped: the budget was spent)" in text
    assert "quick: exit 0 in " in text and "quick: exit 0 in 0s (stopped" not in text
    assert "after slow: exit -1 (stopped: the budget was spent)\n  (not started)" in text


def test_the_matrix_cells_are_dealt_out_over_the_lanes() -> None:
    """Each lane ends with its share: three cells, one per lane; more wrap round; none, none."""
    assert run_tests._dealt(["a", "b", "c"], 3) == [["a"], ["b"], ["c"]]
    assert run_tests._dealt(["a", "b", "c", "d"], 3) == [["a", "d"], ["b"], ["c"]]
    assert run_tests._dealt([], 3) == [[], [], []]
    dealt = [cell for lane in run_tests._dealt(run_tests.matrix_cells(), 3) for cell in lane]
    assert sorted(dealt) == sorted(run_tests.matrix_cells())
