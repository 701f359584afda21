"""The support matrix as arrowbeat reads it (``spark_plugin.compat.versions``), what ``python -m
spark_plugin conf`` tells a user of an unsupported Spark, too old libraries, and the extras that
optional features name when their library is missing. No JVM."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from spark_plugin.compat import versions
from spark_plugin.settings import extras

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["4.0.5", "4.1.4", "4.2.1", "4.3.0", "4.2.0.dev1"])
def test_every_supported_minor_is_supported(version: str) -> None:
    support = versions.spark_support(version)
    assert support.level == "supported" and support.runs and support.message is None


def test_an_older_spark_is_refused_naming_both_versions() -> None:
    support = versions.spark_support("3.5.9")
    assert not support.runs
    assert support.message is not None
    assert "3.5.9" in support.message and "4.0 to 4.3" in support.message


def test_a_newer_minor_runs_untested_with_a_warning() -> None:
    support = versions.spark_support("4.4.0")
    assert support.runs and support.level == "untested"
    assert support.message is not None and "4.4.0" in support.message and "4.0 to 4.3" in support.message
    assert not versions.spark_support("5.0.0").runs


def test_an_unreadable_version_is_refused() -> None:
    assert not versions.spark_support("banana").runs


def test_delta_is_chosen_per_minor_and_its_absence_is_explained() -> None:
    assert versions.delta_jars("4.0.5").coordinates == (
        f"io.delta:delta-spark_4.0_2.13:{versions.DELTA_RELEASE}",
        f"io.delta:delta-storage:{versions.DELTA_RELEASE}",
    )
    assert versions.delta_jars("4.2.1").file_names() == [
        f"delta-spark_4.2_2.13-{versions.DELTA_RELEASE}.jar",
        f"delta-storage-{versions.DELTA_RELEASE}.jar",
    ]
    none = versions.delta_jars("4.3.0")
    assert not none.available and none.reason is not None and "4.3.0" in none.reason


def test_a_too_old_pyarrow_is_named_with_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "10.0.1" if name == "pyarrow" else real(name))
    problems = versions.library_problems()
    assert problems == ["pyarrow 10.0.1 is older than arrowbeat supports (pyarrow>=16.0.0)"]


def test_the_installed_libraries_are_in_range() -> None:
    assert versions.library_problems() == []


def test_pyproject_floors_match_the_checks() -> None:
    """The declared ranges and the start-up checks name the same floors (declared once each)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"pyarrow>={'.'.join(map(str, versions.MINIMUM_PYARROW))}" in declared
    assert any(d.startswith(f"pandas>={'.'.join(map(str, versions.MINIMUM_PANDAS))}") for d in declared)
    assert not [d for d in declared if d.startswith("py4j")], declared  # pyspark's, never imported
    first, last = versions.SUPPORTED_SPARK_MINORS[0], versions.SUPPORTED_SPARK_MINORS[-1]
    assert f"pyspark>={first[0]}.{first[1]}.1,<{last[0]}.{last[1] + 1}" in declared


def test_no_runtime_dependency_is_pinned() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in declared if "==" in d], declared


def test_conf_refuses_an_unsupported_spark_with_one_clear_line(tmp_path: Path) -> None:
    """``SPARK_HOME`` names the Spark that spark-submit runs: a 3.5 there is named, nothing printed."""
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core_2.12-3.5.9.jar").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-m", "spark_plugin", "conf"],
        capture_output=True,
        text=True,
        env={"SPARK_HOME": str(tmp_path / "spark"), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "3.5.9" in done.stderr and "4.0 to 4.3" in done.stderr


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # find_spec raises: as if not installed
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "aiohttp" else real(name))
    problem = extras.missing("live")
    assert problem is not None and "pip install 'arrowbeat[live]'" in problem
    assert "spark.arrowbeat.ui.enabled=false" in problem
    with pytest.raises(extras.MissingExtraError, match=r"arrowbeat\[live\]"):
        extras.require("live")
    has_matplotlib = real("matplotlib") is not None
    assert (extras.missing("report") is None) == has_matplotlib


def test_every_extra_is_declared_in_pyproject() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, extra in extras.EXTRAS.items():
        assert name in declared, name
        package = {"delta": "delta-spark"}.get(extra.module, extra.module)
        assert any(d.startswith(package) for d in declared[name]), (name, declared[name])
