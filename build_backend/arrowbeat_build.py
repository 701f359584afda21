"""The build backend: setuptools', plus the launcher jar compiled into every wheel.

A wheel must carry ``spark_plugin/jars/arrowbeat-launcher.jar`` (``spark_plugin.jvm.launch.jar_paths``
finds it there), so ``build_py`` compiles ``launcher/src`` with ``javac --release 17`` against the
oldest supported Spark's API jars, fetched by Maven (``launcher_jar``: the coordinates are in
``launcher_classpath.txt``, the same jars the Makefile uses), never against an installed pyspark:
one jar runs on every supported Spark. Building a wheel therefore needs a JDK and Maven, and no
Python build requirement beyond setuptools'. An editable install (``make setup``) skips the jar
(the checkout builds it into ``.cache/`` with the Makefile). ``ARROWBEAT_LAUNCHER_CLASSPATH``
names a folder to keep the API jars in (the Makefile's, so a wheel build fetches nothing again).

Both kinds of wheel carry ``arrowbeat.pth``, the start-up line of ``spark.arrowbeat.shuffle.groupedMap``
(``_arrowbeat_startup``): a wheel through ``build_py``, an editable one (PEP 660, what ``make setup``
installs) through :func:`build_editable`, which adds it to setuptools' editable wheel and to its
``RECORD`` (so reinstalling or uninstalling replaces or removes it). Without it the checkout's venv
silently left an unchanged ``applyInPandas`` job on Spark's path where a user's venv took it over.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import launcher_jar  # beside this module: pip puts backend-path (build_backend/) on sys.path
from setuptools.build_meta import build_editable as _setuptools_build_editable
from setuptools.build_meta import (  # re-exported: the PEP 517 hooks not changed here
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,  # setuptools' only: the launcher's Spark jars come from Maven
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

LAUNCHER_SOURCES = Path("launcher") / "src" / "main" / "java"
JAR_IN_PACKAGE = Path("spark_plugin") / "jars" / "arrowbeat-launcher.jar"
CLASSPATH_ENV = "ARROWBEAT_LAUNCHER_CLASSPATH"
STARTUP_PTH = "arrowbeat.pth"


class BuildPyWithLauncher(build_py):  # type: ignore[misc]  # setuptools ships no type hints
    """``build_py`` that also compiles the launcher jar into the package (wheels, not editables)."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        # site-packages' root: Python's ``site`` runs its line at start-up (_arrowbeat_startup.py)
        self.copy_file(str(Path.cwd() / STARTUP_PTH), str(Path(self.build_lib) / STARTUP_PTH))
        target = Path(self.build_lib) / JAR_IN_PACKAGE
        compile_launcher(Path.cwd() / LAUNCHER_SOURCES, target)
        self.announce(f"compiled the arrowbeat launcher into {target}", level=2)


def compile_launcher(sources: Path, target: Path) -> None:
    """The launcher jar at ``target``, compiled against the API jars of ``launcher_classpath.txt``
    (kept in ``$ARROWBEAT_LAUNCHER_CLASSPATH`` when set, else fetched into a temporary folder)."""
    kept = os.environ.get(CLASSPATH_ENV)
    if kept:
        launcher_jar.build(sources, target, Path(kept))
        return
    with tempfile.TemporaryDirectory(prefix="arrowbeat-launcher-cp-") as tmp:
        launcher_jar.build(sources, target, Path(tmp))


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, object] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 660's hook: setuptools' editable wheel with ``arrowbeat.pth`` at its root, as the wheel has it."""
    name: str = _setuptools_build_editable(wheel_directory, config_settings, metadata_directory)
    add_to_wheel(Path(wheel_directory) / name, STARTUP_PTH, (Path.cwd() / STARTUP_PTH).read_bytes())
    return name


def add_to_wheel(wheel: Path, arcname: str, data: bytes) -> None:
    """Adds (or replaces) ``arcname`` in ``wheel`` and its line in the wheel's ``RECORD``
    (``path,sha256=<urlsafe base64, unpadded>,size``, as installers check it)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    line = f"{arcname},sha256={digest},{len(data)}"
    rebuilt = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as target:
        (record,) = [n for n in source.namelist() if n.endswith(".dist-info/RECORD")]
        for info in source.infolist():
            if info.filename not in (arcname, record):
                target.writestr(info, source.read(info))
        target.writestr(arcname, data)
        kept = [r for r in source.read(record).decode().splitlines() if r and not r.startswith(f"{arcname},")]
        target.writestr(record, "\n".join([*kept, line]) + "\n")
    shutil.move(rebuilt, wheel)
