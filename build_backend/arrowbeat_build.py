"""The build backend: setuptools', plus the launcher jar compiled into every wheel.

A wheel must carry ``spark_plugin/jars/arrowbeat-launcher.jar`` (``spark_plugin.launch.jar_paths``
finds it there), so ``build_py`` compiles ``launcher/src`` with ``javac --release 17`` against the
Spark jars of the pyspark installed in the build environment, the same jars the Makefile uses.
pyspark is therefore a build requirement of wheels only: an editable install (``make setup``)
skips the jar (the checkout builds it into ``.cache/`` with the Makefile) and does not pay for
installing pyspark into the isolated build environment.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # re-exported: the PEP 517 hooks not changed here
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)
from setuptools.command.build_py import build_py

__all__ = [
    "BuildPyWithLauncher",
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# The Spark the launcher is compiled against: the pyspark that arrowbeat itself depends on.
PYSPARK_REQUIREMENT = "pyspark==4.0.5"
LAUNCHER_SOURCES = Path("launcher") / "src" / "main" / "java"
JAR_IN_PACKAGE = Path("spark_plugin") / "jars" / "arrowbeat-launcher.jar"


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    """setuptools' requirements, plus pyspark for its Spark jars (javac's class path)."""
    return [*_setuptools.get_requires_for_build_wheel(config_settings), PYSPARK_REQUIREMENT]


class BuildPyWithLauncher(build_py):  # type: ignore[misc]  # setuptools ships no type hints
    """``build_py`` that also compiles the launcher jar into the package (wheels, not editables)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        target = Path(self.build_lib) / JAR_IN_PACKAGE
        compile_launcher(Path.cwd() / LAUNCHER_SOURCES, target)
        self.announce(f"compiled the arrowbeat launcher into {target}", level=2)


def spark_jars_dir() -> Path:
    """The jars directory of the pyspark importable here (else ``$SPARK_HOME/jars``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin:
        jars = Path(spec.origin).parent / "jars"
        if jars.is_dir():
            return jars
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    raise RuntimeError(
        f"building arrowbeat's launcher jar needs Spark's jars: install {PYSPARK_REQUIREMENT} in the "
        "build environment (pip does, as a build requirement) or set SPARK_HOME"
    )


def javac() -> str:
    """The JDK's compiler: ``$JAVA_HOME/bin/javac``, else ``javac`` on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "javac") if home else None
    if found and Path(found).is_file():
        return found
    found = shutil.which("javac")
    if found is None:
        raise RuntimeError("building arrowbeat's launcher jar needs a JDK 17 or newer (javac): none found")
    return found


def compile_launcher(sources: Path, target: Path) -> None:
    """``javac --release 17`` the launcher's sources, then zip the classes as ``target``."""
    java_files = sorted(str(p) for p in sources.rglob("*.java"))
    if not java_files:
        raise RuntimeError(f"no launcher sources under {sources}: build from a full source tree")
    with tempfile.TemporaryDirectory(prefix="arrowbeat-launcher-") as tmp:
        classes = Path(tmp)
        command = [javac(), "-nowarn", "--release", "17", "-d", str(classes)]
        command += ["-cp", str(spark_jars_dir() / "*"), *java_files]
        subprocess.run(command, check=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: arrowbeat\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
