"""The wheel holds the product packages, all of them, and nothing else: pyproject.toml lists its
packages by hand (one of them, ``spark_plugin.jobs``, lives in ``jobs/``), so this keeps the list
complete as packages are added, and keeps ``tests``, ``benchmarks``, ``harness`` and ``scripts`` out. Where
``jar_paths`` finds the launcher (wheel, checkout, override), and what ``pack`` puts in an archive."""

from __future__ import annotations

import os
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from spark_plugin.compat import versions
from spark_plugin.errors import SetupError
from spark_plugin.jvm import launch
from spark_plugin.tools import pack

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("arrowbeat_base", "heartbeat", "arrow_shuffle", "spark_plugin")


def setuptools_table() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]  # type: ignore[no-any-return]


def packages_on_disk() -> set[str]:
    found = set()
    for top in PRODUCT:
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_product_package_is_in_the_wheel_and_nothing_else() -> None:
    table = setuptools_table()
    listed = set(table["packages"])  # type: ignore[call-overload]
    # Folders of data only (the live page's assets) are listed too, with package data of their own:
    # setuptools ignores a package's subfolder of data that is not.
    data_only = listed - packages_on_disk() - {"spark_plugin.jobs"}
    for name in data_only:
        folder = ROOT.joinpath(*name.split("."))
        assert folder.is_dir() and not list(folder.glob("*.py")), f"{name}: not a folder of data only"
        assert name in table["package-data"], f"{name}: no package data of its own"  # type: ignore[operator]
    assert data_only == {"spark_plugin.tools.web"}
    assert listed == packages_on_disk() | {"spark_plugin.jobs"} | data_only
    assert table["package-dir"] == {"spark_plugin.jobs": "jobs"}
    assert not {p for p in listed if p.split(".")[0] in ("tests", "benchmarks", "harness", "scripts", "jobs")}


def test_the_jobs_import_each_other_by_their_installed_name() -> None:
    """``spark-submit jobs/x.py`` runs a job as a script; what it imports of its siblings must be
    ``spark_plugin.jobs.*``, the name that exists both in the checkout's editable install and in
    an installed wheel (a top-level ``jobs`` exists in neither)."""
    offenders = [
        f"{path.name}: {line.strip()}"
        for path in sorted((ROOT / "jobs").glob("*.py"))
        for line in path.read_text().splitlines()
        if line.strip().startswith(("from jobs", "import jobs"))
    ]
    assert not offenders, offenders


def test_the_wheel_carries_the_launcher_jar_as_package_data() -> None:
    """The build hook (``build_backend/``) compiles it into ``spark_plugin/jars``, where
    ``jar_paths`` looks first; ``tests/test_wheel.py`` builds a real wheel."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "jars/*.jar" in tool["tool"]["setuptools"]["package-data"]["spark_plugin"]
    assert tool["tool"]["setuptools"]["cmdclass"] == {"build_py": "arrowbeat_build.BuildPyWithLauncher"}
    assert tool["build-system"]["backend-path"] == ["build_backend"]


@pytest.fixture
def no_jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``jar_paths`` with an empty package dir and an empty checkout cache."""
    package, cache = tmp_path / "package-jars", tmp_path / "cache"
    monkeypatch.setattr(launch, "PACKAGE_JARS", package)
    monkeypatch.setattr(launch, "_CACHE", cache)
    monkeypatch.delenv("ARROWBEAT_JARS", raising=False)
    return package, cache


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_a_missing_launcher_jar_names_where_it_was_looked_for(no_jars: tuple[Path, Path]) -> None:
    package, cache = no_jars
    with pytest.raises(SetupError) as caught:
        launch.jar_paths()
    assert str(package / "arrowbeat-launcher.jar") in str(caught.value)
    assert str(cache / "launcher" / "arrowbeat-launcher.jar") in str(caught.value)


@pytest.fixture
def spark_42(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "running_spark_version", lambda: "4.2.1")


def test_the_package_jar_comes_first_and_delta_is_fetched_by_spark_without_a_local_copy(
    no_jars: tuple[Path, Path], spark_42: None
) -> None:
    package, cache = no_jars
    touch(cache / "launcher" / "arrowbeat-launcher.jar")
    installed = touch(package / "arrowbeat-launcher.jar")
    assert launch.jar_paths() == [str(installed)]
    settings = dict(launch.spark_settings(python="/venv/bin/python"))
    assert settings["spark.jars.packages"] == f"io.delta:delta-spark_4.2_2.13:{versions.DELTA_RELEASE}"
    assert "spark.jars.packages" not in dict(launch.spark_settings(python="/venv/bin/python", delta=False))
    flags = launch.submit_flags(python="/venv/bin/python")
    assert flags[:2] == ["--jars", str(installed)]
    assert flags[flags.index("--packages") + 1] == f"io.delta:delta-spark_4.2_2.13:{versions.DELTA_RELEASE}"


