"""Arrow IPC encoding of record batches into pooled buffers, and decoding them back.

A buffer payload is a complete Arrow IPC stream (schema, batches, end-of-stream marker) written
straight into the segment's memory: one copy on the producer, none extra on the wire. Decoding
copies the payload once into Arrow-allocated memory (pooled by Arrow's allocator) so the network
segment is recycled immediately and callers may keep the batches as long as they like.
"""

from __future__ import annotations

import ctypes

import pyarrow as pa

from arrow_shuffle.buffer_pool import Buffer
from arrow_shuffle.errors import CorruptFrameError, RecordTooLargeError, SchemaMismatchError

_SLACK = 64  # IPC continuation marker, padding and end-of-stream marker


def batch_size(batch: pa.RecordBatch) -> int:
    """Serialized size of ``batch`` (metadata and padding included)."""
    return int(pa.ipc.get_record_batch_size(batch))


def schema_size(schema: pa.Schema) -> int:
    return int(schema.serialize().size) + _SLACK


class BufferBuilder:
    """An open buffer that record batches are appended to until it is full or flushed."""

    def __init__(self, buffer: Buffer, schema: pa.Schema) -> None:
        self.buffer = buffer
        self._sink = pa.FixedSizeBufferWriter(buffer.segment.memory)
        self._writer = pa.ipc.new_stream(self._sink, schema)
        self.num_batches = 0
        self.num_rows = 0

    @property
    def remaining(self) -> int:
        return self.buffer.capacity - int(self._sink.tell()) - _SLACK

    def append(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self.num_batches += 1
        self.num_rows += batch.num_rows

    def finish(self) -> Buffer:
        self._writer.close()
        self.buffer.size = int(self._sink.tell())
        self._sink.close()
        return self.buffer

    def abandon(self) -> None:
        """Return the segment without producing a buffer (error / cancel path)."""
        self.buffer.recycle()


def split_to_fit(batch: pa.RecordBatch, max_bytes: int) -> list[pa.RecordBatch]:
    """Slice ``batch`` into row ranges whose serialized size is at most ``max_bytes``."""
    if batch_size(batch) <= max_bytes:
        return [batch]
    if batch.num_rows <= 1:
        raise RecordTooLargeError(
            f"a single row serializes to {batch_size(batch)} bytes, more than a buffer holds "
            f"({max_bytes} usable); raise buffer_size"
        )
    pieces: list[pa.RecordBatch] = []
    offset = 0
    rows_per_piece = max(1, int(batch.num_rows * max_bytes / batch_size(batch) * 0.9))
    while offset < batch.num_rows:
        piece = batch.slice(offset, rows_per_piece)
        if batch_size(piece) > max_bytes:
            if rows_per_piece == 1:
                raise RecordTooLargeError(
                    f"row {offset} serializes to {batch_size(piece)} bytes, more than a buffer holds "
                    f"({max_bytes} usable); raise buffer_size"
                )
            rows_per_piece = max(1, rows_per_piece // 2)
            continue
        pieces.append(piece)
        offset += piece.num_rows
    return pieces


def decode_buffer(buffer: Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    """Decode ``buffer`` into batches in Arrow memory and recycle it at once (its credit returns).

    Always a copy: batches that viewed the network buffer would pin it, and a consumer holding a
    batch a moment too long (``enumerate`` caches the previous item!) then starves the channel
    of credit or a BLOCKING reader of its spill buffer. The property tests found exactly that.
    """
    owned = pa.allocate_buffer(buffer.size)
    # ctypes releases the GIL for the copy, so the receiver thread keeps reading meanwhile.
    ctypes.memmove(owned.address, buffer.segment.memory.address, buffer.size)
    buffer.recycle()
    return _read(owned, schema, where)


def decode(payload: memoryview | pa.Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    """Decode one buffer payload into batches owned by Arrow memory (copied out of the segment)."""
    owned = pa.allocate_buffer(len(payload) if isinstance(payload, memoryview) else payload.size)
    memoryview(owned)[:] = payload
    return _read(owned, schema, where)


def _read(owned: pa.Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    try:
        reader = pa.ipc.open_stream(owned)
        got = reader.schema
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        raise CorruptFrameError(f"buffer payload is not a valid Arrow IPC stream {where}: {exc}") from exc
    if not got.equals(schema):
        raise SchemaMismatchError(f"received schema {got} differs from the partition's {schema} {where}")
    return batches
