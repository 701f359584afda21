"""What the tests and the benchmarks share, so that neither imports the other: the run's environment
(``env``), finding and ending its processes (``procs``), sessions (``session``), spark-submit
applications (``submit``, ``apps``), a standalone cluster (``standalone``), the history tables read
without Spark (``history_read``), heartbeat roles as child processes (``heartbeat_processes``,
``rm_process``) and the soaks whose short forms the suite runs (``chaos``, ``bookkeeping_soak``).

It lives in the checkout only (never in the wheel; ``tests/test_packaging.py``); it imports the
product, never ``tests`` nor ``benchmarks`` (``tests/test_architecture.py``). Pytest's own pieces
(fixtures, hooks, shards) stay in ``tests/harness/``.
"""
