"""The PySpark a Python worker process runs, as the minor the worker shims know it by.

Taken from the imported package, not from pip's metadata: an executor's workers import Spark's own
``pyspark.zip`` first on their path, whatever is installed beside it.
"""

from __future__ import annotations

from spark_plugin.compat.versions import parse_version


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
