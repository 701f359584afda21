"""Shared fixtures: an RM on 127.0.0.1 with fast heartbeats, and an event collector."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from heartbeat import HeartbeatServices, ResourceManagerServer

from .fakes import Collector

FAST = HeartbeatServices(interval_s=0.1, timeout_s=0.5, rpc_failure_threshold=2)
SECRET = "test-secret"
# The longest a test waits for something the protocol does within an interval or a timeout. It is
# a deadline, not a latency bound: generous, so a loaded 2-core machine does not fail the test;
# latency figures are the benchmarks' (benchmarks/detection_latency.py).
DEADLINE_S = 30.0


@pytest.fixture
def rm() -> Iterator[tuple[ResourceManagerServer, str, Collector]]:
    server = ResourceManagerServer(FAST, secret=SECRET)
    collector = Collector()
    server.subscribe(collector)
    address = server.start()
    try:
        yield server, address, collector
    finally:
        server.stop(grace_s=0.2)
