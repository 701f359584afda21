"""Bounded buffer pools: the only place memory for in-flight shuffle data comes from.

``NetworkBufferPool`` preallocates one large region per process and hands out fixed-size
segments (reused, never freshly allocated: fresh large allocations page-fault heavily).
``LocalBufferPool`` is a partition's or gate's bounded share of it: ``min_segments`` reserved
up-front, borrowing from the global pool up to ``max_segments``.

Accounting happens under a lock; waking listeners happens after releasing it (the Flink
``BufferManager`` / Celeborn deadlock lesson: never call out while holding pool state).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from arrow_shuffle.errors import BufferAccountingError, ChannelClosedError, InsufficientBuffersError
from heartbeat.clock import SYSTEM_CLOCK, Clock


@dataclass(eq=False)
class Segment:
    """One fixed-size slice of the preallocated region."""

    index: int
    memory: pa.Buffer
    view: memoryview


class Recycler(Protocol):
    def recycle_segment(self, segment: Segment) -> None: ...


class Buffer:
    """A lease of one segment plus the payload length written into it.

    ``recycle()`` returns the segment to whoever lent it, exactly once: a second call raises
    ``BufferAccountingError`` (over-release is a bug that must not pass silently).
    """

    __slots__ = ("_recycled", "_recycler", "segment", "size")

    def __init__(self, segment: Segment, recycler: Recycler, size: int = 0) -> None:
        self.segment = segment
        self.size = size
        self._recycler = recycler
        self._recycled = False

    @property
    def capacity(self) -> int:
        return len(self.segment.view)

    def payload(self) -> pa.Buffer:
        """The written bytes as an Arrow buffer (zero-copy view into the segment)."""
        return self.segment.memory.slice(0, self.size)

    def recycle(self) -> None:
        if self._recycled:
            raise BufferAccountingError(f"buffer of segment {self.segment.index} recycled twice")
        self._recycled = True
        self._recycler.recycle_segment(self.segment)


class NetworkBufferPool:
    """Process-wide pool of ``num_segments`` segments of ``segment_size`` bytes."""

    def __init__(self, num_segments: int, segment_size: int) -> None:
        if num_segments < 1 or segment_size < 1:
            raise InsufficientBuffersError("a NetworkBufferPool needs at least one segment of >= 1 byte")
        self.segment_size = segment_size
        self.num_segments = num_segments
        region = pa.allocate_buffer(num_segments * segment_size)
        ctypes.memset(region.address, 0, region.size)  # touch every page once, now
        self._region = region
        whole = memoryview(region)
        views = [whole[i * segment_size :][:segment_size] for i in range(num_segments)]
        # py_buffer over a writable view is a *mutable* Arrow buffer (a slice would not be).
        self._free: list[Segment] = [Segment(i, pa.py_buffer(v), v) for i, v in enumerate(views)]
        self._indices_free = set(range(num_segments))
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []

    @classmethod
    def from_config(cls, network_memory_bytes: int, buffer_size: int) -> NetworkBufferPool:
        return cls(max(1, network_memory_bytes // buffer_size), buffer_size)

    @property
    def num_available(self) -> int:
        with self._lock:
            return len(self._free)

    def reserve(self, count: int, purpose: str) -> list[Segment]:
        """Take ``count`` segments now, or none at all."""
        with self._lock:
            if count > len(self._free):
                raise InsufficientBuffersError(
                    f"{purpose} needs {count} network buffers but only {len(self._free)} of "
                    f"{self.num_segments} are free; raise network_memory_bytes or lower buffer counts"
                )
            taken = [self._free.pop() for _ in range(count)]
            self._indices_free.difference_update(s.index for s in taken)
        return taken

    def try_request(self) -> Segment | None:
        with self._lock:
            if not self._free:
                return None
            segment = self._free.pop()
            self._indices_free.discard(segment.index)
            return segment

    def release(self, segments: list[Segment]) -> None:
        with self._lock:
            for segment in segments:
                if segment.index in self._indices_free:
                    raise BufferAccountingError(f"segment {segment.index} returned to the network pool twice")
                self._indices_free.add(segment.index)
                self._free.append(segment)
            listeners = list(self._listeners)
        for listener in listeners:  # outside the lock
            listener()

    def add_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


class LocalBufferPool:
    """A bounded share of the network pool for one partition or one gate's floating buffers.

    ``request()`` blocks (backpressure) until a segment is free or its deadline on ``clock``
    passes; time spent blocked is accumulated in ``blocked_s``. Buffer listeners registered with
    ``request_or_listen`` are handed recycled segments directly (Flink's floating-buffer
    hand-off); they are called outside the lock.
    """

    def __init__(
        self,
        network: NetworkBufferPool,
        min_segments: int,
        max_segments: int,
        name: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self.clock = clock
        self.network = network
        self.min_segments = min_segments
        self.max_segments = max(max_segments, min_segments)
        self._available: list[Segment] = network.reserve(min_segments, name) if min_segments else []
        self._in_use = 0
        self._closed = False
        self._cond = threading.Condition()
        self._waiters = 0
        self._listeners: list[Callable[[Buffer], bool]] = []
        self.blocked_s = 0.0
        self.peak_in_use = 0
        self.exhausted = threading.Event()
        """Set the first time a ``request()`` had to wait: tests block on it instead of sleeping."""
        network.add_listener(self._on_network_available)

    # -- accounting ------------------------------------------------------------------------
    @property
    def in_use(self) -> int:
        with self._cond:
            return self._in_use

    @property
    def owned(self) -> int:
        """Segments held from the network pool (lent out plus free here)."""
        with self._cond:
            return self._in_use + len(self._available)

    def _take_locked(self) -> Segment | None:
        segment: Segment | None = None
        if self._available:
            segment = self._available.pop()
        elif self._in_use < self.max_segments:
            segment = self.network.try_request()
        if segment is not None:
            self._in_use += 1
            self.peak_in_use = max(self.peak_in_use, self._in_use)
        return segment

    def try_request(self) -> Buffer | None:
        with self._cond:
            self._check_open()
            segment = self._take_locked()
        return None if segment is None else Buffer(segment, self)

    def request(self, timeout_s: float, cancelled: Callable[[], bool] | None = None) -> Buffer:
        """Block until a segment is free (backpressure); raise after ``timeout_s`` on the clock.

        The wait itself is real and re-checks the clock at least every 0.5 s."""
        start = self.clock.monotonic()
        deadline = start + timeout_s
        with self._cond:
            self._waiters += 1
            try:
                while True:
                    self._check_open()
                    if cancelled is not None and cancelled():
                        raise ChannelClosedError(f"{self.name}: buffer request cancelled")
                    segment = self._take_locked()
                    if segment is not None:
                        return Buffer(segment, self)
                    self.exhausted.set()
                    remaining = deadline - self.clock.monotonic()
                    if remaining <= 0:
                        raise InsufficientBuffersError(
                            f"{self.name}: no network buffer free after {timeout_s:.1f}s "
                            f"({self._in_use}/{self.max_segments} in use); is the consumer reading?"
                        )
                    self._cond.wait(min(remaining, 0.5))
            finally:
                self._waiters -= 1
                self.blocked_s += self.clock.monotonic() - start

    def request_or_listen(self, listener: Callable[[Buffer], bool]) -> Buffer | None:
        """A buffer now, or ``None`` and ``listener`` is offered the next recycled one.

        The listener returns ``False`` when it no longer needs a buffer (the buffer then goes
        to the next listener or back to the pool).
        """
        with self._cond:
            self._check_open()
            segment = self._take_locked()
            if segment is None:
                if listener not in self._listeners:
                    self._listeners.append(listener)
                return None
        return Buffer(segment, self)

    def remove_listener(self, listener: Callable[[Buffer], bool]) -> None:
        with self._cond:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def recycle_segment(self, segment: Segment) -> None:
        to_network: list[Segment] = []
        with self._cond:
            self._in_use -= 1
            if self._in_use < 0:
                raise BufferAccountingError(f"{self.name}: more buffers recycled than lent")
            if self._listeners and not self._closed:
                listener = self._listeners.pop(0)
                self._in_use += 1
                handed: Segment | None = segment
            else:
                handed = None
                if self._closed or (
                    self._waiters == 0 and self._in_use + len(self._available) > self.min_segments
                ):
                    to_network.append(segment)
                else:
                    self._available.append(segment)
                self._cond.notify()
        if handed is not None:  # outside the lock: the listener may announce credit (I/O)
            buffer = Buffer(handed, self)
            if not listener(buffer):
                buffer.recycle()
        if to_network:
            self.network.release(to_network)

    def _on_network_available(self) -> None:
        with self._cond:
            if self._waiters:
                self._cond.notify_all()
            listeners = bool(self._listeners)
        if listeners:
            self._serve_listeners()

    def _serve_listeners(self) -> None:
        while True:
            with self._cond:
                if self._closed or not self._listeners:
                    return
                segment = self._take_locked()
                if segment is None:
                    return
                listener = self._listeners.pop(0)
            buffer = Buffer(segment, self)
            if not listener(buffer):
                buffer.recycle()

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"{self.name}: buffer pool is closed")

    def close(self) -> None:
        """Return free segments now; lent ones go back to the network pool as they are recycled."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            free, self._available = self._available, []
            self._listeners.clear()
            self._cond.notify_all()
        self.network.remove_listener(self._on_network_available)
        if free:
            self.network.release(free)
