"""Shared fixtures: an RM on 127.0.0.1 with fast heartbeats, and an event collector."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from heartbeat import HeartbeatServices

from .fakes import ServedRm, served_rm

FAST = HeartbeatServices(interval_s=0.1, timeout_s=0.5, rpc_failure_threshold=2)
SECRET = "test-secret"
# The longest a test waits for something the protocol does within an interval or a timeout. It is
# a deadline, not a latency bound: generous, so a loaded 2-core machine does not fail the test;
# latency figures are the benchmarks' (benchmarks/detection_latency.py).
DEADLINE_S = 30.0
STEADY = HeartbeatServices(interval_s=0.1, timeout_s=DEADLINE_S, rpc_failure_threshold=2)
"""For tests that assert a registered agent stays RUNNING (a view, a listing, a sequence of
events): heartbeats as often as FAST, but a timeout no loaded machine reaches. FAST's 0.5 s is for
tests that wait for a timeout: with both cores busy (``make test`` runs the Spark shards beside the
JVM-less tests) a thread of this process can miss 0.5 s, and a RUNNING agent then times out."""


@pytest.fixture
def rm() -> Iterator[ServedRm]:
    with served_rm(FAST, SECRET) as served:
        yield served
