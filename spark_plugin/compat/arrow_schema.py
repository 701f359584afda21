"""Spark schema -> Arrow schema, the way PySpark's own Arrow UDFs see their batches.

PySpark's converter (``pyspark.sql.pandas.types.to_arrow_schema``) is internal and changed shape:
up to 4.1 it takes ``timestamp_utc=True`` (TimestampType as ``timestamp[us, tz=UTC]``); from 4.2 a
keyword-only ``timezone`` that a TimestampType needs (the workers pass ``"UTC"``). Both spellings
give the same Arrow type, the one ``mapInArrow`` batches carry; the signature is checked once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

TIMESTAMP_ZONE = "UTC"
"""The zone of TimestampType columns in the batches of PySpark's Arrow UDFs (every version)."""


class UnknownConverterError(RuntimeError):
    """This pyspark's schema converter takes neither known spelling; the message says what it has."""


@cache
def _converter() -> tuple[Callable[..., Any], dict[str, Any]]:
    from pyspark.sql.pandas import types

    convert = getattr(types, "to_arrow_schema", None)
    if not callable(convert):
        raise UnknownConverterError("pyspark.sql.pandas.types has no to_arrow_schema")
    parameters = inspect.signature(convert).parameters
    if "timezone" in parameters:
        return convert, {"timezone": TIMESTAMP_ZONE}
    if "timestamp_utc" in parameters:
        return convert, {"timestamp_utc": True}
    raise UnknownConverterError(
        f"pyspark's to_arrow_schema{inspect.signature(convert)} takes neither timezone nor timestamp_utc"
    )


def to_arrow_schema(schema: StructType) -> pa.Schema:
    """``schema`` as Arrow, TimestampType in UTC as PySpark's Arrow UDFs carry it."""
    convert, zone = _converter()
    return convert(schema, **zone)
