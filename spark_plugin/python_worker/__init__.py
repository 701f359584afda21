"""Runs inside PySpark's Python workers (and their daemon), apart from shuffle tasks: arrowbeat's
worker daemon (``daemon``), a worker's task label (``worker_label``) and the zip-import cache
(``zip_imports``). Their version shims live in ``spark_plugin.compat``."""
