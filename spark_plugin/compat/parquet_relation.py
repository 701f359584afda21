"""Whether a DataFrame is nothing but Parquet files, read from the JVM's optimized plan over py4j.

``spark.read.parquet(path)``, and a ``select`` of some of its columns, optimize to a
``LogicalRelation`` over a ``HadoopFsRelation`` (``ParquetFileFormat``, files listed by an
``InMemoryFileIndex``), under at most one ``Project`` of plain column references. Such a frame's
rows are exactly the files' rows: a shuffle's map task may read the files itself
(``shuffle.direct_scan``) instead of taking them from the JVM's scan row by row.

PySpark has no public call for any of this, so this shim checks each class by name before it
reads a field and answers ``why_not`` instead of raising: any other plan (a filter, a computed
column, a cache, partition or bucket columns, Delta's file format, a streaming source, Spark
Connect) keeps Spark's scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spark_plugin.compat.connect import is_connect

_PROJECT = "org.apache.spark.sql.catalyst.plans.logical.Project"
_ATTRIBUTE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"
_LOGICAL_RELATION = "org.apache.spark.sql.execution.datasources.LogicalRelation"
_FS_RELATION = "org.apache.spark.sql.execution.datasources.HadoopFsRelation"
_PARQUET = "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat"
_LISTED = "org.apache.spark.sql.execution.datasources.InMemoryFileIndex"


@dataclass(frozen=True)
class ParquetRelation:
    """The files under a plain Parquet scan (``files`` empty and ``why_not`` set when it is not one)."""

    files: tuple[str, ...] = ()
    """The files Spark would read, as the URIs its file index lists."""
    options: dict[str, str] = field(default_factory=dict)
    """The read's options, keys in lower case (Spark's option map is case-insensitive)."""
    why_not: str = ""


def _class(obj: Any) -> str:
    return str(obj.getClass().getName())


def _seq(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def parquet_relation(df: Any) -> ParquetRelation:
    """The Parquet files whose rows are ``df``'s rows, or why ``df`` is not just that."""
    session = getattr(df, "sparkSession", None)
    if session is None or is_connect(session):
        return ParquetRelation(why_not="a Spark Connect session: no py4j link to the query's plan")
    if df.isStreaming:
        return ParquetRelation(why_not="a streaming source")
    try:
        node = df._jdf.queryExecution().optimizedPlan()
        if _class(node) == _PROJECT:
            items = _seq(node.projectList())
            computed = [str(item.toString()) for item in items if _class(item) != _ATTRIBUTE]
            if computed:
                return ParquetRelation(why_not=f"computed columns over the scan ({', '.join(computed)})")
            node = node.child()
        if _class(node) != _LOGICAL_RELATION:
            return ParquetRelation(why_not=f"the optimized plan is a {node.nodeName()}, not a file scan")
        relation = node.relation()
        if _class(relation) != _FS_RELATION:
            return ParquetRelation(why_not=f"a {_class(relation)}, not a file source")
        if _class(relation.fileFormat()) != _PARQUET:
            return ParquetRelation(why_not=f"the file format is {_class(relation.fileFormat())}")
        if relation.partitionSchema().length() > 0:
            return ParquetRelation(why_not="partition columns (their values are in the directory names)")
        if not relation.bucketSpec().isEmpty():
            return ParquetRelation(why_not="a bucketed table")
        if _class(relation.location()) != _LISTED:
            return ParquetRelation(why_not=f"files listed by a {_class(relation.location())}")
        files = tuple(str(path) for path in relation.location().inputFiles())
        converters = session._jvm.scala.jdk.javaapi.CollectionConverters
        options = {str(k).lower(): str(v) for k, v in dict(converters.asJava(relation.options())).items()}
    except Exception as exc:  # py4j raises its own types; any failure means: not readable here
        return ParquetRelation(why_not=f"the plan is not readable ({type(exc).__name__}: {exc})")
    return ParquetRelation(files, options)


__all__ = ["ParquetRelation", "parquet_relation"]
