"""The project's checksum, and checksums of stored shuffle bytes: one per fixed-size chunk of a segment.

The checksum (``digest``, ``digest_parts``) is XXH3's 64-bit hash, of which the low 32 bits are kept
(``xxhash``, a maintained binding of the reference C library, with wheels for every supported
Python and platform): the network frames (``frames``) and the map-output segments use it alike.
Why XXH3 and not zlib's CRC-32: measured here, on the project's 2-core test machine, XXH3 hashes
26-31 GB/s and zlib's CRC-32 4 GB/s (``adler32`` 3.6), and a shuffle checksums every byte at
least twice (written and read; a stream through an agent four times): with CRC-32 the channel
benchmark (``benchmarks/shuffle_transport.py``), where both ends share the two cores, fell from
4.5 to 1.0 GB/s, 0.3 s of CPU per GiB on each side. Both catch damage from disks, files and
copies (not adversaries: the files are private to the user, ``private_files``, and frames travel
authenticated or under TLS); 32 bits of a well-mixed hash miss a random damage with probability
2**-32, as a CRC-32 does for all but short bursts.

A map-output segment (one reducer's Arrow IPC messages in a run) is checksummed once written
(``region_checksums``: read back from the page cache, while Arrow writes natively) and verified as
it is read (``VerifiedSegment``, the file Arrow's reader reads through). Nothing reaches Arrow's decoder
before the chunk holding it verified: a damaged length or offset inside a batch decodes into
arrays that crash their reader later, and no check after decoding can undo that.

Why chunks (``CHUNK_BYTES``) and not one checksum per segment: a segment can be as large as a
map task's run (``spark.arrowbeat.shuffle.mapMemory``), and a reader would have to hold all of it
before handing out its first batch; a chunk at a time, a reader holds one chunk beside the batch
in hand. The checksums travel with the segment's offset and length (the status row's index).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import xxhash

from arrow_shuffle.errors import CorruptDataError, ShuffleError

CHUNK_BYTES = 1 << 20
"""Bytes covered by one checksum (the last chunk of a segment may be shorter)."""


MASK = 0xFFFFFFFF
"""A checksum is the low 32 bits of the 64-bit hash (what a frame header and an index hold)."""


def digest(data: Any) -> int:
    """The checksum of one bytes-like object, read where it is."""
    return int(xxhash.xxh3_64_intdigest(data)) & MASK


def digest_parts(parts: Iterable[Any]) -> int:
    """The checksum of the concatenation of ``parts`` (each bytes-like, read where it is): the
    same as ``digest`` of their join, without joining them."""
    state = xxhash.xxh3_64()
    for part in parts:
        state.update(part)
    return int(state.intdigest()) & MASK


def chunk_count(length: int) -> int:
    """How many checksums a segment of ``length`` bytes has."""
    return -(-length // CHUNK_BYTES)


def region_checksums(fd: int, offset: int, length: int, scratch: bytearray, where: str) -> list[int]:
    """The checksums of ``length`` bytes of the file open at ``fd`` from ``offset``: one per
    ``CHUNK_BYTES``, each chunk read into ``scratch`` (at least ``CHUNK_BYTES`` long; reused, so
    nothing is allocated per chunk).

    How a map output's writer checksums a segment: Arrow writes it natively (no Python call per
    buffer), then the segment is read back from the page cache it was just written to, a chunk
    per call. A file that ends before the region does is a ``ShuffleError``."""
    view = memoryview(scratch)
    crcs = []
    for start in range(0, length, CHUNK_BYTES):
        size = min(CHUNK_BYTES, length - start)
        chunk = view[:size]
        got = os.preadv(fd, [chunk], offset + start)
        if got != size:  # the writer's own file, just written: an I/O fault, not damage to recompute
            raise ShuffleError(f"{where}: {got} of {size} bytes read back at {offset + start}")
        crcs.append(digest(chunk))
    return crcs


class VerifiedSegment:
    """One segment of a file, read a verified chunk at a time: a read-only binary file whose
    position 0 is the segment's first byte and whose end is the segment's end.

    Arrow's reader reads it through ``reader()``. A chunk is read whole with one ``pread`` and
    checked before any of its bytes is returned; one that does not match, or a file that ends
    before the segment does, is a ``CorruptDataError`` naming the file, the segment and the chunk.
    What ``read`` returns are views of the verified chunk (no copy: Arrow's buffers keep the
    chunk alive while a batch uses it), joined only where a read spans two chunks."""

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
        found = digest(data)
        if found != self._crcs[index]:
            raise CorruptDataError(
                f"{self._where}: checksum mismatch in the segment at {self._offset} of {self.length} "
                f"bytes, chunk {index} (bytes {start}-{start + size - 1}): {found:08x}, "
                f"written {self._crcs[index]:08x}"
            )
        self._index, self._chunk = index, memoryview(data)

    def reader(self) -> Any:
        """The segment as a file for Arrow's IPC reader (a ``pyarrow.NativeFile``).

        A segment of one chunk (most are: a map task writes one segment per reducer and run) is
        read and verified at once and handed over as its own bytes (``pa.BufferReader``): Arrow
        then reads its messages natively, where reading through this object costs a Python call
        per message part (about nine per segment), which was most of what checksums cost a
        reader. A longer segment is read through this object, a chunk at a time."""
        import pyarrow as pa

        if self.length <= CHUNK_BYTES:
            if self.length:
                self._load(0)
            return pa.BufferReader(self._chunk)
        return pa.PythonFile(self, mode="r")

    def read(self, size: int = -1) -> bytes | memoryview:
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
            return parts[0]
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
