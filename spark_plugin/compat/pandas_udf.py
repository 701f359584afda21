"""Arrow <-> pandas the way PySpark's grouped-map pandas UDFs convert, on every supported pyspark.

A ``func(pdf)`` run by arrowbeat must see the frame ``applyInPandas`` would hand it (timestamps in
the session's zone, dates as ``datetime.date``, maps as dicts, nullable integers as floats...) and
its result must become the Arrow that Spark would make of it, or the two results differ. So both
conversions are PySpark's own, found once per process:

- pyspark 4.2+: ``pyspark.sql.conversion.ArrowBatchTransformer.to_pandas`` and
  ``PandasToArrowConversion.convert``;
- pyspark 4.0/4.1: the ``ArrowStreamPandasUDFSerializer`` the grouped-map workers use
  (``arrow_to_pandas`` per column, ``_create_batch`` for the result), built with the keywords its
  ``__init__`` takes.

Callers pass what Spark's runner conf holds (``PandasConversion``); they never see which one ran.
pandas is imported here, when a conversion is first asked for.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.types import StructType


@dataclass(frozen=True)
class PandasConversion:
    """The session settings PySpark's pandas UDF workers convert with (its runner conf)."""

    timezone: str | None = None
    """``spark.sql.session.timeZone``: timestamps reach pandas as naive local times of this zone."""
    safecheck: bool = False
    """``spark.sql.execution.pandas.convertToArrowArraySafely``."""
    assign_cols_by_name: bool = True
    """``spark.sql.legacy.execution.pandas.groupedMap.assignColumnsByName``."""
    prefer_int_ext_dtype: bool = False
    """``spark.sql.execution.pythonUDF.pandas.preferIntExtensionDtype`` (pyspark 4.2+)."""
    int_to_decimal_coercion: bool = False
    """``spark.sql.execution.pythonUDF.pandas.intToDecimalCoercionEnabled`` (pyspark 4.1+)."""
    large_var_types: bool = False
    """``spark.sql.execution.arrow.useLargeVarTypes``."""


class UnknownPandasConversionError(RuntimeError):
    """This pyspark has neither known conversion; the message names what is missing."""


def _accepted(call: Callable[..., Any], wanted: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``wanted`` that ``call`` takes as keywords."""
    parameters = inspect.signature(call).parameters
    return {k: v for k, v in wanted.items() if k in parameters}


@cache
def _modern() -> tuple[Any, Any] | None:
    """pyspark 4.2+'s conversion classes, or None on an older pyspark."""
    try:
        from pyspark.sql import conversion
    except ImportError:
        return None
    to_pandas = getattr(conversion, "ArrowBatchTransformer", None)
    to_arrow = getattr(conversion, "PandasToArrowConversion", None)
    if to_pandas is None or to_arrow is None or not hasattr(to_pandas, "to_pandas"):
        return None
    return to_pandas, to_arrow


@cache
def _serializer(conv: PandasConversion) -> Any:
    """pyspark 4.0/4.1: the serializer the grouped-map pandas workers convert with."""
    try:
        from pyspark.sql.pandas.serializers import ArrowStreamPandasUDFSerializer
    except ImportError as exc:  # pragma: no cover - every supported pyspark has one of the two
        raise UnknownPandasConversionError(f"pyspark has no pandas UDF conversion: {exc}") from exc
    wanted = {
        "timezone": conv.timezone,
        "safecheck": conv.safecheck,
        "assign_cols_by_name": conv.assign_cols_by_name,
        "df_for_struct": False,
        "struct_in_pandas": "dict",
        "ndarray_as_list": False,
        "arrow_cast": True,
        "int_to_decimal_coercion_enabled": conv.int_to_decimal_coercion,
    }
    return ArrowStreamPandasUDFSerializer(**_accepted(ArrowStreamPandasUDFSerializer.__init__, wanted))


def to_pandas(table: pa.Table, conv: PandasConversion) -> pd.DataFrame:
    """``table`` as the ``pandas.DataFrame`` ``applyInPandas`` passes for the same rows."""
    import pandas as pd
    import pyarrow as pa

    if table.num_columns == 0:
        return pd.DataFrame(index=range(table.num_rows))
    # One batch, every column one array: a side of a cogroup without rows for a key has columns
    # of no chunks at all, which PySpark's converter cannot take.
    table = _in_session_zone(table, conv.timezone)
    batch = pa.RecordBatch.from_arrays([c.combine_chunks() for c in table.columns], schema=table.schema)
    modern = _modern()
    if modern is not None:
        transformer = modern[0]
        wanted = {"timezone": conv.timezone, "prefer_int_ext_dtype": conv.prefer_int_ext_dtype}
        series = transformer.to_pandas(batch, **_accepted(transformer.to_pandas, wanted))
    else:
        ser = _serializer(conv)
        takes_index = len(inspect.signature(ser.arrow_to_pandas).parameters) >= 2
        series = [
            ser.arrow_to_pandas(column, i) if takes_index else ser.arrow_to_pandas(column)
            for i, column in enumerate(batch.columns)
        ]
    frame = pd.concat(series, axis=1)
    frame.columns = batch.schema.names  # duplicate names survive, as in Spark's frames
    return frame


def _in_session_zone(table: pa.Table, timezone: str | None) -> pa.Table:
    """Timestamp columns labelled with the session's zone, as the JVM labels those it hands a
    pandas UDF: the converter shows each instant as a naive time of its label's zone."""
    import pyarrow as pa

    if not timezone:
        return table
    fields = [
        f.with_type(pa.timestamp(f.type.unit, tz=timezone))
        if pa.types.is_timestamp(f.type) and f.type.tz is not None
        else f
        for f in table.schema
    ]
    target = pa.schema(fields, metadata=table.schema.metadata)
    return table if target.equals(table.schema) else table.cast(target)


def to_arrow(frame: pd.DataFrame, schema: StructType, conv: PandasConversion) -> pa.RecordBatch:
    """A function's result frame as the Arrow batch Spark makes of it for the declared ``schema``
    (columns by name or position as ``conv.assign_cols_by_name`` says, values cast as Spark casts)."""
    import pyarrow as pa
    from pyspark.sql.types import StructField, StructType

    wrapped = StructType([StructField("_0", schema)])  # Spark converts the frame as one struct column
    modern = _modern()
    if modern is not None:
        convert = modern[1].convert
        wanted = {
            "timezone": conv.timezone,
            "safecheck": conv.safecheck,
            "arrow_cast": True,
            "prefers_large_types": conv.large_var_types,
            "assign_cols_by_name": conv.assign_cols_by_name,
            "int_to_decimal_coercion_enabled": conv.int_to_decimal_coercion,
        }
        batch = convert([frame], wrapped, **_accepted(convert, wanted))
    else:
        from spark_plugin.compat.arrow_schema import to_arrow_schema

        struct_type = pa.struct(list(to_arrow_schema(schema)))
        batch = _serializer(conv)._create_batch([(frame, struct_type)])
    column = batch.column(0)
    fields = [column.type.field(i) for i in range(column.type.num_fields)]
    return pa.RecordBatch.from_arrays(column.flatten(), schema=pa.schema(fields))
