"""Producer / consumer processes for the multi-process tests and the benchmark.

``produce <map> <reducers> <rows> <buffer_size> [endless]``: host one partition, print the
server address as JSON, write ``rows`` rows (or forever), then serve until stdin closes.
``consume <reduce> <buffer_size> <json addresses> <out.arrow>``: read subpartition ``reduce``
of every producer, write the rows to ``out.arrow``; print ``DATA`` after the first batch and
``ERROR <type>`` on failure.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa

from arrow_shuffle import (
    InputGate,
    NetworkBufferPool,
    PartitionId,
    PartitionServer,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleError,
)

SECRET = "mp-secret"
APP = "mp-app"
SCHEMA = pa.schema([("key", pa.int64()), ("map", pa.int64()), ("seq", pa.int64())])


def config(buffer_size: int) -> ShuffleConfig:
    return ShuffleConfig(
        buffer_size=buffer_size,
        network_memory_bytes=64 * buffer_size,
        keepalive_interval_s=0.5,
        peer_timeout_s=2.0,
        flush_timeout_s=0.01,
    )


def rows_of(map_index: int, start: int, rows: int) -> pa.RecordBatch:
    seq = np.arange(start, start + rows, dtype=np.int64)
    return pa.record_batch(
        [pa.array(seq * 31 + map_index), pa.array(np.full(rows, map_index)), pa.array(seq)], schema=SCHEMA
    )


def produce(map_index: int, reducers: int, rows: int, buffer_size: int, endless: bool) -> None:
    cfg = config(buffer_size)
    pool = NetworkBufferPool.from_config(cfg.network_memory_bytes, cfg.buffer_size)
    server = PartitionServer(SECRET, APP, config=cfg)
    pid = PartitionId(APP, 0, map_index)
    partition = ResultPartition(pid, reducers, SCHEMA, pool, config=cfg)
    server.register(partition)
    print(json.dumps({"address": list(server.address), "map": map_index}), flush=True)
    writer = RecordWriter(partition, key_columns=["key"])
    start = 0
    step = 4096
    try:
        while endless or start < rows:
            n = step if endless else min(step, rows - start)
            writer.write(rows_of(map_index, start, n))
            start += n
        writer.finish()
    except ShuffleError as exc:
        print(f"PRODUCER-ERROR {type(exc).__name__}", flush=True)
    sys.stdin.read()  # serve until the parent closes our stdin
    server.close()


def consume(reduce_index: int, buffer_size: int, addresses: list[list[object]], out: str) -> None:
    cfg = config(buffer_size)
    pool = NetworkBufferPool.from_config(cfg.network_memory_bytes, cfg.buffer_size)
    specs = [
        RemoteChannelSpec((str(a[0]), int(str(a[1]))), PartitionId(APP, 0, m), reduce_index)
        for m, a in enumerate(addresses)
    ]
    batches: list[pa.RecordBatch] = []
    try:
        with InputGate(specs, SCHEMA, pool, cfg, secret=SECRET) as gate:
            for batch in gate:
                if not batches:
                    print("DATA", flush=True)
                batches.append(batch)
    except ShuffleError as exc:
        print(f"ERROR {type(exc).__name__} {exc}", flush=True)
        return
    with pa.OSFile(out, "wb") as sink, pa.ipc.new_file(sink, SCHEMA) as file:
        for batch in batches:
            file.write_batch(batch)
    print(f"DONE {sum(b.num_rows for b in batches)}", flush=True)


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "produce":
        produce(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), len(sys.argv) > 6)
    else:
        consume(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5])
