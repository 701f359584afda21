"""Arrow IPC encoding of record batches into pooled buffers, and decoding them back.

A buffer payload is a complete Arrow IPC stream (schema, batches, end-of-stream marker). Small
batches are coalesced by copying them into a segment (``BufferBuilder``). A batch that fills a
buffer on its own is not copied: ``encode_parts`` lists its IPC stream as metadata bytes plus views
of the batch's own Arrow buffers, which the sender hands to ``sendmsg`` (an ``ArrowPayload``).

A receiver reads each large payload straight into Arrow memory (``ReceiveBlocks``, held by an
``ArrowPayload`` again), and decoding builds the batches over that memory without a copy: the
batches own it, the network segment (the credit) is recycled at once, and callers may keep the
batches as long as they like. Batches never view a segment: that pinned buffers and starved
channels of credit (see ``decode_buffer``); a small payload is received into its segment and
copied out.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import TypeAlias

import pyarrow as pa

from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, Segment
from arrow_shuffle.errors import (
    BufferAccountingError,
    CorruptFrameError,
    RecordTooLargeError,
    SchemaMismatchError,
)

_SLACK = 64  # IPC continuation marker, padding and end-of-stream marker
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
"""The current IPC format, decided once (``new_stream`` without options reads two environment
variables for legacy formats on every call)."""


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
        self._writer = pa.ipc.new_stream(self._sink, schema, options=_WRITE_OPTIONS)
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


Part: TypeAlias = "bytes | pa.Buffer"
"""A piece of a payload held outside a segment: IPC metadata bytes or a view of Arrow memory."""


class _ReturnLease:
    """The recycler of an ``ArrowPayload``: recycling it recycles the lease it was made from."""

    __slots__ = ("lease",)

    def __init__(self, lease: Buffer) -> None:
        self.lease = lease

    def recycle_segment(self, segment: Segment) -> None:
        self.lease.recycle()


class ArrowPayload(Buffer):
    """A pool lease whose payload is not in its segment but in ``parts`` (Arrow memory).

    The lease still counts: it is the receiver's credit, or the producer's share of the partition
    pool a queued buffer takes, so credit and backpressure stay exactly as for a copied buffer;
    the segment's memory is simply not used (except as scratch by a transport that cannot gather
    pieces, TLS), so nothing may read the payload from ``segment.view`` (nothing in the engine
    does: its partitions never spill). ``recycle()`` drops the parts (and with them the references
    to the batch's memory) and returns the lease, exactly once."""

    __slots__ = ("parts",)

    def __init__(self, lease: Buffer, parts: Sequence[Part], size: int) -> None:
        super().__init__(lease.segment, _ReturnLease(lease), size)
        self.parts: list[Part] = list(parts)

    def recycle(self) -> None:
        self.parts = []
        super().recycle()


class _Collector:
    """A write-only file for ``pa.PythonFile``: Arrow's IPC writer hands it metadata as ``bytes``
    and body buffers as ``pa.Buffer`` views of the batch's memory (zero-copy); kept in order, with
    adjacent metadata merged (fewer pieces for ``sendmsg``)."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.size = 0

    def write(self, data: bytes | pa.Buffer) -> int:
        n = len(data) if isinstance(data, bytes) else data.size
        if n == 0:
            return 0
        if isinstance(data, bytes) and self.parts and isinstance(self.parts[-1], bytes):
            self.parts[-1] += data
        else:
            self.parts.append(data)
        self.size += n
        return n

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def encode_parts(lease: Buffer, batch: pa.RecordBatch, schema: pa.Schema) -> ArrowPayload | None:
    """``batch`` as one buffer payload without copying its data: the IPC stream's pieces, views of
    the batch's buffers where Arrow allows, held by an ``ArrowPayload`` on ``lease`` until sent.
    ``None`` if the stream would not fit the lease's capacity (the receiver's frame limit); the
    caller then copies it as usual."""
    sink = _Collector()
    with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), schema, options=_WRITE_OPTIONS) as writer:
        writer.write_batch(batch)
    if sink.size > lease.capacity:
        return None
    return ArrowPayload(lease, sink.parts, sink.size)


_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
"""The IPC stream's end marker (continuation, then a zero metadata length)."""


