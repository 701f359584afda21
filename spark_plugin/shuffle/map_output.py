"""Materialized map outputs: one Arrow IPC file per map task attempt, one set of segments per reducer.

Why files and not the engine's BLOCKING ``ResultPartition`` (memory, then spill) in the agent,
although both are "materialized" results in Flink's sense: a map task runs in a Spark Python
worker, which may exit after the task; its output must outlive it and be readable *more than
once* (a reduce task that fails half-way is retried and reads again, and an engine subpartition
is consumed by its single reader). Spark's external-shuffle-service model gives both: the worker
writes its output to the executor agent's directory, the agent's ``MapOutputService``
(``agent_service``) streams it to reduce tasks that do not read the file themselves and deletes it
on release, TTL or exit; reduce tasks on the same host read it themselves (``tasks``).

Layout (``map_output_format``): a header, which holds the schema once, then a sequence of
*runs*. A run holds, for each reduce partition with data, one *segment*: that partition's rows as
Arrow IPC record-batch messages, decoded against the header's schema (files of the previous
format, whose every segment is a whole IPC stream with its own schema, are still read). Rows are
buffered in memory up to ``memory_bytes`` and then written as a run, so a map task's memory is
bounded whatever its input size; the status of reduce partition ``r`` lists its ``(offset,
length)`` segments in run order; a reader holds one batch at a time (``read_segments``).

Memory: a map task runs in a Python worker where Spark's own shuffle of the same input has no
Python step at all, so what it holds is what arrowbeat adds to the executor's peak. Beside the
held batches a run needs their reduce partitions (2 bytes a row), the sort order (8) and the
reordered copy, made a quarter of the run at a time (``RUN_PIECES``); each quarter's ``take``
first joins the run's chunks of one column at a time, so the largest column comes on top.
Smaller runs cost a batch message's metadata per reducer and run (16 bytes per column and per
buffer: 10 KB for 200 columns), beside the rows; the schema is written once per file.

The file is private (``arrow_shuffle.private_files``): its folder 0700, the file created 0600 with
``O_EXCL | O_NOFOLLOW``, so a name that exists already (a planted symlink) is refused, never
written through.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from arrow_shuffle.checksum import CHUNK_BYTES, VerifiedSegment, region_checksums
from arrow_shuffle.errors import CorruptDataError, ShuffleConfigError, ShuffleError
from arrow_shuffle.partitioner import hash_rows, key_type_problem
from arrow_shuffle.private_files import create_private_file, make_private_dir
from spark_plugin.shuffle.key_buckets import (
    hot_key_last_keys,
    map_side_heavy,
    orders_hot_key_last,
)
from spark_plugin.shuffle.map_output_format import (
    PREFIX_BYTES,
    WRITE_OPTIONS,
    encode_header,
    has_dictionaries,
    read_header,
    schema_names,
)

BATCH_ROWS = 16384
"""Rows per batch in map-output files (Spark hands Python 10k-row batches by default)."""

RUN_PIECES = 4
"""A run is put in reducer order this many pieces at a time (``MapOutputWriter._write_run``)."""

Segment = tuple[int, int, list[int]]
"""``(offset, length, checksums)`` of one reducer's batches in one run of a map output file: a checksum
of every ``CHUNK_BYTES`` of it (``arrow_shuffle.checksum``), or none when checksums are off. A
two-item ``(offset, length)`` is read unchecked."""


@dataclass
class ReducerOutput:
    """What one map task wrote for one reduce partition."""

    segments: list[Segment] = field(default_factory=list)
    bytes: int = 0
    batches: int = 0
    rows: int = 0


def check_keys(schema: pa.Schema, key_columns: Sequence[str]) -> None:
    """Fail before any data moves when a key column is missing or of a type rows cannot be grouped by.

    Every type Spark groups by passes (``key_type_problem``): numbers, decimals, strings, binaries,
    booleans, dates, timestamps, and structs, arrays and maps of them; a variant does not.
    """
    if not key_columns:
        raise ShuffleConfigError("key_columns must name at least one column")
    for name in key_columns:
        index = schema.get_field_index(name)
        if index < 0:
            raise ShuffleConfigError(f"key column {name!r} is not a column of the DataFrame ({schema.names})")
        field = schema.field(index)
        problem = key_type_problem(field)
        if problem:
            raise ShuffleConfigError(
                f"key column {name!r} has type {field.type}, which arrowbeat cannot group or "
                f"hash-partition by: {problem}"
            )


def route(batch: pa.RecordBatch, key_columns: Sequence[str], num_partitions: int) -> np.ndarray:
    """The reduce partition of every row: the engine's process-independent key hash."""
    ids: np.ndarray = (hash_rows(batch, key_columns) % np.uint64(num_partitions)).astype(np.int64)
    return ids


