"""The PySpark a Python worker process runs, as the minor the worker shims know it by.

Taken from the imported package, not from pip's metadata: an executor's workers import Spark's own
``pyspark.zip`` first on their path, whatever is installed beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from spark_plugin.compat.versions import parse_version

T = TypeVar("T")


def imported_pyspark_version() -> str:
    """``pyspark.__version__`` of the pyspark this process imports; ``"unknown"`` without one."""
    try:
        import pyspark
    except ImportError:
        return "unknown"
    return str(getattr(pyspark, "__version__", "unknown"))


def minor_of(version: str) -> tuple[int, int] | None:
    """``"4.3.0"`` -> ``(4, 3)``; None when ``version`` is not one."""
    try:
        parsed = parse_version(version)
    except ValueError:
        return None
    return (parsed[0], parsed[1]) if len(parsed) >= 2 else None


def recorded_for(table: Mapping[tuple[int, int], T], version: str, what: str) -> tuple[T | None, str]:
    """``table``'s entry for ``version``'s minor and ``""``, or None and why: the one wording of
    "a pyspark this shim has no record of" (``what`` names the part, e.g. ``"daemon"``)."""
    minor = minor_of(version)
    if minor is not None and minor in table:
        return table[minor], ""
    known = ", ".join(f"{a}.{b}" for a, b in table)
    return None, f"pyspark {version} is not a version whose {what} arrowbeat knows ({known})"
