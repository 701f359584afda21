"""arrowbeat's base library: what every layer uses, and nothing that knows heartbeats, shuffles or Spark.

``clock`` (the one clock abstraction, injected everywhere time matters), ``rate_log`` (at most one
log line per key per interval), ``lazy_exports`` (package names imported on first use) and
``hard_exit`` (end a process without interpreter finalisation). ``heartbeat``, ``arrow_shuffle``
and ``spark_plugin`` import it; it imports none of them."""
