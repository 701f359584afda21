"""``ResultPartition``: a map task's output, one subpartition per consumer.

A partition is pipelined (Flink's PIPELINED kind, the only one here): readable while it is
written, and bounded: when the partition's buffer share is exhausted the writer blocks
(backpressure) until consumers free buffers. Nothing is materialised in the engine: the Spark
DataFrame API's materialised mode writes map-output files (``spark_plugin.shuffle.map_output``)
that the agent streams through partitions like these, and its pipelined mode serves them directly.
"""

from __future__ import annotations

import pyarrow as pa

from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ChannelClosedError, ShuffleConfigError
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.stats import PartitionStats, StatsCell
from arrow_shuffle.subpartition import Subpartition
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock


class ResultPartition:
    """Buffers of one map output, split into ``num_subpartitions`` queues.

    ``clock`` measures the writer's flush timeout and waits for buffers (``buffer_request_timeout_s``,
    ``blocked_on_pool_s``); a ``PartitionServer`` streams it on the server's clock.

    A partition holds at most ``partition_pool_share`` of the network pool (never less than its
    reserved minimum), so one fast writer with a slow reader cannot take every buffer.
    With ``reserve_now=False`` creating it takes no buffers: ``reserve_buffers()`` (or the first
    write) queues for them, first come first served, for up to ``buffer_reserve_timeout_s``."""

    def __init__(
        self,
        partition_id: PartitionId,
        num_subpartitions: int,
        schema: pa.Schema,
        pool: NetworkBufferPool,
        config: ShuffleConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reserve_now: bool = True,
    ) -> None:
        if num_subpartitions < 1:
            raise ShuffleConfigError(f"num_subpartitions={num_subpartitions} is out of range: allowed >= 1")
        self.config = config or ShuffleConfig(buffer_size=pool.segment_size)
        if self.config.buffer_size != pool.segment_size:
            raise ShuffleConfigError(
                f"buffer_size={self.config.buffer_size} must equal the pool's segment size "
                f"{pool.segment_size}"
            )
        self.partition_id = partition_id
        self.clock = clock
        self.schema = schema
        self.num_subpartitions = num_subpartitions
        minimum = num_subpartitions + 1  # one open buffer each, plus one spare
        maximum = num_subpartitions * self.config.buffers_per_subpartition
        maximum += self.config.floating_buffers_per_gate
        maximum = min(maximum, int(self.config.partition_pool_share * pool.num_segments))
        self.pool = LocalBufferPool(
            pool,
            minimum,
            max(minimum, maximum),
            f"partition {partition_id}",
            clock=clock,
            reserve_now=reserve_now,
        )
        self.subpartitions = [Subpartition(partition_id, i) for i in range(num_subpartitions)]
        self._stats = StatsCell(PartitionStats())
        self._finished = False
        self._released = False

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def released(self) -> bool:
        return self._released

    @property
    def connected(self) -> bool:
        """Whether a reader ever attached to one of its subpartitions."""
        return any(sub.attached for sub in self.subpartitions)

    @property
    def consumed(self) -> bool:
        """Whether every subpartition's reader was handed end-of-partition."""
        return all(sub.consumed for sub in self.subpartitions)

    def reserve_buffers(self, timeout_s: float | None = None) -> float:
        """Queue for the reserved buffers (first come, first served) unless already held; returns
        the seconds it queued. ``InsufficientBuffersError`` after ``timeout_s`` (default
        ``buffer_reserve_timeout_s``), ``ChannelClosedError`` if released meanwhile."""
        if self._released:
            raise ChannelClosedError(f"partition {self.partition_id} was released")
        wait = self.config.buffer_reserve_timeout_s if timeout_s is None else timeout_s
        return self.pool.reserve(wait)

    def stats(self) -> PartitionStats:
        snapshot: PartitionStats = self._stats.snapshot()
        snapshot.blocked_on_pool_s = self.pool.blocked_s
        return snapshot

    def record(self, **deltas: float) -> None:
        self._stats.add(**deltas)

    def request_buffer(self) -> Buffer:
        """A free buffer for the writer: blocks when none is free (backpressure)."""
        if self._released:
            raise ChannelClosedError(f"partition {self.partition_id} was released")
        return self.pool.request(self.config.buffer_request_timeout_s, cancelled=lambda: self._released)

    def add(self, subpartition: int, buffer: Buffer) -> None:
        self.record(buffers_written=1, bytes_written=buffer.size)
        self.subpartitions[subpartition].add(buffer)

    def finish(self) -> None:
        """All data is written: consumers see end-of-partition after the last buffer."""
        self._finished = True
        for sub in self.subpartitions:
            sub.finish()
        self.pool.drain()  # nothing more is written

    def release(self) -> None:
        """Drop all data and return every buffer (after consumption, or on cancel)."""
        self._release(None)

    def fail(self, reason: str) -> None:
        """The producer failed or gave up: readers get ``ProducerFailedError`` naming ``reason``
        (never end-of-partition), and every buffer is returned as by ``release``."""
        self._release(reason)

    def _release(self, failure: str | None) -> None:
        if self._released:
            return
        self._released = True
        for sub in self.subpartitions:
            sub.release(failure)
        self.pool.close()