class MapOutputWriter:
    """Routes batches to reduce partitions and writes them as runs of segments to ``path``.

    Input batches are held as they come (Spark hands each one over in its own buffers) with the
    reduce partition of every row; a run then orders the held rows by partition with one
    ``take`` per quarter of the run and streams each partition's slice straight into the file.
    One copy of the data before the file, where sorting every input batch and merging the pieces
    again took three; a quarter of it alive at a time.

    The file begins with its header (``map_output_format``: the schema, once); one IPC stream
    writer, whose opening schema message is the header's own, then writes every segment's batch
    messages. Arrow writes them natively into the file (``_OutputFile``): no Python call per
    buffer, where a writer on a Python file made about nine per batch and one per column buffer
    (hundreds for a wide schema). A schema with dictionary fields (never Spark's: its Arrow
    conversion makes none) keeps a whole stream per segment, whose batches carry their
    dictionaries.

    With ``hot_key_last`` (a grouped call's shuffle) a hot key's rows come last in their partition,
    every other order kept (``key_buckets``): the same radix sort, on a 16-bit (partition, hot)
    key.
    """

    def __init__(
        self,
        path: str,
        schema: pa.Schema,
        key_columns: Sequence[str],
        num_partitions: int,
        memory_bytes: int,
        memory_pool: pa.MemoryPool | None = None,
        checksum: bool = True,
        hot_key_last: bool = False,
    ) -> None:
        """``checksum``: each segment gets its checksums (``Segment``), which every reader verifies."""
        self.path = path
        self.memory_pool = memory_pool
        """Where a run's sorted pieces are allocated (default: Arrow's); a test accounts them."""
        self.schema = schema
        self.keys = list(key_columns)
        self.num_partitions = num_partitions
        self.memory_bytes = memory_bytes
        self.outputs = [ReducerOutput() for _ in range(num_partitions)]
        self.spill_bytes = 0
        """Bytes written in runs forced by the memory bound (all but the final run)."""
        self._held: list[pa.RecordBatch] = []
        self._routes: list[np.ndarray] = []
        self._route_type = np.uint16 if num_partitions <= 1 << 16 else np.int64
        """Held reduce partition ids are narrowed: 2 bytes a row instead of 8 beside the batches,
        and a stable sort of small integers is a radix sort in numpy (5x faster than on int64)."""
        self._hot_key_last = hot_key_last and orders_hot_key_last(num_partitions)
        """Routes are (partition, hot) keys (``hot_key_last_keys``), not partition ids."""
        self._heavy: int | None = None
        """The hot key's hash, guessed from the first batch (``map_side_heavy``)."""
        self._heavy_decided = False
        self._held_bytes = 0
        self._streams = has_dictionaries(schema)
        """Each segment a whole IPC stream (``map_output_format.FLAG_STREAMS``)."""
        header = encode_header(schema, self._streams)
        self.header_bytes = len(header)
        """Bytes before the first segment: the file's header."""
        try:
            make_private_dir(os.path.dirname(path))  # its parent (the agent's folder): checked by the caller
            self._file = _OutputFile(path, checksum)
        except OSError as exc:
            raise ShuffleError(
                f"cannot create map output {path}: {exc}; check spark.arrowbeat.shuffle.dir"
            ) from exc
        self._header = header
        self._header_checked = False
        self._batches: pa.ipc.RecordBatchStreamWriter | None = None
        """The file's one IPC writer (format 2), opened with the first segment; never closed (its
        end-of-stream marker would follow the last segment for nobody)."""
        try:
            # Format 2: the prefix only; the writer's schema message, which it writes before its
            # first batch, is the header's rest, byte for byte (checked once it is written).
            self._file.out.write(header if self._streams else header[:PREFIX_BYTES])
        except OSError as exc:
            self._file.discard()
            raise ShuffleError(
                f"writing map output {path} failed: {exc}; free disk space or point "
                "spark.arrowbeat.shuffle.dir elsewhere"
            ) from exc

    @property
    def file_bytes(self) -> int:
        """Bytes the file holds so far: its header and every segment written."""
        return self.header_bytes + sum(o.bytes for o in self.outputs)

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if not batch.schema.equals(self.schema):
            batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
        if self._hot_key_last:
            hashes = hash_rows(batch, self.keys)
            partitions = hashes % np.uint64(self.num_partitions)
            if not self._heavy_decided:  # once, so that every run orders a hot key alike
                self._heavy, self._heavy_decided = map_side_heavy(hashes, partitions), True
            self._routes.append(hot_key_last_keys(hashes, partitions, self._heavy))
        else:
            self._routes.append(route(batch, self.keys, self.num_partitions).astype(self._route_type))
        self._held.append(batch)
        self._held_bytes += batch.nbytes
        if self._held_bytes >= self.memory_bytes:
            self.spill_bytes += self._write_run()

    def finish(self) -> list[ReducerOutput]:
        """Write the last run, close the file; the per-reducer segments are final."""
        self._write_run()
        try:
            if not self._streams and self._batches is None:  # no rows: the header's rest by hand
                self._file.out.write(self._header[PREFIX_BYTES:])
            self._check_header()
            self._file.close()
        except OSError as exc:
            raise ShuffleError(
                f"writing map output {self.path} failed: {exc}; free disk space or point "
                "spark.arrowbeat.shuffle.dir elsewhere"
            ) from exc
        return self.outputs

    def abort(self) -> None:
        self._held, self._routes = [], []
        self._file.discard()

    def _write_run(self) -> int:
        """Writes the held rows as one run; returns its bytes.

        The rows are put in reducer order a piece at a time (``RUN_PIECES``): the sorted copy
        beside the held batches is a piece of the run, not all of it, which is what lets a map
        task's Python worker stay within Spark's own memory for the same input."""
        if not self._held:
            return 0
        ids = np.concatenate(self._routes)
        if self._hot_key_last:  # (partition, hot) keys: rows per partition
            counts = np.bincount(ids, minlength=self.num_partitions * 2).reshape(-1, 2).sum(axis=1)
        else:
            counts = np.bincount(ids, minlength=self.num_partitions)
        order = np.argsort(ids, kind="stable")
        del ids
        held = pa.Table.from_batches(self._held, schema=self.schema)
        self._held, self._routes, self._held_bytes = [], [], 0
        ends = np.cumsum(counts)  # where each reducer's rows end in run order
        reducers = np.flatnonzero(counts)
        piece_rows = max(BATCH_ROWS, -(-len(order) // RUN_PIECES))
        written, next_reducer = 0, 0
        segment: _SegmentWriter | None = None
        try:
            for first in range(0, len(order), piece_rows):
                last = min(first + piece_rows, len(order))
                piece = pc.take(held, pa.array(order[first:last]), memory_pool=self.memory_pool)
                at = first
                while at < last:
                    reducer = int(reducers[next_reducer])
                    upto = min(int(ends[reducer]), last)
                    if segment is None:
                        segment = self._segment()
                    segment.write(piece.slice(at - first, upto - at))
                    at = upto
                    if upto == ends[reducer]:
                        written += segment.close(self.outputs[reducer])
                        segment, next_reducer = None, next_reducer + 1
                del piece  # before the next piece is taken
            self._file.settle()
            self._check_header()
        except OSError as exc:
            raise ShuffleError(
                f"writing map output {self.path} failed: {exc}; free disk space or point "
                "spark.arrowbeat.shuffle.dir elsewhere"
            ) from exc
        return written

    def _segment(self) -> _SegmentWriter:
        """The writer of the next segment: on the file's own IPC writer (format 2), or a stream
        of the segment's own (``FLAG_STREAMS``)."""
        out = self._file.out
        if self._streams:
            own = pa.ipc.new_stream(out, self.schema, options=WRITE_OPTIONS)
            return _SegmentWriter(self._file, own, True)
        if self._batches is None:  # its first batch comes after its schema message: the header's rest
            self._batches = pa.ipc.new_stream(out, self.schema, options=WRITE_OPTIONS)
            return _SegmentWriter(self._file, self._batches, False, self.header_bytes)
        return _SegmentWriter(self._file, self._batches, False)

    def _check_header(self) -> None:
        """Once: the file begins with the header (Arrow's writer wrote the schema message it holds)."""
        if not self._header_checked:
            self._file.check_header(self._header)
            self._header_checked = True


_WRITE_BUFFER = 256 << 10
"""Bytes Arrow gathers before a write to the file: its many small writes per batch (a message's
prefix, metadata, each body buffer) become one system call."""


_FD_DIR = "/proc/self/fd"


def _open_for_arrow(created: int, path: str) -> tuple[int, pa.NativeFile]:
    """A read descriptor and Arrow's file, both on the very file ``created`` is open on.

    Arrow opens files by name only. On Linux both are opened through ``/proc/self/fd/N``, the
    open file itself whatever its name points at by then; the descriptor Arrow opened is then
    made non-inheritable, as Python makes its own (a program a task starts must not hold a
    shuffle file open). Elsewhere both go by name, in the private folder the file was just
    created in (0700: nobody else can put anything at that name), the read descriptor checked
    to be the created inode."""
    if os.path.isdir(_FD_DIR):
        own = os.path.join(_FD_DIR, str(created))
        read_fd = os.open(own, os.O_RDONLY)
        try:
            raw = pa.OSFile(own, "w")
            created_stat = os.fstat(created)
            inode = (created_stat.st_dev, created_stat.st_ino)
            for name in os.listdir(_FD_DIR):  # Arrow's: the one on this file that is not ours
                with contextlib.suppress(OSError, ValueError):
                    fd = int(name)
                    found = os.fstat(fd)
                    if fd not in (created, read_fd) and (found.st_dev, found.st_ino) == inode:
                        os.set_inheritable(fd, False)
        except BaseException:
            os.close(read_fd)
            raise
        return read_fd, raw
    identity = os.fstat(created)
    read_fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        opened = os.fstat(read_fd)
        if (opened.st_dev, opened.st_ino) != (identity.st_dev, identity.st_ino):
            raise ShuffleError(f"map output {path} was replaced as it was created")
        return read_fd, pa.OSFile(path, "w")
    except BaseException:
        os.close(read_fd)
        raise


class _OutputFile:
    """A map output file as Arrow writes it: natively, through a small buffer; each segment's
    checksums computed once it is written, by reading it back from the page cache
    (``region_checksums``), a chunk per call.

    The file is created private (0600, ``O_EXCL | O_NOFOLLOW``: never an existing file or a
    planted symlink); Arrow and the read-back then open that very file (``_open_for_arrow``)."""

    def __init__(self, path: str, checksum: bool) -> None:
        self.path = path
        self.checksum = checksum
        created = create_private_file(path)
        try:
            self._read_fd, raw = _open_for_arrow(created, path)
        except ShuffleError:  # the name is no longer our file: not ours to remove
            raise
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # created a moment ago: no empty file left behind
            raise
        finally:
            os.close(created)
        self.out = pa.BufferedOutputStream(raw, _WRITE_BUFFER)
        self._scratch: bytearray | None = None
        self._unsettled: list[tuple[int, int, list[int]]] = []
        self._closed = False

    def checksums(self, offset: int, length: int) -> list[int]:
        """The checksums of the segment written at ``offset``: filled in by ``settle`` (none when
        checksums are off), so a run's segments are read back after one flush, not one each."""
        crcs: list[int] = []
        if self.checksum and length:
            self._unsettled.append((offset, length, crcs))
        return crcs

    def settle(self) -> None:
        """Every segment written since the last call gets its checksums."""
        if not self._unsettled:
            return
        self.out.flush()
        if self._scratch is None:
            self._scratch = bytearray(CHUNK_BYTES)
        where = f"map output {self.path}"
        for offset, length, crcs in self._unsettled:
            crcs.extend(region_checksums(self._read_fd, offset, length, self._scratch, where))
        self._unsettled.clear()

    def check_header(self, header: bytes) -> None:
        """The header as written must be ``header``: Arrow's writer wrote its schema message."""
        self.out.flush()
        if os.pread(self._read_fd, len(header), 0) != header:
            raise ShuffleError(
                f"map output {self.path}: Arrow's IPC writer began its stream with other bytes than "
                "the header's schema message"
            )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.out.close()  # and the file under it
            finally:
                os.close(self._read_fd)

    def discard(self) -> None:
        """Close and remove the file, whatever closing says (a full disk)."""
        with contextlib.suppress(OSError):
            self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _SegmentWriter:
    """One reducer's batches in a run, written from one or more pieces of the sorted rows."""

    def __init__(
        self, file: _OutputFile, stream: pa.ipc.RecordBatchStreamWriter, own: bool, offset: int | None = None
    ) -> None:
        """``own``: the segment is the whole ``stream`` (closed with it); ``offset``: where its
        first batch will be, when the stream writes something before it."""
        self.offset: int = file.out.tell() if offset is None else offset
        self.file = file
        self.stream, self._own = stream, own
        self.batches = 0
        self.rows = 0

    def write(self, rows: pa.Table) -> None:
        # Large batches: every later step (network, JVM conversion) pays per batch.
        for batch in rows.to_batches(max_chunksize=BATCH_ROWS):
            self.stream.write_batch(batch)
            self.batches += 1
        self.rows += rows.num_rows

    def close(self, out: ReducerOutput) -> int:
        """Ends the segment and records it as ``out``'s next segment; returns its bytes."""
        if self._own:
            self.stream.close()
        size: int = self.file.out.tell() - self.offset
        out.segments.append((self.offset, size, self.file.checksums(self.offset, size)))
        out.bytes += size
        out.batches += self.batches
        out.rows += self.rows
        return size


def read_segments(
    path: str,
    segments: Sequence[Sequence[Any]],
    memory_pool: pa.MemoryPool | None = None,
    schema: pa.Schema | None = None,
) -> Iterator[pa.RecordBatch]:
    """The batches of ``segments`` of a local map output file, read one batch at a time.

    The file's header is read and verified first (``map_output_format.read_header``): it says
    whether the segments are batch messages of the header's schema (format 2) or whole IPC
    streams (format 1, or a schema with dictionaries), and must hold ``schema`` when given.
    Read, not memory-mapped: a mapping keeps every page it touched resident in the reader until
    the whole file is read (a hot reducer's share of one map output: 24 of 34 MiB). A segment
    with checksums is read through ``VerifiedSegment``: a chunk (``CHUNK_BYTES``) at a time,
    verified before Arrow decodes any of it, so the reader (a reduce task, or the agent serving a
    stream blocked on credit) holds a chunk and the batch in hand, whatever a segment's size (the
    batch's buffers are views of its chunk; a one-chunk segment, the usual kind, Arrow decodes
    from the verified bytes natively: ``VerifiedSegment.reader``).
    A header or segment that fails its checksum, ends early, does not end where its status says,
    or holds garbage (a corrupt or foreign file) is a ``CorruptDataError`` before any batch past
    the damage is handed out; a file that is gone is a ``ShuffleError``. Either way the reader
    reports the output lost, and Spark recomputes it."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ShuffleError(f"map output {path} is gone: {exc}") from exc
    try:
        header = read_header(fd, f"map output {path}", schema)
        batch_schema = None if header.streams else header.schema
        # What each whole IPC stream must declare: format 1 names no schema but its streams'.
        stream_schema = schema if schema is not None else header.schema
        with pa.OSFile(path, "r", memory_pool=memory_pool) as unchecked:
            for segment in segments:
                offset, length = int(segment[0]), int(segment[1])
                if offset < header.length:
                    raise CorruptDataError(
                        f"map output {path}: a segment at {offset}, inside the file's header of "
                        f"{header.length} bytes: its index is damaged"
                    )
                crcs = segment[2] if len(segment) > 2 else None
                if crcs:
                    source = VerifiedSegment(fd, offset, length, crcs, f"map output {path}").reader()
                    batches = _decoded(
                        source, 0, length, batch_schema, stream_schema, path, offset, memory_pool
                    )
                    yield from batches
                else:  # written without checksums: decoding and full validation are all that guard it
                    unchecked.seek(offset)
                    batches = _decoded(
                        unchecked, offset, length, batch_schema, stream_schema, path, offset, memory_pool
                    )
                    yield from (_validated(batch, path, offset) for batch in batches)
    except OSError as exc:
        raise ShuffleError(f"map output {path} is gone: {exc}") from exc
    finally:
        os.close(fd)


def _decoded(
    source: pa.NativeFile,
    start: int,
    length: int,
    schema: pa.Schema | None,
    stream_schema: pa.Schema | None,
    path: str,
    offset: int,
    memory_pool: pa.MemoryPool | None,
) -> Iterator[pa.RecordBatch]:
    """The batches of the segment ``source`` holds from ``start`` (where it is positioned) for
    ``length`` bytes: batch messages decoded against ``schema``, or a whole IPC stream (None),
    which must declare ``stream_schema`` when one is known."""
    end = start + length
    try:
        if schema is None:
            stream = pa.ipc.open_stream(source, memory_pool=memory_pool)
            if stream_schema is not None and not stream.schema.equals(stream_schema):
                raise CorruptDataError(
                    f"map output {path}: the segment at {offset} holds rows of schema "
                    f"({schema_names(stream.schema)}), not the shuffle's ({schema_names(stream_schema)})"
                )
            for batch in stream:
                if source.tell() > end:
                    break
                yield batch
        else:
            while source.tell() < end:
                # Nothing of a batch held here between yields: the caller's batch is the only one.
                yield _next_batch(source, schema, end, path, offset)
    except (pa.ArrowException, OSError, EOFError) as exc:
        # Bytes that do not decode (Arrow says so with OSError too, "Invalid flatbuffers message";
        # EOFError: an end-of-stream marker where a batch belongs): written wrong, or foreign.
        # An unchecked segment's read that failed lands here too: unreadable is damaged as well.
        raise CorruptDataError(f"map output {path}: the segment at {offset} is corrupt: {exc}") from exc
    if source.tell() != end:
        raise CorruptDataError(
            f"map output {path}: the segment at {offset} of {length} bytes ends at "
            f"{source.tell() - start}: the file is corrupt"
        )


def _validated(batch: pa.RecordBatch, path: str, offset: int) -> pa.RecordBatch:
    """A batch of a segment no checksum vouches for, checked whole (offsets within their buffers,
    lengths consistent, UTF-8 valid) before anything reads it: a damaged offset that decoding let
    through would otherwise read past a buffer and crash the process."""
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptDataError(f"map output {path}: the segment at {offset} is corrupt: {exc}") from exc
    return batch


def _next_batch(source: pa.NativeFile, schema: pa.Schema, end: int, path: str, offset: int) -> pa.RecordBatch:
    message = pa.ipc.read_message(source)
    if message.type != "record batch" or source.tell() > end:
        raise CorruptDataError(
            f"map output {path}: the segment at {offset} is corrupt: a {message.type} message "
            f"ending at {source.tell()}, where record batches up to {end} belong"
        )
    return pa.ipc.read_record_batch(message, schema)
