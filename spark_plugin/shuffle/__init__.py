"""The Arrow shuffle for PySpark DataFrames: everything of the shuffle that knows Spark.

Modules, one role each:

- ``dataframe``: the public API on the driver (``repartition``, ``group_apply``,
  ``partition_apply``, ``map_in_arrow``, ``map_in_pandas``, ``shuffle_of``, ``release``);
  ``mode="materialized"`` (default) or ``mode="pipelined"``.
- ``grouped``: Spark's grouped-map API (``group_by(df, *cols)`` -> ``applyInPandas``,
  ``applyInArrow``, ``cogroup(...).applyInPandas/applyInArrow``); ``grouped_map``: the function
  forms (signature dispatch as Spark's, pandas/Arrow conversion, result checks) run per group in
  the reduce tasks.
- ``takeover``: whether an application's own ``groupBy().applyInPandas/applyInArrow`` (and
  cogroup) call runs on arrowbeat's shuffle (``spark.arrowbeat.shuffle.groupedMap``; the PySpark
  side is ``spark_plugin.compat.grouped_map_hook``, installed by the wheel's ``arrowbeat.pth``).
- ``route``: which exchange a call takes (``path="auto"``: Spark's own below a measured input
  size, from the optimizer's statistics; ``choose`` for the groupedMap hook), and its record.
- ``tasks``: the map and reduce task bodies of the materialized mode, run in Spark's Python
  workers (host-local file reads, and streams from other agents through an engine ``InputGate``).
- ``map_output``: materialized map-output files (Arrow IPC, one segment run per reduce partition),
  each segment checksummed a chunk at a time and verified before Arrow reads it
  (``arrow_shuffle.checksum``).
- ``corrupt_outputs``: what an agent does with a damaged map output of its own: removes it and has
  Spark rerun it (its status rows' Spark blocks removed, ``compat.shuffle_blocks``), or replaces
  the executor where it cannot.
- ``agent_layout``: where map outputs and the agents' discovery files live (the shuffle roots on
  the executor's local disks, private directories), shared by the agent, its clients and the tasks.
- ``agent_protocol``: the agent's control schema (``AGENT_CONTROL``), shared by service and client.
- ``agent_service``: the executor agent's ``MapOutputService`` (streams map outputs to reducers
  over the engine's ``PartitionServer``; staging, release, TTL) and its discovery file;
  ``agent_ttl`` holds its bounded bookkeeping (deleted ids, the TTL on the monotonic clock) and
  ``agent_disk_usage`` walks its folders off the heartbeat loop.
- ``agent_client``: how a Python worker finds its executor's agent (``find_agent``) and talks to
  its control channel (``MapOutputClient``).
- ``pipelined`` and ``rendezvous``: the pipelined mode (map and reduce tasks in one stage; the
  driver's ``Rendezvous`` tells reducers where map tasks serve).
- ``grouping``: Spark's grouping semantics over Arrow (nulls with nulls, NaN with NaN).
- ``session``: what planning needs from the session (conf, application id, shuffle ids, default
  parallelism), from a classic session's SparkContext or a Spark Connect session's conf and probe
  jobs.
- ``local_secret``: the agent hands the application secret to its own executor's workers, for
  plans made from a Spark Connect session (which never sees it).

Depends on the engine (``arrow_shuffle``), pyspark, ``arrowbeat_base.clock`` and the plugin's
settings, errors, tables and Connect shim (``spark_plugin.settings.config``, ``spark_plugin.errors``,
``spark_plugin.history``, ``spark_plugin.compat.connect``); the engine never imports this
package back. Errors are the engine's (``arrow_shuffle.errors``), except a bad
``spark.arrowbeat.*`` setting: ``spark_plugin``'s ``ConfigError``.
"""

from typing import TYPE_CHECKING

from arrowbeat_base.lazy_exports import lazy_exports

if TYPE_CHECKING:  # imported on first use (``__getattr__``): a worker loads only what it needs
    from spark_plugin.shuffle.driver.dataframe import (
        group_apply,
        map_in_arrow,
        map_in_pandas,
        partition_apply,
        repartition,
    )
    from spark_plugin.shuffle.driver.grouped import CoGroupedData, GroupedData, group_by
    from spark_plugin.shuffle.driver.handle import ShuffleHandle, release, shuffle_of

__all__ = [
    "CoGroupedData",
    "GroupedData",
    "ShuffleHandle",
    "group_apply",
    "group_by",
    "map_in_arrow",
    "map_in_pandas",
    "partition_apply",
    "release",
    "repartition",
    "shuffle_of",
]

_EXPORTS = {
    "ShuffleHandle": "spark_plugin.shuffle.driver.handle",
    "group_apply": "spark_plugin.shuffle.driver.dataframe",
    "map_in_arrow": "spark_plugin.shuffle.driver.dataframe",
    "map_in_pandas": "spark_plugin.shuffle.driver.dataframe",
    "partition_apply": "spark_plugin.shuffle.driver.dataframe",
    "release": "spark_plugin.shuffle.driver.handle",
    "repartition": "spark_plugin.shuffle.driver.dataframe",
    "shuffle_of": "spark_plugin.shuffle.driver.handle",
    "CoGroupedData": "spark_plugin.shuffle.driver.grouped",
    "GroupedData": "spark_plugin.shuffle.driver.grouped",
    "group_by": "spark_plugin.shuffle.driver.grouped",
}
"""Each public name and the module defining it: imported when the name is first used."""


if not TYPE_CHECKING:  # for type checkers the names are the imports above: a misspelt one is an error
    __getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
