"""Compiles arrowbeat's launcher jar against the oldest supported Spark's API, fetched by Maven.

One jar serves every supported Spark, so it is compiled against the oldest one's jars (the Maven
coordinates in ``launcher_classpath.txt`` beside this file, fetched without their dependencies),
never against whichever pyspark happens to be installed: a jar built against a newer Spark could
link to a member the older ones lack. The Makefile (``.cache/launcher/``) and every wheel build
(``arrowbeat_build``) use this one module. Standard library only: the Makefile runs it with any
Python 3.11+, before a venv exists.

``python build_backend/launcher_jar.py --classpath-dir DIR --jar OUT`` fetches the missing jars into
``DIR`` and writes the jar to ``OUT`` (replaced whole, so a running application never reads half).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

COORDINATES_FILE = Path(__file__).resolve().with_name("launcher_classpath.txt")
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
JAVA_RELEASE = "17"


def coordinates(listing: Path = COORDINATES_FILE) -> list[str]:
    """``group:artifact:version`` per line of ``listing``; ``#`` comments and blank lines skipped."""
    found = []
    for raw in listing.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.count(":") != 2 or not all(line.split(":")):
            raise ValueError(f"{listing}: {line!r} is not group:artifact:version")
        found.append(line)
    return found


def jar_name(coordinate: str) -> str:
    """The file Maven's ``dependency:copy`` writes for ``coordinate``: ``artifact-version.jar``."""
    _, artifact, version = coordinate.split(":")
    return f"{artifact}-{version}.jar"


def fetch(directory: Path, wanted: Sequence[str] | None = None) -> list[Path]:
    """The jars of ``wanted`` (default: :func:`coordinates`) in ``directory``, each fetched with
    Maven when missing (Maven's local repository caches downloads). Raises ``RuntimeError`` naming
    the coordinate when Maven is missing or fails."""
    wanted = coordinates() if wanted is None else wanted
    directory.mkdir(parents=True, exist_ok=True)
    jars = []
    for coordinate in wanted:
        jar = directory / jar_name(coordinate)
        if not jar.is_file():
            mvn = shutil.which("mvn")
            if mvn is None:
                raise RuntimeError(
                    f"compiling arrowbeat's launcher needs Spark's API jars ({COORDINATES_FILE.name}): "
                    f"install Maven 3.6+ (mvn) to fetch them, or put {jar.name} in {directory}"
                )
            command = [mvn, "-q", "-B", f"{MAVEN_DEPENDENCY_PLUGIN}:copy"]
            command += [f"-Dartifact={coordinate}", f"-DoutputDirectory={directory}"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0 or not jar.is_file():
                output = f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
                raise RuntimeError(f"Maven could not fetch {coordinate}:\n{output}")
        jars.append(jar)
    return jars


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


def compile_launcher(sources: Path, target: Path, classpath: Sequence[Path]) -> None:
    """``javac --release 17`` every ``.java`` under ``sources`` against ``classpath``, then zip the
    classes as ``target`` (written beside it first, then renamed over it)."""
    java_files = sorted(str(p) for p in sources.rglob("*.java"))
    if not java_files:
        raise RuntimeError(f"no launcher sources under {sources}: build from a full source tree")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="arrowbeat-launcher-") as tmp:
        classes = Path(tmp) / "classes"
        command = [javac(), "-nowarn", "--release", JAVA_RELEASE, "-d", str(classes)]
        command += ["-cp", os.pathsep.join(str(j) for j in classpath), *java_files]
        subprocess.run(command, check=True)
        partial = target.with_name(f".{target.name}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: arrowbeat\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        partial.replace(target)


def build(sources: Path, target: Path, classpath_dir: Path) -> None:
    """:func:`fetch` into ``classpath_dir``, then :func:`compile_launcher` into ``target``."""
    compile_launcher(sources, target, fetch(classpath_dir))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jar", type=Path, required=True, help="the launcher jar to write")
    parser.add_argument("--classpath-dir", type=Path, required=True, help="where the API jars are kept")
    parser.add_argument(
        "--sources",
        type=Path,
        default=Path(__file__).resolve().parent.parent / "launcher" / "src" / "main" / "java",
    )
    args = parser.parse_args(argv)
    try:
        build(args.sources, args.jar, args.classpath_dir)
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"launcher_jar: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
