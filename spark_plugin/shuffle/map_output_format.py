"""A map-output file's format version and header: the schema written once per file, not per segment.

Format 1 (no header; files written before format 2 existed) holds segments that are each a whole
Arrow IPC stream: the schema message, the batches, the end-of-stream marker. A file of 200
columns split over 200 reducers then repeats a 9.5 KB schema 200 times per run, as much as the
rows themselves on small segments. Format 2 (what ``map_output.MapOutputWriter`` writes) puts the
schema in a header at the start of the file; its segments hold record-batch messages only, which
a reader decodes against the header's schema (``pa.ipc.read_record_batch``: C++ on the bytes as
they are, no copy)::

    offset  size  field
         0     8  MAGIC (b"\\x89ABMO\\r\\n\\x1a": never an IPC stream's first bytes, ff ff ff ff)
         8     2  format version, little-endian (2)
        10     2  flags (FLAG_STREAMS: each segment is a whole IPC stream, for a schema with
                  dictionary fields, whose batches need their dictionaries in every segment)
        12     4  schema message length (a multiple of 8: segments stay 8-byte aligned)
        16     4  checksum (``arrow_shuffle.checksum.digest``) of the header with this field zero
        20     4  reserved, zero
        24     n  the schema as Arrow's stream writer writes it (an encapsulated IPC message)
    24 + n        the first segment

Why the whole schema and not a fingerprint of the plan's: every reader knows the shuffle's schema
already (the plan carries it), but a file that names its own columns is read and checked on its
own (tests, a support case, an agent given a plan from another version), and the cost is one
schema per map task: 9.5 KB of a run of megabytes. Readers compare it with the schema they expect
(``read_header``'s ``expected``).

Both formats are read for as long as files of format 1 can exist (written by the previous
version of a rolling deployment); the file says which it is. Anything else (a header that fails
its checksum, a version or flag this code does not know, a length past the file's end, a schema
that is not the expected one, a file that begins with neither) is a ``CorruptDataError``: the
reader reports the output damaged and Spark recomputes it, as for a segment that fails its
checksum (``worker.output_recovery.damaged_output``).
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass

import pyarrow as pa

from arrow_shuffle.checksum import digest
from arrow_shuffle.errors import CorruptDataError

MAGIC = b"\x89ABMO\r\n\x1a"
"""The first bytes of a format-2 file. Like PNG's: a high bit (caught by 7-bit copies), CR LF and
^Z (caught by newline translation), and not ff ff ff ff, which every format-1 file begins with."""

LEGACY_VERSION = 1
"""Segments are whole IPC streams; the file has no header (its first segment is at offset 0)."""

VERSION = 2
"""Segments are record-batch messages decoded against the header's schema."""

FLAG_STREAMS = 0x1
"""Format 2 with segments that are whole IPC streams (a schema with dictionary fields)."""

_KNOWN_FLAGS = FLAG_STREAMS
_PREFIX = struct.Struct("<8sHHIII")
"""magic, version, flags, schema length, checksum, reserved: ``PREFIX_BYTES``."""
PREFIX_BYTES = _PREFIX.size
_CHECKSUM_AT = 16
_CONTINUATION = b"\xff\xff\xff\xff"
"""How an IPC message, and so a format-1 file, begins."""
_END_OF_STREAM = _CONTINUATION + b"\x00\x00\x00\x00"
_PROBE = 4 << 10
"""Bytes read at once from a file's start: the whole header of a schema of up to about 80
columns; a longer one takes a second read. Every reader of every segment list reads it, so more
would be copied for nothing (a reduce task reads one header per map output)."""
_MAX_SCHEMA = 64 << 20
"""A schema message longer than this is a damaged length, not a schema."""

WRITE_OPTIONS = pa.ipc.IpcWriteOptions()
"""The IPC format of map outputs, decided once: the header's schema message and the segments'
batches are written with the same options."""


@dataclass(frozen=True)
class Header:
    """What a reader needs from a file's start."""

    version: int
    schema: pa.Schema | None
    """The schema every segment's batches have (format 1: None, each segment carries its own)."""
    streams: bool
    """Each segment is a whole IPC stream (format 1, or ``FLAG_STREAMS``)."""
    length: int
    """Bytes before the first segment."""


def has_dictionaries(schema: pa.Schema) -> bool:
    """Whether a batch of ``schema`` needs dictionary messages (a dictionary field at any depth)."""

    def nested(kind: pa.DataType) -> bool:
        if pa.types.is_dictionary(kind):
            return True
        return any(nested(kind.field(i).type) for i in range(kind.num_fields))

    return any(nested(field.type) for field in schema)


