"""Runs inside PySpark's Python workers: the map and reduce task bodies (``tasks``, ``pipelined``),
grouping and the user's function (``grouping``, ``grouped_map``, ``pandas_groups``,
``reduce_spill``, ``memory_buckets``, ``row_buckets``) and the way to the executor's agent
(``agent_client``)."""
