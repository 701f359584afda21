"""``scripts/check_prereqs.sh`` (run by ``make setup``): one line naming what is missing, exit 1.

Each case runs the script with a ``PATH`` of a scratch folder holding links to exactly the tools
that case keeps, so the missing one is really missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "check_prereqs.sh"
TOOLS = ("java", "javac", "mvn", "sed", "head")


def run_with(
    tmp_path: Path, keep: tuple[str, ...], python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in keep:
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run this test"
        os.symlink(found, bin_dir / tool)
    return subprocess.run(
        ["/bin/bash", str(SCRIPT)],
        env={"PATH": str(bin_dir), "PYTHON": python},
        capture_output=True,
        text=True,
        check=False,
    )


def test_everything_present_passes(tmp_path: Path) -> None:
    done = run_with(tmp_path, TOOLS)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(
    ("missing", "says"),
    [
        ("javac", "no 'javac' on PATH (a JRE is not enough)"),
        ("mvn", "no 'mvn' on PATH"),
        ("java", "no 'java' on PATH"),
    ],
)
def test_a_missing_tool_is_named_in_one_line(tmp_path: Path, missing: str, says: str) -> None:
    done = run_with(tmp_path, tuple(t for t in TOOLS if t != missing))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_a_python_that_does_not_fit_is_named(tmp_path: Path) -> None:
    old = tmp_path / "python2.7"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && { echo 'Python 2.7.18'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    done = run_with(tmp_path, TOOLS, python=str(old))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "Python 2.7.18 does not fit" in done.stderr, done.stderr
