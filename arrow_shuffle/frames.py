"""Wire frames: a fixed 20-byte header, a checksum on data frames, and an optional payload.

``magic:u16 kind:u8 flags:u8 length:u32 seq:i64 value:i32`` (network byte order). ``value`` is
the backlog on BUFFER frames (Flink's BufferResponse), the credit on PARTITION_REQUEST and
ADD_CREDIT, and an error code on ERROR. CONTROL_REQUEST / CONTROL_RESPONSE carry one typed
control message (``arrow_shuffle.control_schema``); ``seq`` numbers them per direction. PARTITION_REQUEST
and both control kinds are sealed with the connection's session key (``auth.Session``). Payload
lengths are checked against a maximum before anything is read, so a corrupt or hostile length
never makes us allocate or wait for it.

A BUFFER frame with ``FLAG_CHECKSUM`` carries ``crc:u32`` right after the header (not counted in
``length``): the checksum (``checksum.digest``, the project's one) of its payload, computed by the
sender from the pieces it sends and checked by the receiver before the payload is decoded
(``RemoteInputChannel``). Under TLS a record's MAC already catches damage in transit; the check
stays on there too (one setting, ``ShuffleConfig.checksum``), as it also covers what lies outside
the records: the copy into the sender's scratch buffer, the receiver's framing. The flag is the
only one defined: any other bit, or the flag on any other kind, is a ``CorruptFrameError``. Control
frames are covered by their seal instead. The wire has no version number (HELLO is a bare nonce):
both ends of a stream run the same arrowbeat, so a peer from before checksums is not supported.

Headers are packed here only (``pack_header``) and unpacked here only (``unpack_header`` and
``with_checksum``).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arrow_shuffle.checksum import digest_parts
from arrow_shuffle.errors import CorruptFrameError

if TYPE_CHECKING:
    import pyarrow as pa

MAGIC = 0xAB5F
HEADER = struct.Struct("!HBBIqi")
HEADER_SIZE = HEADER.size
MAX_CONTROL_PAYLOAD = 64 * 1024
FLAG_CHECKSUM = 0x01
"""Flags bit: a ``CHECKSUM_SIZE``-byte checksum of the payload follows the header (BUFFER frames only)."""
CHECKSUM = struct.Struct("!I")
CHECKSUM_SIZE = CHECKSUM.size
_CHECKSUMMED = struct.Struct("!HBBIqiI")
"""The header and the checksum after it, packed in one call (one ``bytes`` for ``sendmsg``)."""


class Kind(enum.IntEnum):
    HELLO = 1
    AUTH = 2
    AUTH_OK = 3
    PARTITION_REQUEST = 4
    BUFFER = 5
    END_OF_PARTITION = 6
    ADD_CREDIT = 7
    KEEPALIVE = 8
    ERROR = 9
    CANCEL = 10
    CONTROL_REQUEST = 11
    CONTROL_RESPONSE = 12


class ErrorCode(enum.IntEnum):
    OTHER = 0
    PARTITION_NOT_FOUND = 1
    AUTHENTICATION = 2
    PROTOCOL = 3
    PRODUCER_FAILED = 4
    BUSY = 5
    """The server is at its connection limit; try again later (the client sees ``PeerLostError``)."""


@dataclass(frozen=True, slots=True)
class FrameHeader:
    kind: Kind
    length: int
    seq: int = 0
    value: int = 0
    crc: int | None = None
    """The payload's checksum as the sender computed it (a checksummed frame), else ``None``."""
    checksummed: bool = False
    """The flag was set: ``CHECKSUM_SIZE`` bytes of checksum follow the header (``with_checksum``
    reads them into ``crc``)."""

    def pack(self) -> bytes:
        return pack_header(self.kind, self.length, self.seq, self.value, self.crc)


def pack_header(kind: Kind, length: int, seq: int = 0, value: int = 0, crc: int | None = None) -> bytes:
    """The bytes that precede a payload of ``length``: the header, and ``crc`` after it if given."""
    if crc is None:
        return HEADER.pack(MAGIC, kind, 0, length, seq, value)
    return _CHECKSUMMED.pack(MAGIC, kind, FLAG_CHECKSUM, length, seq, value, crc)


def payload_crc(parts: Iterable[bytes | bytearray | memoryview | pa.Buffer]) -> int:
    """The checksum of the pieces of a payload, in order, read where they are (no copy)."""
    return digest_parts(parts)


def unpack_header(data: bytes | bytearray | memoryview) -> FrameHeader:
    """The header in the first ``HEADER_SIZE`` bytes of ``data``; a checksummed one comes back with
    ``checksummed`` set and ``crc`` ``None`` until ``with_checksum`` is given the bytes after it."""
    magic, kind, flags, length, seq, value = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptFrameError(f"bad frame magic 0x{magic:04x} (expected 0x{MAGIC:04x})")
    try:
        known = Kind(kind)
    except ValueError as exc:
        raise CorruptFrameError(f"unknown frame kind {kind}") from exc
    if flags == 0:
        return FrameHeader(known, length, seq, value)
    if flags != FLAG_CHECKSUM:
        raise CorruptFrameError(f"unknown frame flags 0x{flags:02x} on a {known.name} frame")
    if known is not Kind.BUFFER:
        raise CorruptFrameError(f"checksum flag on a {known.name} frame (only BUFFER frames carry one)")
    return FrameHeader(known, length, seq, value, None, True)


def with_checksum(header: FrameHeader, data: bytes | bytearray | memoryview) -> FrameHeader:
    """``header`` with the checksum read from the ``CHECKSUM_SIZE`` bytes that followed it."""
    return FrameHeader(header.kind, header.length, header.seq, header.value, CHECKSUM.unpack(data)[0], True)
