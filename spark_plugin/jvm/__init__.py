"""The link to the JVM: how users turn the plugin on (``launch``), the protocol with the launcher's
JVM plugins (``sidecar``, ``plugin_metrics``) and what runs inside PySpark's Python workers
(``spark_plugin.python_worker``: ``daemon``, ``worker_label``, ``zip_imports``)."""
