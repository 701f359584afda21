"""``ResultPartition``: a map task's output, one subpartition per consumer.

PIPELINED partitions are bounded: when the partition's buffer share is exhausted the writer
blocks (backpressure) until consumers free buffers. BLOCKING partitions are materialised:
buffers stay in memory up to ``blocking_memory_bytes`` and are spilled to disk beyond that, so
they hold however much is written; they become readable once finished.

These are the engine's two kinds (Flink's). The Spark DataFrame API does not use BLOCKING: its
materialised mode writes map-output files (``spark_plugin.shuffle.map_output``) that the agent
streams through PIPELINED partitions, and its streaming mode uses PIPELINED partitions directly.
"""

from __future__ import annotations

import enum
import threading

import pyarrow as pa

from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ChannelClosedError, ShuffleConfigError
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.spill import SpillFile
from arrow_shuffle.stats import PartitionStats, StatsCell
from arrow_shuffle.subpartition import Subpartition
from heartbeat.clock import SYSTEM_CLOCK, Clock


class PartitionKind(enum.Enum):
    """How a partition holds its data until it is read."""

    PIPELINED = "pipelined"
    """Bounded, readable while written: the writer blocks when readers fall behind."""
    BLOCKING = "blocking"
    """Materialised, readable once finished: memory up to ``blocking_memory_bytes``, then spilled
    to ``spill_dir``; the writer never waits for readers."""


class ResultPartition:
    """Buffers of one map output, split into ``num_subpartitions`` queues.

    ``clock`` measures the writer's flush timeout and waits for buffers (``buffer_request_timeout_s``,
    ``blocked_on_pool_s``); a ``PartitionServer`` streams it on the server's clock.

    A PIPELINED partition holds at most ``partition_pool_share`` of the network pool (never less
    than its reserved minimum), so one fast writer with a slow reader cannot take every buffer.
    With ``reserve_now=False`` creating it takes no buffers: ``reserve_buffers()`` (or the first
    write) queues for them, first come first served, for up to ``buffer_reserve_timeout_s``."""

    def __init__(
        self,
        partition_id: PartitionId,
        num_subpartitions: int,
        schema: pa.Schema,
        pool: NetworkBufferPool,
        kind: PartitionKind = PartitionKind.PIPELINED,
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
        self.kind = kind
        self.num_subpartitions = num_subpartitions
        minimum = num_subpartitions + 1  # one open buffer each, plus one to read spills back
        if kind is PartitionKind.PIPELINED:
            maximum = num_subpartitions * self.config.buffers_per_subpartition
            maximum += self.config.floating_buffers_per_gate
            maximum = min(maximum, int(self.config.partition_pool_share * pool.num_segments))
        else:
            maximum = self.config.blocking_memory_bytes // self.config.buffer_size
        self.pool = LocalBufferPool(
            pool,
            minimum,
            max(minimum, maximum),
            f"partition {partition_id}",
            clock=clock,
            reserve_now=reserve_now,
        )
        readable = kind is PartitionKind.PIPELINED
        self.subpartitions = [
            Subpartition(partition_id, i, self.pool, readable, self.config.buffer_request_timeout_s)
            for i in range(num_subpartitions)
        ]
        self._spill: SpillFile | None = None
        self._spill_lock = threading.Lock()
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
        """A free buffer for the writer: blocks (PIPELINED) or spills (BLOCKING) when none is free."""
        if self._released:
            raise ChannelClosedError(f"partition {self.partition_id} was released")
        if self.kind is PartitionKind.BLOCKING:
            while True:
                buffer = self.pool.try_request()
                if buffer is not None:
                    return buffer
                if not self._spill_one():
                    break
        return self.pool.request(self.config.buffer_request_timeout_s, cancelled=lambda: self._released)

    def _spill_one(self) -> bool:
        with self._spill_lock:
            if self._spill is None:
                self._spill = SpillFile(self.config.spill_dir, f"{self.partition_id}".replace("/", "_"))
            victim = max(self.subpartitions, key=lambda s: s.in_memory_buffers())
            spilled = victim.spill_oldest(self._spill)
        if spilled:
            self.record(spill_bytes=spilled, spill_buffers=1)
        return spilled > 0

    def add(self, subpartition: int, buffer: Buffer) -> None:
        self.record(buffers_written=1, bytes_written=buffer.size)
        self.subpartitions[subpartition].add(buffer)

    def finish(self) -> None:
        """All data is written: consumers see end-of-partition after the last buffer."""
        if self.kind is PartitionKind.BLOCKING:
            # Leave one free buffer per subpartition so every reader can load its spilled data.
            headroom = self.pool.max_segments - self.num_subpartitions
            while self.pool.in_use > headroom and self._spill_one():
                pass
        self._finished = True
        for sub in self.subpartitions:
            sub.finish()
        if self.kind is PartitionKind.PIPELINED:  # nothing more is written or read back from disk
            self.pool.drain()

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
        with self._spill_lock:
            if self._spill is not None:
                self._spill.close()
