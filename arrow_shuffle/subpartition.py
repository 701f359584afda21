"""One subpartition's queue of finished buffers, its backlog, and its single reader.

The writer appends finished buffers; one reader (the ``StreamSender`` of a remote reader's
stream) polls them in order, while they are written.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from arrow_shuffle.buffer_pool import Buffer
from arrow_shuffle.errors import ChannelClosedError, PartitionNotFoundError, ProducerFailedError, ShuffleError

if TYPE_CHECKING:
    from arrow_shuffle.ids import PartitionId


class Subpartition:
    """Queue of buffers for one consumer, with Flink's backlog (buffers queued)."""

    def __init__(self, partition_id: PartitionId, index: int) -> None:
        self.partition_id = partition_id
        self.index = index
        self._queue: deque[Buffer] = deque()
        self._lock = threading.Lock()
        self._finished = False
        self._released = False
        self._failure: str | None = None  # why the producer failed, if it did (vs. a plain release)
        self._reader: Callable[[], None] | None = None
        self._has_reader = False
        self._consumed = False
        self.buffers_added = 0
        self.bytes_added = 0

    # -- writer side ---------------------------------------------------------------------------
    def add(self, buffer: Buffer) -> None:
        with self._lock:
            if self._released or self._finished:
                buffer.recycle()
                raise ChannelClosedError(f"subpartition {self.index} of {self.partition_id} is closed")
            self._queue.append(buffer)
            self.buffers_added += 1
            self.bytes_added += buffer.size
            notify = self._reader
        if notify is not None:
            notify()

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            notify = self._reader
        if notify is not None:
            notify()

    # -- reader side ---------------------------------------------------------------------------
    def attach_reader(self, on_available: Callable[[], None]) -> None:
        """Register the one reader; ``on_available`` is called (outside locks) on new data/finish."""
        with self._lock:
            if self._released:
                if self._failure is not None:
                    raise self._closed_error()
                raise PartitionNotFoundError(f"subpartition {self.index} of {self.partition_id} was released")
            if self._has_reader:
                raise PartitionNotFoundError(
                    f"subpartition {self.index} of {self.partition_id} is already being consumed"
                )
            self._has_reader = True
            self._reader = on_available
        on_available()

    @property
    def attached(self) -> bool:
        """Whether a reader ever attached (it may have gone since)."""
        with self._lock:
            return self._has_reader

    @property
    def consumed(self) -> bool:
        """Whether the reader was handed end-of-partition."""
        with self._lock:
            return self._consumed

    def detach_reader(self) -> None:
        with self._lock:
            self._reader = None

    def poll(self, allow_data: bool = True) -> tuple[Buffer | None, int, bool]:
        """``(buffer or None, backlog after it, end_of_partition)``; never blocks on the writer.

        With ``allow_data=False`` (no credit) only end-of-partition is reported, data stays queued.
        """
        with self._lock:
            if self._released:
                raise self._closed_error()
            if not self._queue:
                self._consumed = self._finished
                return None, 0, self._finished
            if not allow_data:
                return None, len(self._queue), False
            buffer = self._queue.popleft()
            return buffer, len(self._queue), False

    @property
    def backlog(self) -> int:
        with self._lock:
            return len(self._queue)

    def release(self, failure: str | None = None) -> None:
        """Drop queued data and return every buffer (cancel / release path).

        With ``failure`` (the producer failed or aborted) the reader gets ``ProducerFailedError``
        carrying it instead of ``ChannelClosedError``; the first reason given is kept.
        """
        with self._lock:
            if failure is not None and not self._released:
                self._failure = failure
            self._released = True
            buffers, self._queue = list(self._queue), deque()
            notify = self._reader
        for buffer in buffers:
            buffer.recycle()
        if notify is not None:
            notify()

    def _closed_error(self) -> ShuffleError:
        """The error a reader of a released subpartition gets (call with ``_lock`` held or after)."""
        what = f"subpartition {self.index} of {self.partition_id}"
        if self._failure is not None:
            return ProducerFailedError(f"the producer of {what} failed: {self._failure}")
        return ChannelClosedError(f"{what} was released")
