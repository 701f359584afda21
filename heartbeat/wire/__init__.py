"""What crosses the network between the RM and its agents: the protobuf messages (``proto``) and
their conversions (``codec``), the shared-secret proof (``auth``), channels and ports with TLS
(``transport``), text made safe to log (``text``) and the process's asyncio loop (``io_loop``)."""
