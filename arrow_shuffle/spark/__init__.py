"""The Arrow shuffle for PySpark DataFrames: everything of the shuffle that knows Spark.

Modules, one role each:

- ``dataframe``: the public API on the driver (``repartition``, ``group_apply``,
  ``partition_apply``, ``map_in_arrow``, ``shuffle_of``, ``release``).
- ``tasks``: the map and reduce task bodies Spark runs in its Python workers.
- ``map_output``: map-output files (Arrow IPC, one segment run per reduce partition).
- ``agent_service``: the executor agent's ``MapOutputService`` (serves map outputs to remote
  reducers over the engine's ``PartitionServer``; staging, release, TTL) and its discovery file.
- ``agent_client``: how a Python worker finds its executor's agent and talks to its control port.
- ``pipelined`` and ``rendezvous``: the pipelined mode (map and reduce tasks in one stage).
- ``grouping``: Spark's grouping semantics over Arrow (nulls with nulls, NaN with NaN).

Depends on the engine (``arrow_shuffle``), pyspark and the plugin's settings and tables
(``spark_plugin.config``, ``spark_plugin.history``); the engine never imports this package back.
"""

from arrow_shuffle.spark.dataframe import (
    ShuffleHandle,
    group_apply,
    map_in_arrow,
    partition_apply,
    release,
    repartition,
    shuffle_of,
)

__all__ = [
    "ShuffleHandle",
    "group_apply",
    "map_in_arrow",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]
