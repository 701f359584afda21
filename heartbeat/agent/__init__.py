"""The executor-side agent (Flink's TaskExecutor end): its transport-free core (``core``), the gRPC
agent (``async_agent``) and its registered stream (``session``), a thread for sync callers
(``thread``), what it says without its RM (``outage``) and a stand-alone process (``main``)."""
