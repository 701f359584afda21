"""Spill files of BLOCKING partitions: one append-only file per partition.

Each spilled buffer is written verbatim; a buffer payload is itself a complete Arrow IPC stream
(schema, batches, end-of-stream), so every spilled region is a readable Arrow IPC stream and a
region is read back into a pooled segment with one ``readinto`` (no re-encoding).

The file is created 0600 with ``O_EXCL | O_NOFOLLOW`` (``private_files``): ``spill_dir`` defaults to
the shared temp dir and the name is predictable, so a planted symlink must fail the create, not
be written through.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

from arrow_shuffle.errors import SpillError, UnsafePathError
from arrow_shuffle.private_files import create_private_rw_file


@dataclass(frozen=True)
class SpilledRegion:
    """Where one spilled buffer lives in its spill file."""

    offset: int
    length: int


class SpillFile:
    """An append-only file of buffer payloads, deleted on ``close()``."""

    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, f"arrow-shuffle-{os.getpid()}-{name}.arrows")
        self._lock = threading.Lock()
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            # Lives as long as the partition.
            self._file = os.fdopen(create_private_rw_file(self.path), "w+b", buffering=0)
        except (OSError, UnsafePathError) as exc:
            raise SpillError(f"cannot create spill file {self.path}: {exc}; check spill_dir") from exc
        self._end = 0
        self.bytes_written = 0

    def append(self, data: memoryview) -> SpilledRegion:
        with self._lock:
            try:
                self._file.seek(self._end)
                written = 0
                while written < len(data):
                    written += self._file.write(data[written:])
            except OSError as exc:
                raise SpillError(
                    f"spilling to {self.path} failed: {exc}; free disk space or point spill_dir elsewhere"
                ) from exc
            region = SpilledRegion(self._end, len(data))
            self._end += len(data)
            self.bytes_written += len(data)
            return region

    def read_into(self, region: SpilledRegion, target: memoryview) -> None:
        with self._lock:
            got = 0
            try:
                self._file.seek(region.offset)
                while got < region.length:
                    n = self._file.readinto(target[got : region.length])
                    if not n:
                        raise SpillError(f"spill file {self.path} truncated at {region.offset + got}")
                    got += n
            except (OSError, ValueError) as exc:  # ValueError: the file was closed (released) meanwhile
                raise SpillError(f"reading spill file {self.path} back failed: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
