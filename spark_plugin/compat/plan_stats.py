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

The estimate is an upper bound above scans, filters, aggregations and joins, but not above an
operator that may emit more rows than it reads (``explode``, a Python or typed map function: the
optimizer scales their input's size by row width only). ``PlanSize.grows`` names the first such
operator of the plan, so a caller that would act on a *small* estimate can tell it may be low.
"""

from __future__ import annotations

import re
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
    grows: str = ""
    """The plan's first operator that may emit more rows than it reads (the estimate may then be
    low); ``unknown`` when the plan's operators could not be read; empty when there is none."""


GROWING = re.compile(
    r"^[\s+:|!-]*(Generate|MapInArrow|MapInPandas|PythonMapInArrow|FlatMap\w+|MapPartitions\w*"
    r"|MapElements|CoGroup|MapGroups|AppendColumns|PythonUDTF\w*)\b",
    re.MULTILINE,
)
"""Logical operators whose output rows the optimizer does not bound by their input's (line starts
of ``LogicalPlan.toString``, after the tree's indentation)."""


def growing_operator(plan_text: str) -> str:
    """The first operator in an optimized plan's text that may multiply rows, or ``""``."""
    found = GROWING.search(plan_text)
    return found.group(1) if found else ""


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
        optimized = jdf.queryExecution().optimizedPlan()
        stats = optimized.stats()
        size = _as_int(stats.sizeInBytes())
        row_count = stats.rowCount()
        rows = _as_int(row_count.get()) if row_count.isDefined() else None
    except Exception as exc:  # py4j raises its own types; any failure means: not readable here
        return PlanSize(None, why_not=f"the plan's statistics are not readable ({type(exc).__name__}: {exc})")
    if size < 0:
        return PlanSize(None, why_not=f"the plan reports {size} bytes")
    try:
        grows = growing_operator(str(optimized.toString()))
    except Exception:  # the size stands; only whether it may be low is unknown
        grows = "unknown"
    return PlanSize(size, rows, grows=grows)


__all__ = ["PlanSize", "growing_operator", "plan_size"]
