"""Batches as a reduce task receives them, for tests of what it does with them."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa


def decoded(slices: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``slices`` as a reduce task receives a stream's batches: decoded from one IPC stream, each
    batch over buffers of its own sized to it, all of them slices of the stream's one buffer.

    A reduce task counts what it holds by its batches' buffers (``row_buckets.held_bytes``), and
    a slice's buffers are its whole table's: slices of one table would count it once per slice."""
    if not slices:
        return []
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, slices[0].schema) as writer:
        for batch in slices:
            writer.write_batch(batch)
    return list(pa.ipc.open_stream(sink.getvalue()))


def read_as_reducer(table: pa.Table, rows: int) -> list[pa.RecordBatch]:
    """``table`` in batches of at most ``rows`` rows, as a reduce task receives them."""
    return decoded(table.to_batches(max_chunksize=rows))


def decoded_apart(slices: Sequence[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """``slices`` as a reduce task reads them from map-output files: each decoded from IPC bytes
    of its own (a segment's), so that keeping one batch keeps no other's memory."""
    return [batch for one in slices for batch in decoded([one])]