def schema_message(schema: pa.Schema) -> bytes:
    """The message Arrow's stream writer begins a stream of ``schema`` with (``WRITE_OPTIONS``):
    the bytes a format-2 header holds, and the bytes a file-wide writer's first write is."""
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, schema, options=WRITE_OPTIONS).close()
    stream: bytes = sink.getvalue().to_pybytes()
    if not stream.endswith(_END_OF_STREAM) or len(stream) % 8:
        raise AssertionError(f"Arrow's stream writer wrote {len(stream)} bytes for a schema alone")
    return stream[: -len(_END_OF_STREAM)]


def encode_header(schema: pa.Schema, streams: bool) -> bytes:
    """The header of a format-2 file of ``schema`` (``streams``: ``FLAG_STREAMS``)."""
    message = schema_message(schema)
    flags = FLAG_STREAMS if streams else 0
    unsigned = _PREFIX.pack(MAGIC, VERSION, flags, len(message), 0, 0) + message
    return _PREFIX.pack(MAGIC, VERSION, flags, len(message), digest(unsigned), 0) + message


def read_header(fd: int, where: str, expected: pa.Schema | None = None) -> Header:
    """The header of the file open at ``fd`` (``where`` names it in errors), verified before
    anything is decoded; ``expected``: the schema its segments must have (format 2)."""
    try:
        start = os.pread(fd, _PROBE, 0)
    except OSError as exc:
        raise CorruptDataError(f"{where}: reading its header failed: {exc}") from exc
    if start.startswith(_CONTINUATION):
        return Header(LEGACY_VERSION, None, True, 0)
    if not start.startswith(MAGIC):
        if len(start) < len(MAGIC) and MAGIC.startswith(start):
            raise CorruptDataError(
                f"{where} ends inside its header ({len(start)} bytes): the file is truncated"
            )
        raise CorruptDataError(
            f"{where} is not a map output (it begins with {start[:8].hex(' ')}): the file is corrupt"
        )
    if len(start) < PREFIX_BYTES:
        raise CorruptDataError(f"{where} ends inside its header ({len(start)} bytes): the file is truncated")
    _, version, flags, length, checksum, reserved = _PREFIX.unpack_from(start)
    if length > _MAX_SCHEMA or length % 8 or reserved:
        raise CorruptDataError(
            f"{where}: its header is damaged (schema length {length}, reserved {reserved})"
        )
    end = PREFIX_BYTES + length
    if end > len(start):
        try:
            start += os.pread(fd, end - len(start), len(start))
        except OSError as exc:
            raise CorruptDataError(f"{where}: reading its header failed: {exc}") from exc
        if end > len(start):
            raise CorruptDataError(
                f"{where} ends inside its header ({len(start)} of {end} bytes): the file is truncated"
            )
    header = bytearray(start[:end])
    header[_CHECKSUM_AT : _CHECKSUM_AT + 4] = b"\x00" * 4
    found = digest(header)
    if found != checksum:
        raise CorruptDataError(
            f"{where}: checksum mismatch in its header ({end} bytes): {found:08x}, written {checksum:08x}"
        )
    if version != VERSION or flags & ~_KNOWN_FLAGS:
        # Verified, so written so: by a version of arrowbeat that writes a format this one does not read.
        raise CorruptDataError(
            f"{where} is of map-output format {version} (flags {flags:#x}); this arrowbeat reads "
            f"formats {LEGACY_VERSION} and {VERSION}: written by a newer version?"
        )
    schema = _schema(bytes(start[PREFIX_BYTES:end]), where)
    if expected is not None and not schema.equals(expected):
        raise CorruptDataError(
            f"{where} holds rows of schema ({schema_names(schema)}), "
            f"not the shuffle's ({schema_names(expected)})"
        )
    return Header(version, schema, bool(flags & FLAG_STREAMS), end)


@functools.lru_cache(maxsize=32)
def _parsed(message: bytes) -> pa.Schema:
    """A schema message parsed once (a reduce task reads one header per map output, all alike)."""
    reader = pa.BufferReader(message)
    parsed = pa.ipc.read_message(reader)
    if parsed.type != "schema" or reader.tell() != len(message):
        raise ValueError(f"a {parsed.type} message of {reader.tell()} bytes, not a schema of {len(message)}")
    return pa.ipc.read_schema(parsed)


def _schema(message: bytes, where: str) -> pa.Schema:
    try:
        return _parsed(message)
    except (pa.ArrowException, OSError, ValueError, EOFError) as exc:  # Arrow's IOError is OSError
        raise CorruptDataError(f"{where}: the schema in its header does not decode: {exc}") from exc


def schema_names(schema: pa.Schema) -> str:
    """A schema as error texts show it: its first columns and how many there are."""
    shown = ", ".join(f"{field.name}: {field.type}" for field in list(schema)[:6])
    return shown + (f", ... {len(schema)} columns" if len(schema) > 6 else "")
