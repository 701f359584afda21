"""Checksums of stored shuffle bytes: a CRC-32 of every fixed-size chunk of a segment.

A map-output segment (one reducer's Arrow IPC stream in a run) is checksummed as it is written
(``ChecksumSink``, the file Arrow's writer writes through) and verified as it is read
(``VerifiedSegment``, the file Arrow's reader reads through). Nothing reaches Arrow's decoder
before the chunk holding it verified: a damaged length or offset inside a batch decodes into
arrays that crash their reader later, and no check after decoding can undo that.

Why chunks (``CHUNK_BYTES``) and not one checksum per segment: a segment can be as large as a
map task's run (``spark.arrowbeat.shuffle.mapMemory``), and a reader would have to hold all of it
before handing out its first batch; a chunk at a time, a reader holds one chunk beside the batch
in hand. The checksums travel with the segment's offset and length (the status row's index).

Why zlib's CRC-32: the standard library's, so no new dependency on any supported Python or
platform (arrowbeat ships no compiled code of its own); compiled, it releases the GIL on large
buffers, and it reads 2.3-3.8 GB/s on this project's 2-core test machine: a fraction of what
writing and decoding the same bytes costs. ``xxhash`` (faster) or CRC32C would each add a compiled
dependency for a cost that is already small. CRC-32 catches every burst error of up to 32 bits
and all but 2**-32 of the rest, which is the job: damaged disks and files, not adversaries (files
are private to the user, ``private_files``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

from arrow_shuffle.errors import CorruptDataError

CHUNK_BYTES = 1 << 20
"""Bytes covered by one checksum (the last chunk of a segment may be shorter)."""


def chunk_count(length: int) -> int:
    """How many checksums a segment of ``length`` bytes has."""
    return -(-length // CHUNK_BYTES)


class ChecksumSink:
    """A binary file that checksums what is written between ``begin()`` and ``end()``.

    Arrow's writer writes through it (``pa.PythonFile(ChecksumSink(f), mode="w")``): every byte
    is checksummed as it passes, so a segment costs no second read. Bytes written outside a
    segment are written unchecked (there are none in a map output)."""

    def __init__(self, raw: Any, enabled: bool = True) -> None:
        self._raw = raw
        self.enabled = enabled
        self._crcs: list[int] | None = None
        self._crc = 0
        self._filled = 0
        """Bytes of the current chunk checksummed so far."""

    def begin(self) -> None:
        """A segment starts at the current position."""
        self._crcs, self._crc, self._filled = [], 0, 0

    def end(self) -> list[int]:
        """The checksums of the segment written since ``begin`` (empty when disabled)."""
        crcs = self._crcs if self._crcs is not None else []
        if self._filled:
            crcs.append(self._crc)
        self._crcs, self._crc, self._filled = None, 0, 0
        return crcs if self.enabled else []

    def write(self, data: Any) -> int:
        if self.enabled and self._crcs is not None:
            view = memoryview(data).cast("B")
            while view:
                take = min(len(view), CHUNK_BYTES - self._filled)
                self._crc = zlib.crc32(view[:take], self._crc)
                self._filled += take
                view = view[take:]
                if self._filled == CHUNK_BYTES:
                    self._crcs.append(self._crc)
                    self._crc, self._filled = 0, 0
        written: int = self._raw.write(data)
        return written

    def tell(self) -> int:
        position: int = self._raw.tell()
        return position

    def flush(self) -> None:
        self._raw.flush()

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False


class VerifiedSegment:
    """One segment of a file, read a verified chunk at a time: a read-only binary file whose
    position 0 is the segment's first byte and whose end is the segment's end.

    Arrow's reader reads through it (``pa.PythonFile(VerifiedSegment(...), mode="r")``). A chunk
    is read whole with one ``pread`` and checked before any of its bytes is returned; one that
    does not match, or a file that ends before the segment does, is a ``CorruptDataError`` naming
    the file, the segment and the chunk."""

    def __init__(self, fd: int, offset: int, length: int, crcs: Sequence[int], where: str) -> None:
        if len(crcs) != chunk_count(length):
            raise CorruptDataError(
                f"{where}: the segment at {offset} of {length} bytes has {len(crcs)} checksums, "
                f"expected {chunk_count(length)}: its index is damaged"
            )
        self._fd = fd
        self._offset = offset
        self.length = length
        self._crcs = list(crcs)
        self._where = where
        self._pos = 0
        self._index = -1
        self._chunk = memoryview(b"")

    def _load(self, index: int) -> None:
        start = index * CHUNK_BYTES
        size = min(CHUNK_BYTES, self.length - start)
        try:
            data = os.pread(self._fd, size, self._offset + start)
        except OSError as exc:
            raise CorruptDataError(
                f"{self._where}: reading the segment at {self._offset} failed: {exc}"
            ) from exc
        if len(data) != size:
            raise CorruptDataError(
                f"{self._where}: the file ends inside the segment at {self._offset} (chunk {index} "
                f"has {len(data)} of {size} bytes): the file is truncated"
            )
        crc = zlib.crc32(data)
        if crc != self._crcs[index]:
            raise CorruptDataError(
                f"{self._where}: checksum mismatch in the segment at {self._offset} of {self.length} "
                f"bytes, chunk {index} (bytes {start}-{start + size - 1}): crc32 {crc:08x}, "
                f"written {self._crcs[index]:08x}"
            )
        self._index, self._chunk = index, memoryview(data)

    def read(self, size: int = -1) -> bytes:
        left = self.length - self._pos
        size = left if size is None or size < 0 else min(size, left)
        parts = []
        while size > 0:
            index = self._pos // CHUNK_BYTES
            if index != self._index:
                self._load(index)
            start = self._pos - index * CHUNK_BYTES
            part = self._chunk[start : start + size]
            parts.append(part)
            self._pos += len(part)
            size -= len(part)
        if len(parts) == 1:
            return bytes(parts[0])
        return b"".join(parts)

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._chunk = memoryview(b"")

    @property
    def closed(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False
