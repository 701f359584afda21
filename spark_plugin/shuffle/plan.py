"""A materialized shuffle's plan: made on the driver, shipped inside every map and reduce task.

``ShufflePlan`` says where the shuffle's files go and who may read them (application, shuffle
id, schema, keys, secret, TLS material, settings); the status rows' schema (``STATUS_SCHEMA``) is
what a map task emits per reduce partition and what Spark's own shuffle carries to the reducers.
TLS transports are built once per application's material in a reused Python worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrow_shuffle.transport import TcpTransport, Transport
from spark_plugin.settings.tls import TlsMaterial, client_context, server_context

STATUS_SCHEMA = pa.schema(
    [
        ("rk", pa.int64()),
        ("reduce", pa.int32()),
        ("map", pa.int32()),
        ("attempt", pa.string()),
        ("executor", pa.string()),
        ("host", pa.string()),
        ("data_port", pa.int32()),
        ("control_port", pa.int32()),
        ("path", pa.string()),
        ("segments", pa.string()),
        ("bytes", pa.int64()),
        ("batches", pa.int64()),
        ("rows", pa.int64()),
        ("spill_bytes", pa.int64()),
        ("seconds", pa.float64()),
    ]
)
"""One row per (map partition, reduce partition). ``spill_bytes`` and ``seconds`` are the map
task's own, repeated on each of its rows: with the others they make its write report where no
accumulator carries one (``write_reports``)."""


STATUS_DDL = (
    "rk bigint, reduce int, map int, attempt string, executor string, host string, data_port int, "
    "control_port int, path string, segments string, bytes bigint, batches bigint, rows bigint, "
    "spill_bytes bigint, seconds double"
)


CARRIER_SCHEMA = pa.schema(
    [
        ("carrier", pa.string()),
        ("carrier_host", pa.string()),
        ("carrier_port", pa.int32()),
        ("map_stage", pa.int64()),
    ]
)
"""Where a status row was shuffled from (``carry_function``): the executor, and its agent's host and
control port; and the stage of the map job that wrote the shuffle (a row whose attempt names a later
stage was written by a recomputation). Absent, the row was shuffled by the map task itself, from
the executor it names."""


CARRIED_DDL = STATUS_DDL + ", carrier string, carrier_host string, carrier_port int, map_stage bigint"


@dataclass(frozen=True)
class ShufflePlan:
    """Everything a task needs, shipped in the task closure (the secret included: it only
    reaches executors of this application, as Spark's own auth secret does)."""

    app_id: str
    shuffle_id: int
    root: str
    """``spark.arrowbeat.shuffle.dir`` as configured ("" for the default), resolved by each task
    with ``shuffle_roots`` on its own executor."""
    secret: str = field(repr=False)  # repr and str never show it (issue 13)
    """Empty in a plan made from a Spark Connect session: its tasks ask their agent (``keyed``)."""
    key_columns: tuple[str, ...]
    num_partitions: int
    schema_ipc: bytes
    route_keys: tuple[int, ...]
    memory_bytes: int = 8 << 20
    """``spark.arrowbeat.shuffle.mapMemory``: a map task writes a run past it (``MapOutputWriter``)."""
    reduce_memory_bytes: int = 512 << 20
    """``spark.arrowbeat.shuffle.reduceMemory``: a grouped reduce task spills past it (``reduce_spill``)."""
    buffer_size: int = 1 << 20
    read_host_local: bool = True
    """Read map outputs of other executors on the same host from disk (``reads_from_disk``)."""
    checksum: bool = True
    """``spark.arrowbeat.shuffle.checksum``: map outputs carry checksums that every reader verifies."""
    hot_key_last: bool = False
    """A grouped call's shuffle: map outputs put a hot key's rows last in their partition
    (``key_buckets``), where the reduce side takes them as slices, not copies."""
    lost_wait_s: float = 5.0
    """How long a reduce task that found map outputs lost waits for their executor to go before
    failing (``lost_outputs``): Spark's ``spark.shuffle.io.retryWait``."""
    tls: TlsMaterial | None = field(default=None, repr=False)
    """``spark.arrowbeat.ssl.*`` on: what tasks rebuild their SSL contexts from (an
    ``ssl.SSLContext`` cannot be pickled). Holds the key (pipelined map tasks serve their output):
    as secret as ``secret``, never in a repr."""

    @property
    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema_ipc))


def client_transport(plan: ShufflePlan) -> Transport | None:
    """How a task connects to agents and to other tasks: TLS when the plan carries material."""
    return None if plan.tls is None else _client_transport(plan.tls)


def server_transport(plan: ShufflePlan) -> Transport | None:
    """How a pipelined map task accepts its readers: TLS when the plan carries material."""
    return None if plan.tls is None else _server_transport(plan.tls)


@functools.lru_cache(maxsize=4)  # one per application's material in a reused Python worker
def _client_transport(material: TlsMaterial) -> TcpTransport:
    return TcpTransport(client_context=client_context(material), server_name=material.server_name)


@functools.lru_cache(maxsize=4)
def _server_transport(material: TlsMaterial) -> TcpTransport:
    return TcpTransport(server_context=server_context(material))


Report = Callable[[dict[str, Any]], None]


def unreported(row: dict[str, Any]) -> None:
    """The ``Report`` of a plan whose reports nobody collects (Spark Connect: no accumulators)."""
