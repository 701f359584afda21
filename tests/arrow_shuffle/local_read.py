"""A test-only reader of a partition object in this process: no server, no socket, no credit.

The engine hands a subpartition to a reader only through a ``PartitionServer``; tests of the
producer side (routing, coalescing, backpressure, queued reservations) read the subpartition's
queue directly, as the server's stream sender does, and decode what they get.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from arrow_shuffle.codec import decode_buffer
from arrow_shuffle.partition import ResultPartition


def read_subpartition(partition: ResultPartition, index: int, timeout_s: float = 30.0) -> pa.Table:
    """Every row of ``partition.subpartitions[index]`` until end-of-partition (each buffer goes back
    to the partition's pool as it is decoded). A reader that stops early (an error, or nothing for
    ``timeout_s``: ``TimeoutError``) releases the subpartition, as the server does for a stream."""
    sub = partition.subpartitions[index]
    where = f"{partition.partition_id}#{index} (read in process)"
    ready = threading.Event()
    sub.attach_reader(ready.set)
    batches: list[pa.RecordBatch] = []
    ended = False
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            ready.clear()
            buffer, _backlog, end = sub.poll()
            if buffer is not None:
                batches += decode_buffer(buffer, partition.schema, where)
            elif end:
                ended = True
                break
            elif not ready.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"nothing arrived on {where} within {timeout_s}s")
    finally:
        sub.detach_reader()
        if not ended:
            sub.release()
    return pa.Table.from_batches(batches, schema=partition.schema)