def _has_dictionaries(schema: pa.Schema) -> bool:
    return any(pa.types.is_dictionary(field.type) for field in schema)


class PayloadEncoder:
    """``encode_parts`` for one schema, with one IPC writer kept open across payloads.

    Opening a stream writer per batch cost 22 µs, more than the rest of a direct write: the
    schema message is the same for every payload, and a stream writer's only state across batches
    is which dictionaries it sent. So for a schema without dictionary fields one writer serves
    every payload: the schema's message is put in front of each batch's pieces and the end marker
    after them, the same bytes as a fresh stream (4-6 µs). A schema with dictionaries, whose
    payloads must each carry them, is encoded as a fresh stream every time."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._sink = _Collector()  # what the kept writer writes into
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._head = b""
        self._reusable = not _has_dictionaries(schema)

    def encode(self, lease: Buffer, batch: pa.RecordBatch) -> ArrowPayload | None:
        """As ``encode_parts(lease, batch, schema)``."""
        if self._writer is None:
            return self._first(lease, batch)
        sink = self._sink
        try:
            self._writer.write_batch(batch)
        except BaseException:
            self._writer = None  # its state is unknown now: the next payload opens another
            raise
        parts, size = sink.parts, sink.size + len(self._head)
        sink.parts, sink.size = [], 0
        if parts and isinstance(parts[0], bytes):
            parts[0] = self._head + parts[0]
        else:
            parts.insert(0, self._head)
        return _ended(lease, parts, size)

    def _first(self, lease: Buffer, batch: pa.RecordBatch) -> ArrowPayload | None:
        """A payload from a writer opened for it. The writer is kept for the next payloads when
        its stream began with the schema's own message (written with the first batch); else every
        payload is a stream of its own, as ``encode_parts`` makes."""
        if not self._reusable:
            return encode_parts(lease, batch, self.schema)
        sink = _Collector()
        writer = pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), self.schema, options=_WRITE_OPTIONS)
        writer.write_batch(batch)
        head = self.schema.serialize().to_pybytes()
        first = sink.parts[0] if sink.parts else b""
        if isinstance(first, bytes) and first.startswith(head):
            self._writer, self._head, self._sink = writer, head, sink
            parts, size = sink.parts, sink.size
            sink.parts, sink.size = [], 0
            return _ended(lease, parts, size)
        self._reusable = False  # never seen: a writer that did not begin with the schema's message
        return encode_parts(lease, batch, self.schema)


def _ended(lease: Buffer, parts: list[Part], size: int) -> ArrowPayload | None:
    """A payload of ``parts`` (``size`` bytes) and the end-of-stream marker, if ``lease`` holds it."""
    if isinstance(parts[-1], bytes):
        parts[-1] += _END_OF_STREAM
    else:
        parts.append(_END_OF_STREAM)
    size += len(_END_OF_STREAM)
    if size > lease.capacity:
        return None
    return ArrowPayload(lease, parts, size)


_CONSUMER_HELD = 1
"""Blocks a gate's consumer holds beyond its channels' credit: the payload it is reading."""


class ReceiveBlocks:
    """Memory that large received payloads go into, reused once no batch references it.

    A payload of at least half a block is received into a block (``block_size`` bytes of Arrow's
    allocator) and handed to Arrow as a ``pa.foreign_buffer`` whose base is a ``_Lent`` marker:
    the decoded batches view the block, and when the last reference to it is gone (Arrow's own
    reference count) the marker's finaliser puts the block back here, up to ``keep`` idle blocks
    (the channels' credit, as many as can be in flight, and one more: the payload the consumer is
    reading once its credit is back on the wire; with one fewer, a block is dropped whenever the
    consumer catches up and allocated again at the next peak). The credit itself returns at
    decode, as ever, so a consumer that keeps its batches holds blocks, never credit.

    Why not a fresh ``pa.allocate_buffer`` per payload: the receiving thread would allocate and
    the consumer's thread free, which pyarrow's default allocator (mimalloc) turns into growing
    memory (measured: 490 MiB peak for 22 MiB live with four receiving threads). One cache per
    gate (``blocks_for``): its channels share the gate's floating pool, so they share blocks too.
    """

    def __init__(self, block_size: int, floating: int) -> None:
        self.block_size = block_size
        self._floating = floating
        self._free: deque[pa.Buffer] = deque()  # lock-free: finalisers run in any thread, any time
        self._lock = threading.Lock()  # only for joining and leaving (never taken by a finaliser)
        self._credit = 0
        self._members = 0
        self.keep = 0
        self.allocated = 0
        """Blocks ever allocated (a test sees reuse: far fewer than payloads received)."""

    def join(self, credit: int) -> None:
        """A channel with ``credit`` exclusive buffers starts receiving through this cache."""
        with self._lock:
            self._members += 1
            self._credit += credit
            self.keep = self._credit + self._floating + _CONSUMER_HELD

    def leave(self, credit: int) -> None:
        """The channel is closed: keep fewer idle blocks (none once every channel left)."""
        with self._lock:
            self._members -= 1
            self._credit -= credit
            self.keep = self._credit + self._floating + _CONSUMER_HELD if self._members > 0 else 0
        self._trim()

    def receive(self, length: int, fill: Callable[[memoryview], None]) -> pa.Buffer:
        """``length`` bytes written by ``fill`` into a block, as an immutable Arrow buffer that
        returns the block here when the last batch viewing it is gone."""
        try:
            block = self._free.pop()
        except IndexError:
            block = pa.allocate_buffer(self.block_size)
            self.allocated += 1
        try:
            fill(memoryview(block).cast("B")[:length])
        except BaseException:
            self.give_back(block)
            raise
        return pa.foreign_buffer(block.address, length, base=_Lent(self, block))

    def give_back(self, block: pa.Buffer) -> None:
        if len(self._free) < self.keep:
            self._free.append(block)

    @property
    def idle(self) -> int:
        return len(self._free)

    def _trim(self) -> None:
        while len(self._free) > self.keep:
            try:
                self._free.pop()
            except IndexError:
                return


class _Lent:
    """The base object of a block lent to Arrow: collected when nothing views the block anymore."""

    __slots__ = ("block", "blocks")

    def __init__(self, blocks: ReceiveBlocks, block: pa.Buffer) -> None:
        self.blocks = blocks
        self.block = block

    def __del__(self) -> None:
        try:
            self.blocks.give_back(self.block)
        except Exception:  # interpreter shutdown: nothing left to give back to
            return


_GATE_BLOCKS: weakref.WeakKeyDictionary[LocalBufferPool, ReceiveBlocks] = weakref.WeakKeyDictionary()
_GATE_BLOCKS_LOCK = threading.Lock()


def blocks_for(floating: LocalBufferPool, block_size: int) -> ReceiveBlocks:
    """The receive blocks of the gate whose floating buffers are ``floating`` (one per gate)."""
    with _GATE_BLOCKS_LOCK:
        blocks = _GATE_BLOCKS.get(floating)
        if blocks is None or blocks.block_size != block_size:
            blocks = ReceiveBlocks(block_size, floating.max_segments)
            _GATE_BLOCKS[floating] = blocks
        return blocks


def split_to_fit(batch: pa.RecordBatch, max_bytes: int) -> list[tuple[pa.RecordBatch, int]]:
    """Slice ``batch`` into row ranges whose serialized size is at most ``max_bytes``; each with
    that size (measuring walks every buffer: done once)."""
    whole = batch_size(batch)
    if whole <= max_bytes:
        return [(batch, whole)]
    if batch.num_rows <= 1:
        raise RecordTooLargeError(
            f"a single row serializes to {whole} bytes, more than a buffer holds "
            f"({max_bytes} usable); raise buffer_size"
        )
    pieces: list[tuple[pa.RecordBatch, int]] = []
    offset = 0
    rows_per_piece = max(1, int(batch.num_rows * max_bytes / whole * 0.9))
    while offset < batch.num_rows:
        piece = batch.slice(offset, rows_per_piece)
        size = batch_size(piece)
        if size > max_bytes:
            if rows_per_piece == 1:
                raise RecordTooLargeError(
                    f"row {offset} serializes to {size} bytes, more than a buffer holds "
                    f"({max_bytes} usable); raise buffer_size"
                )
            rows_per_piece = max(1, rows_per_piece // 2)
            continue
        pieces.append((piece, size))
        offset += piece.num_rows
    return pieces


def decode_buffer(buffer: Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    """Decode ``buffer`` into batches in Arrow memory and recycle it at once (its credit returns).

    Batches never view a segment: batches that viewed the network buffer would pin it, and a
    consumer holding a batch a moment too long (``enumerate`` caches the previous item!) then
    starves the channel of credit; the property tests found exactly that. So a payload in a
    segment is copied out once; a payload a remote channel received into Arrow memory (an
    ``ArrowPayload`` of one ``pa.Buffer``) is decoded in place, no copy: the batches own that
    memory, nothing else uses it.
    """
    owned = _owned(buffer)
    buffer.recycle()
    return _read(owned, schema, where)


def _owned(buffer: Buffer) -> pa.Buffer:
    """``buffer``'s payload as Arrow memory that no pool will reuse."""
    if isinstance(buffer, ArrowPayload):
        parts = buffer.parts
        if len(parts) == 1 and isinstance(parts[0], pa.Buffer) and parts[0].size == buffer.size:
            return parts[0]
        owned = pa.allocate_buffer(buffer.size)
        offset = 0
        for part in parts:  # a producer's pieces, read back in its own process (tests read so)
            n = part.size if isinstance(part, pa.Buffer) else len(part)
            if offset + n > buffer.size:
                raise BufferAccountingError(f"payload pieces exceed its size {buffer.size}")
            ctypes.memmove(owned.address + offset, part.address if isinstance(part, pa.Buffer) else part, n)
            offset += n
        return owned
    owned = pa.allocate_buffer(buffer.size)
    # ctypes releases the GIL for the copy, so the receiver thread keeps reading meanwhile.
    ctypes.memmove(owned.address, buffer.segment.memory.address, buffer.size)
    return owned


