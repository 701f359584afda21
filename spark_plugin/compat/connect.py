"""Is this a Spark Connect session? Decided by what the session object is, never by a version.

A Spark Connect session (``SparkSession.builder.remote(...)``, ``spark.api.mode=connect``,
``pyspark-client``) has no SparkContext, no py4j gateway and no accumulators: code that needs them
asks here first and takes its Connect path or refuses with ``unsupported``'s message.

The check: an instance of ``pyspark.sql.connect.session.SparkSession``, looked up only if that
module is already imported (a Connect session cannot exist before it is, and importing it costs
a classic process grpc and protobuf); failing that, an object with neither ``_jsc`` nor
``sparkContext`` (what a Connect session lacks whatever its class).
"""

from __future__ import annotations

import sys

CONNECT_SESSION_MODULE = "pyspark.sql.connect.session"


def is_connect(session: object) -> bool:
    """Whether ``session`` is a Spark Connect session (no JVM in this process)."""
    module = sys.modules.get(CONNECT_SESSION_MODULE)
    connect_class = getattr(module, "SparkSession", None) if module is not None else None
    if isinstance(connect_class, type) and isinstance(session, connect_class):
        return True
    # A Connect session's ``sparkContext`` raises (an AttributeError): hasattr is False for it.
    return not hasattr(session, "_jsc") and not hasattr(session, "sparkContext")


def unsupported(call: str, why: str, instead: str) -> str:
    """The message for a call refused on a Spark Connect session: what, why, and what to use."""
    return f"{call} is not supported from a Spark Connect session ({why}): {instead}"
