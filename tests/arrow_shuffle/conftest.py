"""Shared fixtures: small pools and configs, servers closed in teardown."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from arrow_shuffle import NetworkBufferPool, PartitionServer, ShuffleConfig

SCHEMA = pa.schema([("key", pa.int64()), ("seq", pa.int64()), ("payload", pa.string())])
SECRET = "test-secret"
APP = "app-1"


def make_batch(start: int, rows: int, key_mod: int = 97, payload_len: int = 8) -> pa.RecordBatch:
    seq = np.arange(start, start + rows, dtype=np.int64)
    keys = (seq * 7919) % key_mod
    payload = pa.array(["x" * payload_len] * rows)
    return pa.record_batch([pa.array(keys), pa.array(seq), payload], schema=SCHEMA)


@pytest.fixture
def config() -> ShuffleConfig:
    return ShuffleConfig(
        buffer_size=16 * 1024,
        network_memory_bytes=8 << 20,
        flush_timeout_s=0.02,
        keepalive_interval_s=0.2,
        peer_timeout_s=2.0,
        buffer_request_timeout_s=10.0,
    )


@pytest.fixture
def pool(config: ShuffleConfig) -> Iterator[NetworkBufferPool]:
    network = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    yield network


@pytest.fixture
def server(config: ShuffleConfig) -> Iterator[PartitionServer]:
    srv = PartitionServer(SECRET, APP, config=config)
    yield srv
    srv.close()
