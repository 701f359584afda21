"""Which Spark, pyarrow and pandas arrowbeat runs on, and which Delta jar goes with that Spark.

The support matrix lives here once: the support tables (README, docs/reference/versions.md), ``conf`` and the
start-up checks of the driver-side process and the agents all read it. A Spark outside the
supported minors is named with the supported ones; an unknown newer 4.x minor may still run
(every shim checks the internals it uses and skips what it cannot verify), an older major cannot.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_SPARK_MINORS: tuple[tuple[int, int], ...] = ((4, 0), (4, 1), (4, 2), (4, 3))
"""The Spark minors a CI cell tests (``make matrix``); each minor's newest patch."""

MINIMUM_PYARROW = (16, 0, 0)
"""pyspark 4.0 accepts pyarrow 11, but arrowbeat's history tables need 16: deltalake reads Arrow
through ``__arrow_c_schema__`` (pyarrow 14+), and float16 keys need the half-float casts of 16."""
MINIMUM_PANDAS = (2, 0, 0)
"""What every supported pyspark's Arrow UDFs ask for (``mapInArrow`` too: it checks for pandas);
arrowbeat never imports it itself."""

DELTA_RELEASE = "4.4.0"
"""The Delta Lake release whose jars arrowbeat puts beside each Spark (one artifact per minor)."""
DELTA_ARTIFACTS: dict[tuple[int, int], str] = {
    (4, 0): "delta-spark_4.0_2.13",
    (4, 1): "delta-spark_4.1_2.13",
    (4, 2): "delta-spark_4.2_2.13",
}
"""Spark minor -> Delta's artifact for it (group ``io.delta``, with ``delta-storage``). A minor
missing here has no Delta release yet: arrowbeat's tables are still written and read with delta-rs,
but Spark itself cannot read them as Delta."""
DELTA_STORAGE = "delta-storage"


def parse_version(text: str) -> tuple[int, ...]:
    """``"4.1.0.dev1"`` -> ``(4, 1, 0)``: the leading dotted numbers of a version string."""
    numbers = re.match(r"\d+(?:\.\d+)*", text.strip())
    if numbers is None:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(n) for n in numbers.group(0).split("."))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def supported_spark_text() -> str:
    first, last = SUPPORTED_SPARK_MINORS[0], SUPPORTED_SPARK_MINORS[-1]
    return f"{_dotted(first)} to {_dotted(last)}"


@dataclass(frozen=True)
class SparkSupport:
    """What arrowbeat does on one Spark version: ``level`` is ``supported``, ``untested`` (a newer
    4.x minor: runs, each shim checks before it acts) or ``unsupported`` (does not start)."""

    version: str
    level: str
    message: str | None
    """One line for the log or the terminal; None when supported."""

    @property
    def runs(self) -> bool:
        return self.level != "unsupported"


def spark_support(version: str) -> SparkSupport:
    try:
        parsed = parse_version(version)
    except ValueError:
        return SparkSupport(version, "unsupported", f"arrowbeat cannot read the Spark version {version!r}")
    minor = (*parsed, 0)[:2]
    if minor in SUPPORTED_SPARK_MINORS:
        return SparkSupport(version, "supported", None)
    supported = supported_spark_text()
    if minor[0] == SUPPORTED_SPARK_MINORS[-1][0] and minor > SUPPORTED_SPARK_MINORS[-1]:
        return SparkSupport(
            version,
            "untested",
            f"arrowbeat supports Spark {supported}; this is Spark {version}, not tested yet: monitoring "
            "and the shuffle run, and whatever touches a Spark internal is checked first and skipped "
            "with a warning if it changed",
        )
    return SparkSupport(
        version,
        "unsupported",
        f"arrowbeat supports Spark {supported}; this is Spark {version}: arrowbeat stays off "
        "(use arrowbeat with a supported Spark)",
    )


def running_spark_version() -> str:
    """The Spark that ``spark-submit`` will run: ``$SPARK_HOME``'s when set (its
    ``spark-core_2.13-<version>.jar``), else the installed pyspark's."""
    from importlib import metadata  # here: the worker daemon, which only parses versions, never loads it

    home = os.environ.get("SPARK_HOME")
    if home:
        for jar in sorted((Path(home) / "jars").glob("spark-core_*.jar")):
            found = re.fullmatch(r"spark-core_[0-9.]+-(.+)\.jar", jar.name)
            if found:
                return found.group(1)
    return metadata.version("pyspark")


@dataclass(frozen=True)
class DeltaJars:
    """Delta's jars for one Spark: Maven coordinates, or None with the reason."""

    coordinates: tuple[str, ...]
    reason: str | None

    @property
    def available(self) -> bool:
        return bool(self.coordinates)

    def file_names(self) -> list[str]:
        """The jar file names Maven's ``dependency:copy`` writes (``artifact-version.jar``)."""
        return [f"{c.split(':')[1]}-{c.split(':')[2]}.jar" for c in self.coordinates]


def delta_jars(spark_version: str) -> DeltaJars:
    try:
        major, minor = (*parse_version(spark_version), 0)[:2]
    except ValueError:
        major, minor = 0, 0
    artifact = DELTA_ARTIFACTS.get((major, minor))
    if artifact is None:
        releases = ", ".join(_dotted(m) for m in DELTA_ARTIFACTS)
        return DeltaJars(
            (),
            f"Delta Lake {DELTA_RELEASE} has no release for Spark {spark_version} (it has for Spark "
            f"{releases}): arrowbeat's history tables are still written and read (delta-rs: the "
            "`arrowbeat` CLI and report), but Spark-side Delta reads (spark.read.format('delta'), "
            "the streaming jobs) need a Delta release for this Spark",
        )
    return DeltaJars(
        (f"io.delta:{artifact}:{DELTA_RELEASE}", f"io.delta:{DELTA_STORAGE}:{DELTA_RELEASE}"), None
    )


def library_problems() -> list[str]:
    """pyarrow or pandas older than arrowbeat supports, each named with the version found."""
    from importlib import metadata

    problems = []
    for name, minimum in (("pyarrow", MINIMUM_PYARROW), ("pandas", MINIMUM_PANDAS)):
        try:
            found = metadata.version(name)
        except metadata.PackageNotFoundError:
            problems.append(f"{name} is not installed (arrowbeat needs {name}>={_dotted(minimum)})")
            continue
        try:
            too_old = parse_version(found) < minimum
        except ValueError:
            continue
        if too_old:
            problems.append(f"{name} {found} is older than arrowbeat supports ({name}>={_dotted(minimum)})")
    return problems
