"""The optimizer's size estimate of a DataFrame, read from the JVM's ``QueryExecution`` over py4j.

Spark keeps, for every optimized logical plan, ``Statistics(sizeInBytes, rowCount)``: the sum of
the files' sizes under a file scan, ``rows x row size`` under a ``range``, a cached relation's real
in-memory (columnar, compressed) size once it has been materialized, and estimates scaled through
projections, filters and joins above them. AQE decides broadcast joins from the same numbers.

PySpark has no public call for it, so this shim checks what it touches before it acts (a classic
session with a ``_jdf``; ``queryExecution().optimizedPlan().stats()`` answering with an integer)
and otherwise says why not, never raising: a Spark Connect session has no py4j in this process.

The estimate is read from a *fresh* plan (``select("*")``): a DataFrame's own plan caches its
statistics when first asked, so a cached relation asked before it was materialized would keep
reporting the plan's estimate instead of its real size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_plugin.compat.connect import is_connect


@dataclass(frozen=True)
class PlanSize:
    """What the optimizer says of a plan's output: bytes, and rows when it knows them."""

    bytes: int | None
    rows: int | None = None
    why_not: str = ""
    """Empty when ``bytes`` is known; else why no statistics could be read."""


def _as_int(value: Any) -> int:
    """A Scala ``BigInt``/``Long`` as py4j hands it over: an ``int`` or an object whose text is one."""
    return value if isinstance(value, int) else int(str(value.toString()))


def plan_size(df: Any) -> PlanSize:
    """The optimizer's ``sizeInBytes`` (and ``rowCount``, if known) of ``df``'s output."""
    session = getattr(df, "sparkSession", None)
    if session is None or is_connect(session):
        return PlanSize(None, why_not="a Spark Connect session: no py4j link to the query's plan")
    try:
        jdf = df.select("*")._jdf
        stats = jdf.queryExecution().optimizedPlan().stats()
        size = _as_int(stats.sizeInBytes())
        row_count = stats.rowCount()
        rows = _as_int(row_count.get()) if row_count.isDefined() else None
    except Exception as exc:  # py4j raises its own types; any failure means: not readable here
        return PlanSize(None, why_not=f"the plan's statistics are not readable ({type(exc).__name__}: {exc})")
    if size < 0:
        return PlanSize(None, why_not=f"the plan reports {size} bytes")
    return PlanSize(size, rows)


__all__ = ["PlanSize", "plan_size"]