def test_the_checkout_cache_with_delta_jars_needs_no_packages(
    no_jars: tuple[Path, Path], spark_42: None
) -> None:
    _, cache = no_jars
    jars = [
        touch(cache / "launcher" / "arrowbeat-launcher.jar"),
        touch(cache / "jars" / f"delta-spark_4.2_2.13-{versions.DELTA_RELEASE}.jar"),
        touch(cache / "jars" / f"delta-storage-{versions.DELTA_RELEASE}.jar"),
    ]
    touch(cache / "jars" / f"delta-spark_4.1_2.13-{versions.DELTA_RELEASE}.jar")  # another Spark's
    assert launch.jar_paths() == [str(j) for j in jars]
    assert "spark.jars.packages" not in dict(launch.spark_settings(python="/venv/bin/python"))


def test_each_spark_minor_gets_its_own_delta_artifact(no_jars: tuple[Path, Path]) -> None:
    touch(no_jars[1] / "launcher" / "arrowbeat-launcher.jar")
    for spark, artifact in (("4.0.5", "4.0"), ("4.1.4", "4.1"), ("4.2.1", "4.2")):
        jars = launch.jar_paths(spark)
        assert (
            launch.delta_package(jars, spark)
            == f"io.delta:delta-spark_{artifact}_2.13:{versions.DELTA_RELEASE}"
        )


def test_a_spark_without_a_delta_release_runs_without_delta_and_says_why(
    no_jars: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    touch(no_jars[1] / "launcher" / "arrowbeat-launcher.jar")
    monkeypatch.setattr(versions, "running_spark_version", lambda: "4.3.0")
    settings = dict(launch.spark_settings(python="/venv/bin/python"))
    assert "spark.jars.packages" not in settings and "spark.sql.extensions" not in settings
    assert settings["spark.plugins"] == launch.PLUGIN_CLASS  # monitoring and the tables stay on
    notice = " ".join(launch.notices())
    assert "no release for Spark 4.3.0" in notice and "delta-rs" in notice
    assert not [n for n in launch.notices(delta=False) if "Delta" in n]


def test_arrowbeat_jars_is_taken_as_given_and_checked(no_jars: tuple[Path, Path], monkeypatch) -> None:
    package, _ = no_jars
    monkeypatch.setenv("ARROWBEAT_JARS", f"{touch(package / 'a.jar')},{package / 'gone.jar'}")
    with pytest.raises(SetupError, match=r"gone\.jar"):
        launch.jar_paths()


def test_a_packed_environment_runs_on_executors_and_the_driver_keeps_its_python(
    no_jars: tuple[Path, Path], tmp_path: Path
) -> None:
    touch(no_jars[0] / "arrowbeat-launcher.jar")
    settings = dict(launch.spark_settings(python="/venv/bin/python", archive="env.tar.gz"))
    assert settings["spark.archives"] == f"{Path('env.tar.gz').absolute()}#env"
    assert settings["spark.pyspark.python"] == settings["spark.arrowbeat.python"] == "./env/bin/python"
    assert (
        settings["spark.pyspark.driver.python"]
        == settings["spark.arrowbeat.driver.python"]
        == "/venv/bin/python"
    )
    assert settings["spark.python.daemon.module"] == launch.PYTHON_DAEMON_MODULE
    flags = launch.submit_flags(python="/venv/bin/python", archive="env.tar.gz")
    assert flags[flags.index("--archives") + 1] == settings["spark.archives"]


def test_pack_refuses_an_editable_arrowbeat(tmp_path: Path) -> None:
    """This checkout's venv has arrowbeat editable: executors would not have the checkout."""
    with pytest.raises(SetupError, match="editable"):
        pack.pack(tmp_path / "env.tar.gz", Path(sys.prefix))


def test_pack_leaves_out_sparks_jars_and_relocates_scripts(tmp_path: Path, monkeypatch) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    touch(venv / "pyvenv.cfg")
    touch(site / "pyspark" / "jars" / "spark-core.jar")
    touch(site / "pyspark" / "sql" / "__init__.py")
    touch(site / "spark_plugin" / "__init__.py")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / "bin" / "tool").write_bytes(f"#!{venv}/bin/python\nprint('hi')\n".encode())
    monkeypatch.setattr(pack, "check_packable", lambda prefix: None)
    packed = pack.pack(tmp_path / "env.tar", venv)
    with tarfile.open(packed.archive) as tar:
        names = set(tar.getnames())
        script = tar.extractfile("bin/tool").read()  # type: ignore[union-attr]
        link = tar.getmember("bin/python")
    assert "lib/python3.11/site-packages/pyspark/sql/__init__.py" in names
    assert "lib/python3.11/site-packages/spark_plugin/__init__.py" in names
    assert not [n for n in names if "pyspark/jars" in n]
    assert script == pack.RELOCATABLE_SHEBANG + b"print('hi')\n"
    assert link.issym() and link.linkname == sys.executable
    assert packed.base_python == os.path.realpath(sys.executable)
    with pytest.raises(SetupError, match="must end in"):
        pack.pack(tmp_path / "env.zip", venv)
