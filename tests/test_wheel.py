"""``pip install`` gives a complete arrowbeat: the wheel carries the launcher jar (compiled from
``launcher/src`` when it is built) and only the product packages, and from a temp directory its
venv's ``spark-submit $(python -m spark_plugin conf) ... job.py`` runs with the plugin on.

Slow: a wheel build (javac included) and a venv with every dependency (pip's cache makes it
quick); see ``tests/installed.py``."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import zipfile
from pathlib import Path

import pytest

from spark_plugin.compat import versions
from tests.installed import ROOT, Installed, hook_probe

pytestmark = [pytest.mark.slow, pytest.mark.spark]  # builds a wheel (javac) and runs spark-submit

PRODUCT = {"arrowbeat_base", "heartbeat", "arrow_shuffle", "spark_plugin"}
STARTUP = {"_arrowbeat_startup.py", "arrowbeat.pth"}
"""The start-up line that installs the grouped-map hook (``spark.arrowbeat.shuffle.groupedMap``)."""
JAR = "spark_plugin/jars/arrowbeat-launcher.jar"
JAVA_17_CLASS_VERSION = 61


def test_the_wheel_carries_the_launcher_jar_and_only_the_product(installed_wheel: Installed) -> None:
    with zipfile.ZipFile(installed_wheel.wheel) as wheel:
        names = wheel.namelist()
        jar_bytes = wheel.read(JAR)
    tops = {name.split("/")[0] for name in names}
    assert tops - {n for n in tops if n.endswith(".dist-info")} == PRODUCT | STARTUP, sorted(tops)
    with zipfile.ZipFile(io.BytesIO(jar_bytes)) as jar:
        classes = {n for n in jar.namelist() if n.endswith(".class")}
        plugin = jar.read("arrowbeat/ArrowBeatPlugin.class")
    sources = {p.stem for p in (ROOT / "launcher" / "src" / "main" / "java" / "arrowbeat").glob("*.java")}
    assert {f"arrowbeat/{s}.class" for s in sources} <= classes
    assert int.from_bytes(plugin[6:8], "big") == JAVA_17_CLASS_VERSION  # javac --release 17
    # The live page's assets: a folder of data only, which setuptools drops unless it is listed.
    web = {f"spark_plugin/tools/web/{p.name}" for p in (ROOT / "spark_plugin" / "tools" / "web").iterdir()}
    assert web and web <= set(names), sorted(web - set(names))


def test_the_installed_wheel_wraps_pysparks_grouped_maps_with_no_import_of_arrowbeat(
    installed_wheel: Installed, tmp_path: Path
) -> None:
    """``arrowbeat.pth`` runs at start-up: a script that imports only PySpark finds its grouped-map
    methods wrapped (no JVM; the key, off by default, is read at each call)."""
    words = hook_probe(installed_wheel.python, tmp_path, installed_wheel.env())
    assert words == ["True", "True", "True", "False"], words


def conf_flags(installed: Installed, cwd: Path) -> list[str]:
    done = subprocess.run(
        [str(installed.python), "-m", "spark_plugin", "conf"],
        cwd=cwd,
        env=installed.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return shlex.split(done.stdout)


def test_conf_of_the_installed_wheel_names_its_jar_and_lets_spark_fetch_delta(
    installed_wheel: Installed, tmp_path: Path
) -> None:
    flags = conf_flags(installed_wheel, tmp_path)
    assert flags[flags.index("--jars") + 1] == str(installed_wheel.site_packages / JAR)
    spark = subprocess.run(
        [str(installed_wheel.python), "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert flags[flags.index("--packages") + 1] == versions.delta_jars(spark).coordinates[0]
    assert f"spark.arrowbeat.python={installed_wheel.python}" in flags


@pytest.mark.parametrize("pyspark", ["4.0.5", "4.1.4", "4.2.1", "4.3.0"])
def test_the_wheel_resolves_beside_every_supported_pyspark(installed_wheel: Installed, pyspark: str) -> None:
    """A user's ``pip install pyspark==X arrowbeat-*.whl`` in a fresh venv: pip finds a set for
    every supported Spark (no ``--no-deps``, nothing downgraded below the user's pick). pyspark X
    itself comes from the wheelhouse (``scripts.matrix.WHEELHOUSE``: PyPI's sdist of X, built once),
    everything else from the index."""
    done = subprocess.run(
        [
            str(installed_wheel.python),
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "-q",
            "--report",
            "-",
            f"pyspark=={pyspark}",
            str(installed_wheel.wheel),
        ],
        capture_output=True,
        text=True,
        env=installed_wheel.env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {
        i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(done.stdout)["install"]
    }
    assert chosen["pyspark"] == pyspark and "arrowbeat" in chosen, chosen
