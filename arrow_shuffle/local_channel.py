"""``LocalInputChannel``: reads a subpartition of a ``ResultPartition`` object that lives in the
same Python process, from its in-memory queue: no socket, no file, no credit.

As in Flink, the consumer takes finished buffers straight from the subpartition queue and
recycles them into the producer's pool once decoded. Closing it before end-of-partition releases
the subpartition, as the server does when a remote reader goes away.

"Local" means same process, not same host: a reader in another process on the same host uses a
``RemoteInputChannel`` over loopback (the Spark path's host-local reads of map-output files from
disk are a different thing again, in ``spark_plugin.shuffle.tasks``).
"""

from __future__ import annotations

from collections.abc import Callable

from arrow_shuffle.buffer_pool import Buffer
from arrow_shuffle.errors import ChannelClosedError, ProducerFailedError, describe
from arrow_shuffle.partition import ResultPartition


class LocalInputChannel:
    """In-process channel over ``partition.subpartitions[subpartition]`` (the partition object
    itself, written by a ``RecordWriter`` in this process)."""

    def __init__(self, index: int, partition: ResultPartition, subpartition: int) -> None:
        self.index = index
        self.partition = partition
        self.subpartition = partition.subpartitions[subpartition]
        self.where = describe(f"{partition.partition_id}#{subpartition}", "local")
        self._on_data: Callable[[int], None] | None = None
        self._closed = False
        self._ended = False

    def start(self, on_data: Callable[[int], None]) -> None:
        self._on_data = on_data
        try:
            self.subpartition.attach_reader(lambda: on_data(self.index))
        except ProducerFailedError as exc:
            raise ProducerFailedError(f"{exc} {self.where}") from exc

    def poll(self) -> tuple[Buffer | None, bool]:
        """Next buffer (``None`` if none yet) and whether the partition ended."""
        if self._closed:
            raise ChannelClosedError(f"channel closed {self.where}")
        try:
            buffer, _backlog, end = self.subpartition.poll()
        except ProducerFailedError as exc:
            raise ProducerFailedError(f"{exc} {self.where}") from exc
        self._ended = end
        return buffer, end

    def close(self) -> None:
        """Cancel. A reader that leaves before end-of-partition releases the subpartition (as the
        server does for a remote one), so a producer blocked on the pool fails fast, not after
        ``buffer_request_timeout_s``."""
        if self._closed:
            return
        self._closed = True
        self.subpartition.detach_reader()
        if self._on_data is not None and not self._ended:
            self.subpartition.release()
