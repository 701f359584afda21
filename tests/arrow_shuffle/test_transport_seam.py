"""The engine over an in-memory transport: same protocol, no TCP."""

from __future__ import annotations

import socket
import threading

import pytest

from arrow_shuffle import (
    InputGate,
    NetworkBufferPool,
    PartitionId,
    PartitionServer,
    PeerLostError,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleError,
)
from arrow_shuffle.remote_channel import RemoteInputChannel

from .conftest import APP, SCHEMA, SECRET, make_batch
from .memory_transport import MemoryTransport


def test_exchange_over_the_transport_seam(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    transport = MemoryTransport()
    server = PartitionServer(SECRET, APP, config=config, transport=transport)
    roomy = config.replace(buffers_per_subpartition=32)  # room for all of it: written before it is read
    part = ResultPartition(PartitionId(APP, 1, 0), 2, SCHEMA, pool, config=roomy)
    server.register(part)
    writer = RecordWriter(part, key_columns=["key"])
    for start in range(0, 6000, 600):
        writer.write(make_batch(start, 600))
    writer.finish()
    specs = [RemoteChannelSpec(server.address, part.partition_id, s) for s in range(2)]
    with InputGate(specs, SCHEMA, pool, config, secret=SECRET, transport=transport) as gate:
        seqs = sorted(gate.read_all().column("seq").to_pylist())
    assert seqs == list(range(6000))
    assert len(transport.connections) == 2
    server.close()
    assert pool.num_available == pool.num_segments


def test_severing_one_stream_fails_only_its_gate(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    transport = MemoryTransport()
    server = PartitionServer(SECRET, APP, config=config, transport=transport)
    parts = [ResultPartition(PartitionId(APP, 2, m), 1, SCHEMA, pool, config=config) for m in range(2)]
    writers = [RecordWriter(p) for p in parts]
    for p in parts:
        server.register(p)

    def produce(writer: RecordWriter) -> None:
        try:
            for start in range(0, 400_000, 1000):
                writer.write(make_batch(start, 1000))
            writer.finish()
        except ShuffleError:
            writer.abort()

    threads = [threading.Thread(target=produce, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    gates = [
        InputGate(
            [RemoteChannelSpec(server.address, p.partition_id, 0)], SCHEMA, pool, config, SECRET, transport
        )
        for p in parts
    ]
    iters = [iter(g) for g in gates]
    first = [next(it) for it in iters]
    channel = gates[0].channels[0]
    assert isinstance(channel, RemoteInputChannel)
    index = transport.connections.index(channel._conn)  # type: ignore[arg-type]
    transport.server_ends[index].shutdown(socket.SHUT_RDWR)  # the producer's end vanishes
    with pytest.raises(PeerLostError):
        for _ in iters[0]:
            pass
    rows = first[1].num_rows + sum(b.num_rows for b in iters[1])  # the other stream completes
    assert rows == 400_000
    for g in gates:
        g.close()
    for t in threads:
        t.join(10)
    server.close()
    assert pool.num_available == pool.num_segments