def decode(payload: memoryview | pa.Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    """Decode one buffer payload into batches owned by Arrow memory (copied out of the segment)."""
    owned = pa.allocate_buffer(len(payload) if isinstance(payload, memoryview) else payload.size)
    memoryview(owned)[:] = payload
    return _read(owned, schema, where)


_SCHEMA_MESSAGES: dict[int, tuple[pa.Schema, pa.Buffer | None]] = {}
_SCHEMA_MESSAGES_MAX = 64


def _schema_message(schema: pa.Schema) -> pa.Buffer | None:
    """The IPC message a payload of ``schema`` begins with; ``None`` for a schema with
    dictionaries (its payloads carry them: read as whole streams). Kept by the schema object's
    identity (a gate decodes every payload against one): hashing a schema walks its fields in
    Python, 39 µs for 40 columns, more than the read it saves."""
    found = _SCHEMA_MESSAGES.get(id(schema))
    if found is not None and found[0] is schema:
        return found[1]
    message = None if _has_dictionaries(schema) else schema.serialize()
    if len(_SCHEMA_MESSAGES) >= _SCHEMA_MESSAGES_MAX:
        _SCHEMA_MESSAGES.clear()
    _SCHEMA_MESSAGES[id(schema)] = (schema, message)  # the schema held: its id is not reused
    return message


def _read(owned: pa.Buffer, schema: pa.Schema, where: str) -> list[pa.RecordBatch]:
    """The batches of one payload (a whole IPC stream). When the payload begins with exactly our
    schema's message, its batch messages are read one by one against the schema we hold (6 µs for
    a 1 MiB payload, where opening a stream reader takes 13); anything else, a schema we do not
    expect included, is read as a stream and checked field by field."""
    head = _schema_message(schema)
    if head is not None and owned.size > head.size and owned.slice(0, head.size).equals(head):
        try:
            reader = pa.BufferReader(owned)
            reader.seek(head.size)
            batches = []
            end = owned.size - len(_END_OF_STREAM)
            while reader.tell() < end:
                batches.append(pa.ipc.read_record_batch(pa.ipc.read_message(reader), schema))
            if reader.tell() == end and owned.slice(end).to_pybytes() == _END_OF_STREAM:
                return batches
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError, TypeError):
            pass  # not what we expected: read it as a stream, which names the problem
    try:
        reader = pa.ipc.open_stream(owned)
        got = reader.schema
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
        raise CorruptFrameError(f"buffer payload is not a valid Arrow IPC stream {where}: {exc}") from exc
    if not got.equals(schema):
        raise SchemaMismatchError(f"received schema {got} differs from the partition's {schema} {where}")
    return batches
