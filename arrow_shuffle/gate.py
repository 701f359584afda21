"""``InputGate``: one reduce task's input, a set of remote channels.

Each channel (``RemoteChannelSpec`` -> ``RemoteInputChannel``) reads one subpartition from a
``PartitionServer`` (usually in another process) over a connection, with credits.
Channels report "I have data" into one queue, so batches are handed out in arrival order
across channels (a few buffers of one channel at a time, ``_BURST``); the first channel failure
is raised to the reader (and every channel is then closed, returning its buffers). The channels
share the gate's floating buffers.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, NetworkBufferPool
from arrow_shuffle.codec import decode_buffer
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ChannelClosedError, ShuffleConfigError, ShuffleError
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.remote_channel import RemoteInputChannel
from arrow_shuffle.stats import GateStats, StatsCell
from arrow_shuffle.transport import TcpTransport, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class RemoteChannelSpec:
    """Read ``subpartition`` of ``partition_id`` from the ``PartitionServer`` at ``address``
    (another process, usually another host)."""

    address: tuple[str, int]
    partition_id: PartitionId
    subpartition: int


_BURST = 4
"""Buffers taken from one channel in a row before it goes back in the queue behind the others:
the queue's lock and wake-up once per few buffers, not per buffer, while no channel waits long."""


class InputGate:
    """Iterate ``pyarrow.RecordBatch``es from all channels until every one has ended.

    Batches never view a network buffer: large remote payloads are received into Arrow memory the
    batches own (``codec.ReceiveBlocks``), the rest copied out once; each buffer's credit goes back
    at decode, so callers may keep batches as long as they like.
    ``clock`` measures the remote channels' peer timeout and the gate's time blocked on data."""

    def __init__(
        self,
        channels: Sequence[RemoteChannelSpec],
        schema: pa.Schema,
        pool: NetworkBufferPool,
        config: ShuffleConfig | None = None,
        secret: str | bytes | None = None,
        transport: Transport | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.schema = schema
        self.clock = clock
        self.config = config or ShuffleConfig(buffer_size=pool.segment_size)
        if channels and not secret:
            raise ShuffleConfigError("remote channels need the application secret")
        self._cond = threading.Condition()
        self._with_data: deque[int] = deque()
        self._queued: set[int] = set()
        self._closed = False
        self._ended: set[int] = set()
        self._stats = StatsCell(GateStats())
        self.floating = LocalBufferPool(
            pool, 0, self.config.floating_buffers_per_gate, "gate floating buffers", clock=clock
        )
        exclusive = pool.reserve(len(channels) * self.config.exclusive_buffers_per_channel, "input gate")
        per = self.config.exclusive_buffers_per_channel
        self._channels: list[RemoteInputChannel] = []
        for index, spec in enumerate(channels):
            mine, exclusive = exclusive[:per], exclusive[per:]
            self._channels.append(
                RemoteInputChannel(
                    index,
                    spec.address,
                    spec.partition_id,
                    spec.subpartition,
                    mine,
                    pool,
                    self.floating,
                    self.config,
                    as_bytes(secret or b""),
                    transport or TcpTransport(),
                    clock,
                )
            )
        self._started = False

    @property
    def channels(self) -> list[RemoteInputChannel]:
        return list(self._channels)

    def stats(self) -> GateStats:
        snapshot: GateStats = self._stats.snapshot()
        remote = [c.stats() for c in self._channels]
        snapshot.credits_announced = sum(r.credits_announced for r in remote)
        snapshot.buffers_without_credit = sum(r.buffers_without_credit for r in remote)
        snapshot.max_in_flight = max((r.max_in_flight for r in remote), default=0)
        snapshot.max_in_flight_over_credit = max((r.max_in_flight_over_credit for r in remote), default=0)
        return snapshot

    def _notify(self, index: int) -> None:
        with self._cond:
            if index not in self._queued:
                self._queued.add(index)
                self._with_data.append(index)
                self._cond.notify()

    def start(self) -> None:
        """Send every partition request (idempotent; iteration starts the gate too)."""
        if self._started:
            return
        self._started = True
        try:
            for channel in self._channels:
                channel.start(self._notify)
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self.start()
        try:
            while len(self._ended) < len(self._channels):
                index = self._next_channel()
                channel = self._channels[index]
                for _ in range(_BURST):
                    buffer, end = channel.poll()
                    if buffer is None:
                        break
                    yield from self._decode(channel.where, buffer)
                else:
                    self._notify(index)  # it may have more; re-queued behind the others
                    continue
                if end and index not in self._ended:
                    self._ended.add(index)
                    self._stats.add(channels_finished=1)
        except BaseException:
            self.close()
            raise
        self.close()

    def read_all(self) -> pa.Table:
        return pa.Table.from_batches(list(self), schema=self.schema)

    def _next_channel(self) -> int:
        with self._cond:
            if self._with_data:  # the common case while data flows: no wait to time
                index = self._with_data.popleft()
                self._queued.discard(index)
                return index
        started = self.clock.monotonic()
        with self._cond:
            while not self._with_data:
                if self._closed:
                    raise ChannelClosedError("input gate is closed")
                self._cond.wait(0.5)
            index = self._with_data.popleft()
            self._queued.discard(index)
        self._stats.add(blocked_on_data_s=self.clock.monotonic() - started)
        return index

    def _decode(self, where: str, buffer: Buffer) -> list[pa.RecordBatch]:
        size = buffer.size
        batches = decode_buffer(buffer, self.schema, where)
        rows = sum(b.num_rows for b in batches)
        self._stats.add(
            buffers_received=1, bytes_received=size, batches_received=len(batches), rows_received=rows
        )
        return batches

    def close(self) -> None:
        """Cancel unfinished channels and return every buffer. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        errors: list[ShuffleError] = []
        for channel in self._channels:
            try:
                channel.close()
            except ShuffleError as exc:
                errors.append(exc)
        self.floating.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> InputGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
