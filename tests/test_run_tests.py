"""``make test`` ends by naming every failed test of every run (``scripts/run_tests.py``): the ids
come from each run's JUnit XML report. Checked on a real pytest run of a small suite that fails in
every way a run can (a plain test, a parametrized one in a class, a fixture's teardown; a module
that does not import, in a run of its own since pytest then runs nothing), with the exact command
line ``run_tests`` gives its runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    codes = {"tests without a JVM": 1, "Spark shard 1/2": 0, "Spark shard 2/2": 5, "chaos soak": 1}
    reports = {"tests without a JVM": report, "chaos soak": tmp_path / "missing.xml"}
    reports |= {name: tmp_path / "unused.xml" for name in ("Spark shard 1/2", "Spark shard 2/2")}
    text = run_tests.summary(codes, reports)
    assert "tests without a JVM: exit 1\n  " in text
    assert "  FAILED tests/test_plain.py::test_bad\n" in text
    assert "  FAILED tests/sub/test_nested.py::TestGroup::test_param[2]\n" in text
    assert "Spark shard 1/2: exit 0\nSpark shard 2/2: exit 5\nchaos soak: exit 1\n" in text
    assert "(no report missing.xml: FileNotFoundError; see the run's output)" in text
