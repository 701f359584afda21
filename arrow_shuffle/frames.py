"""Wire frames: a fixed 20-byte header and an optional payload.

``magic:u16 kind:u8 flags:u8 length:u32 seq:i64 value:i32`` (network byte order). ``value`` is
the backlog on BUFFER frames (Flink's BufferResponse), the credit on PARTITION_REQUEST and
ADD_CREDIT, and an error code on ERROR. CONTROL_REQUEST / CONTROL_RESPONSE carry one typed
control message (``arrow_shuffle.control_schema``); ``seq`` numbers them per direction. PARTITION_REQUEST
and both control kinds are sealed with the connection's session key (``auth.Session``). Payload
lengths are checked against a maximum before anything is read, so a corrupt or hostile length
never makes us allocate or wait for it.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from arrow_shuffle.errors import CorruptFrameError

MAGIC = 0xAB5F
HEADER = struct.Struct("!HBBIqi")
HEADER_SIZE = HEADER.size
MAX_CONTROL_PAYLOAD = 64 * 1024


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

    def pack(self) -> bytes:
        return HEADER.pack(MAGIC, self.kind, 0, self.length, self.seq, self.value)


def unpack_header(data: bytes | bytearray | memoryview) -> FrameHeader:
    magic, kind, _flags, length, seq, value = HEADER.unpack(data)
    if magic != MAGIC:
        raise CorruptFrameError(f"bad frame magic 0x{magic:04x} (expected 0x{MAGIC:04x})")
    try:
        return FrameHeader(Kind(kind), length, seq, value)
    except ValueError as exc:
        raise CorruptFrameError(f"unknown frame kind {kind}") from exc
