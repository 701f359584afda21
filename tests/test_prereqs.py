"""``scripts/check_prereqs.sh`` (run by ``make setup``): one line naming what is missing, exit 1.

Each case runs the script with a ``PATH`` of a scratch folder holding exactly the tools that case
keeps, so the missing one is really missing. The JDK and Maven are stand-ins (a ``java`` that
reports a version, a ``javac`` and an ``mvn`` that do nothing): the script only looks for them,
and this test must run where only Python is installed (``make unit``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "check_prereqs.sh"
JDK_AND_MAVEN = ("java", "javac", "mvn")
TOOLS = (*JDK_AND_MAVEN, "sed", "head")


def fake_tool(path: Path, name: str, java_version: str) -> None:
    body = f"echo 'openjdk version \"{java_version}\" 2024-01-16' >&2" if name == "java" else "exit 0"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_with(
    tmp_path: Path,
    keep: tuple[str, ...],
    python: str = sys.executable,
    part: str | None = None,
    java_version: str = "17.0.10",
) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in keep:
        if tool in JDK_AND_MAVEN:
            fake_tool(bin_dir / tool, tool, java_version)
            continue
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run this test"
        os.symlink(found, bin_dir / tool)
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), *([part] if part else [])],
        env={"PATH": str(bin_dir), "PYTHON": python},
        capture_output=True,
        text=True,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


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
    one_line(run_with(tmp_path, tuple(t for t in TOOLS if t != missing)), says)


def test_a_java_that_does_not_fit_is_named(tmp_path: Path) -> None:
    one_line(run_with(tmp_path, TOOLS, java_version="11.0.22"), "Java 11 does not fit")


def test_a_python_that_does_not_fit_is_named(tmp_path: Path) -> None:
    old = tmp_path / "python2.7"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && { echo 'Python 2.7.18'; exit 0; }\nexit 1\n")
    old.chmod(0o755)
    one_line(run_with(tmp_path, TOOLS, python=str(old)), "Python 2.7.18 does not fit")


def test_the_python_part_needs_no_jdk_and_no_maven(tmp_path: Path) -> None:
    """``make unit`` and ``make lint`` check only this part."""
    done = run_with(tmp_path, ("sed", "head"), part="python")
    assert (done.returncode, done.stderr) == (0, "")


def test_the_jvm_part_does_not_look_at_python(tmp_path: Path) -> None:
    done = run_with(tmp_path, TOOLS, python="/nonexistent/python3", part="jvm")
    assert (done.returncode, done.stderr) == (0, "")
    one_line(run_with(tmp_path / "again", ("sed", "head"), part="jvm"), "no 'java' on PATH")


def test_an_unknown_part_is_refused(tmp_path: Path) -> None:
    one_line(run_with(tmp_path, TOOLS, part="rust"), "unknown part 'rust'")
