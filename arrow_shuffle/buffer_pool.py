"""Bounded buffer pools: the only place memory for in-flight shuffle data comes from.

``NetworkBufferPool`` preallocates one large region per process and hands out fixed-size
segments (reused, never freshly allocated: fresh large allocations page-fault heavily).
``LocalBufferPool`` is a partition's or gate's bounded share of it: ``min_segments`` reserved
up-front, borrowing from the global pool up to ``max_segments``.

Reservations either happen now or fail (``reserve``), or queue first come, first served
(``enqueue`` + ``Reservation.wait``, with a deadline): a process serving many streams from one pool
(an executor agent) lets each new stream wait its turn instead of failing. While a reservation is
queued, segments returned to the pool go to the head of the queue, not to floating requests
(``try_request`` answers ``None``), and local pools hand their surplus back: the reserved minimum
of every admitted stream guarantees it progresses, so the queue always drains.

Accounting happens under a lock; waking listeners happens after releasing it (the Flink
``BufferManager`` / Celeborn deadlock lesson: never call out while holding pool state).
"""

from __future__ import annotations

import ctypes
import enum
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from arrow_shuffle.errors import BufferAccountingError, ChannelClosedError, InsufficientBuffersError
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock


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


class _State(enum.Enum):
    QUEUED = "queued"
    GRANTED = "granted"
    CLAIMED = "claimed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"


@dataclass(eq=False)
class Reservation:
    """A place in a ``NetworkBufferPool``'s FIFO queue for ``count`` segments (``enqueue``).

    ``wait`` returns the segments once granted, or raises at the deadline; ``cancel`` (from any
    thread) ends the wait with ``ChannelClosedError``."""

    pool: NetworkBufferPool
    count: int
    purpose: str
    clock: Clock
    since: float
    """``clock.monotonic()`` when it was queued."""
    state: _State = _State.QUEUED
    segments: list[Segment] = field(default_factory=list)
    waited_s: float = 0.0
    """How long it queued (set when granted)."""
    event: threading.Event = field(default_factory=threading.Event)

    def wait(self, timeout_s: float) -> list[Segment]:
        """The granted segments; ``InsufficientBuffersError`` naming what it waited for when none
        came within ``timeout_s`` on the clock (re-read at least every 0.5 s of real time)."""
        deadline = self.since + timeout_s
        while True:
            if self.pool.claim(self):
                return self.segments
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                error = self.pool.time_out(self, timeout_s)
                if error is not None:
                    raise error
            self.event.wait(min(max(remaining, 0.0), 0.5))

    def cancel(self) -> None:
        self.pool.cancel(self)


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
        self._queue: deque[Reservation] = deque()
        self.reservations_queued = 0
        """Reservations that had to wait (were not granted when queued)."""
        self.reservations_timed_out = 0
        self.queue_peak = 0
        """Most reservations ever waiting at once."""
        self.reservation_wait_max_s = 0.0
        self.reservation_wait_total_s = 0.0

    @classmethod
    def from_config(cls, network_memory_bytes: int, buffer_size: int) -> NetworkBufferPool:
        return cls(max(1, network_memory_bytes // buffer_size), buffer_size)

    @property
    def num_available(self) -> int:
        with self._lock:
            return len(self._free)

    @property
    def queued(self) -> int:
        """Reservations waiting now (read without the lock: a hint, exact under it)."""
        return len(self._queue)

    def reserve(self, count: int, purpose: str) -> list[Segment]:
        """Take ``count`` segments now, or none at all (never ahead of queued reservations)."""
        with self._lock:
            if self._queue or count > len(self._free):
                queued = f", {len(self._queue)} reservations queued before it" if self._queue else ""
                raise InsufficientBuffersError(
                    f"{purpose} needs {count} network buffers but only {len(self._free)} of "
                    f"{self.num_segments} are free{queued}; raise network_memory_bytes or lower buffer counts"
                )
            return self._take_locked(count)

    def enqueue(self, count: int, purpose: str, clock: Clock = SYSTEM_CLOCK) -> Reservation:
        """Queue (first come, first served) for ``count`` segments; granted at once when nothing
        is queued and they are free. ``Reservation.wait`` collects them."""
        if count > self.num_segments:
            raise InsufficientBuffersError(
                f"{purpose} needs {count} network buffers but the pool has only {self.num_segments} "
                f"of {self.segment_size} bytes; raise network_memory_bytes"
            )
        reservation = Reservation(self, count, purpose, clock, clock.monotonic())
        with self._lock:
            self._queue.append(reservation)
            granted = self._grant_locked()
            if reservation.state is _State.QUEUED:
                self.reservations_queued += 1
                self.queue_peak = max(self.queue_peak, len(self._queue))
        for event in granted:  # outside the lock
            event.set()
        return reservation

    def claim(self, reservation: Reservation) -> bool:
        """Whether ``reservation`` was granted (its segments are then the caller's); raises
        ``ChannelClosedError`` if it was cancelled."""
        with self._lock:
            if reservation.state is _State.GRANTED:
                reservation.state = _State.CLAIMED
                return True
            if reservation.state is _State.CANCELLED:
                raise ChannelClosedError(f"{reservation.purpose}: buffer reservation cancelled")
            if reservation.state is not _State.QUEUED:
                state = reservation.state.value
                raise BufferAccountingError(f"{reservation.purpose}: reservation already {state}")
            return False

    def time_out(self, reservation: Reservation, timeout_s: float) -> InsufficientBuffersError | None:
        """Leave the queue at the deadline: the error naming what it waited for, or ``None`` if it
        was granted just before."""
        with self._lock:
            if reservation.state is not _State.QUEUED:
                return None
            ahead = self._queue.index(reservation)
            error = InsufficientBuffersError(
                f"{reservation.purpose} waited {timeout_s:.1f}s in the queue for {reservation.count} "
                f"network buffers of {self.segment_size} bytes and none came free ({len(self._free)} of "
                f"{self.num_segments} free, {ahead} reservations ahead of it): the pool's buffers are held "
                "by streams whose readers are slow or stuck; raise network_memory_bytes or the wait"
            )
            self._queue.remove(reservation)
            reservation.state = _State.TIMED_OUT
            self.reservations_timed_out += 1
            granted = self._grant_locked()  # those behind it may fit now
        for event in granted:
            event.set()
        return error

    def cancel(self, reservation: Reservation) -> None:
        """Withdraw ``reservation``: its waiter gets ``ChannelClosedError``; segments granted but
        not yet claimed return to the pool."""
        back: list[Segment] = []
        with self._lock:
            if reservation.state is _State.QUEUED:
                self._queue.remove(reservation)
            elif reservation.state is _State.GRANTED:
                back, reservation.segments = reservation.segments, []
            else:
                return
            reservation.state = _State.CANCELLED
        reservation.event.set()
        if back:
            self.release(back)
        else:
            self._wake_queue()

    def _wake_queue(self) -> None:
        with self._lock:
            granted = self._grant_locked()
        for event in granted:
            event.set()

    def _take_locked(self, count: int) -> list[Segment]:
        taken = [self._free.pop() for _ in range(count)]
        self._indices_free.difference_update(s.index for s in taken)
        return taken

    def _grant_locked(self) -> list[threading.Event]:
        """Serve the queue's head while its whole count is free (strict FIFO: a large request is
        never overtaken by smaller ones); the events to set once the lock is released."""
        granted = []
        while self._queue and self._queue[0].count <= len(self._free):
            reservation = self._queue.popleft()
            reservation.segments = self._take_locked(reservation.count)
            reservation.state = _State.GRANTED
            reservation.waited_s = reservation.clock.monotonic() - reservation.since
            self.reservation_wait_total_s += reservation.waited_s
            self.reservation_wait_max_s = max(self.reservation_wait_max_s, reservation.waited_s)
            granted.append(reservation.event)
        return granted

    def try_request(self) -> Segment | None:
        """One floating segment, unless none is free or reservations are queued (they come first)."""
        with self._lock:
            if not self._free or self._queue:
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
            granted = self._grant_locked()
            listeners = list(self._listeners) if self._free else []
        for event in granted:  # outside the lock
            event.set()
        for listener in listeners:
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

    With ``reserve_now=False`` the minimum is not taken in the constructor: ``reserve()`` (or the
    first ``request()``) queues for it in the network pool, so creating the pool never fails for
    lack of buffers and never blocks; until then nothing floats either. ``drain()`` (the writer is
    done) hands every segment back as it is recycled, the reserved minimum included.
    """

    def __init__(
        self,
        network: NetworkBufferPool,
        min_segments: int,
        max_segments: int,
        name: str,
        *,
        clock: Clock = SYSTEM_CLOCK,
        reserve_now: bool = True,
    ) -> None:
        self.name = name
        self.clock = clock
        self.network = network
        self.min_segments = min_segments
        self.max_segments = max(max_segments, min_segments)
        now = reserve_now and min_segments > 0
        self._available: list[Segment] = network.reserve(min_segments, name) if now else []
        self._reserved = reserve_now or min_segments == 0
        self._reservation: Reservation | None = None
        self._reserve_lock = threading.Lock()
        self._in_use = 0
        self._closed = False
        self._draining = False
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

    @property
    def reserved(self) -> bool:
        """Whether the reserved minimum is held (always, unless created with ``reserve_now=False``)."""
        with self._cond:
            return self._reserved

    def reserve(self, timeout_s: float) -> float:
        """Queue in the network pool (first come, first served) for the reserved minimum; returns
        how long it queued. ``InsufficientBuffersError`` naming it after ``timeout_s`` on the clock;
        ``ChannelClosedError`` if the pool is closed meanwhile. A no-op once reserved."""
        with self._reserve_lock:
            with self._cond:
                self._check_open()
                if self._reserved:
                    return 0.0
                reservation = self.network.enqueue(self.min_segments, self.name, self.clock)
                self._reservation = reservation
            try:
                segments = reservation.wait(timeout_s)
            finally:
                with self._cond:
                    self._reservation = None
            with self._cond:
                if not self._closed:
                    self._available.extend(segments)
                    self._reserved = True
                    self._cond.notify_all()
                    segments = []
        if segments:  # closed between the grant and here
            self.network.release(segments)
            self._check_open()
        self._serve_listeners()
        return reservation.waited_s

    def drain(self) -> None:
        """No more requests are coming: free segments go back to the network pool now, lent ones
        as they are recycled (the reserved minimum too), so waiting streams get them sooner."""
        with self._cond:
            self._draining = True
            free, self._available = self._available, []
        if free:
            self.network.release(free)

    def _take_locked(self) -> Segment | None:
        segment: Segment | None = None
        if self._available:
            segment = self._available.pop()
        elif self._reserved and self._in_use < self.max_segments:
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

        The wait itself is real and re-checks the clock at least every 0.5 s. A pool created with
        ``reserve_now=False`` first queues for its minimum (``reserve``), within the same deadline."""
        with self._cond:  # the common case, a buffer free at once: no clock, no wait to time
            if self._reserved and not self._closed and (cancelled is None or not cancelled()):
                segment = self._take_locked()
                if segment is not None:
                    return Buffer(segment, self)
        start = self.clock.monotonic()
        deadline = start + timeout_s
        if not self.reserved:
            self.reserve(timeout_s)
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
                kept = self._in_use + len(self._available)  # owned if this segment goes back
                # Uncontended, one segment beyond the minimum stays cached here unless our own
                # writer waits for more; with reservations queued in the network pool everything
                # above the reserved minimum goes back (they come first).
                if (
                    self._closed
                    or self._draining
                    or (kept >= self.min_segments and self.network.queued > 0)
                    or (kept > self.min_segments and self._waiters == 0)
                ):
                    to_network.append(segment)
                else:
                    self._available.append(segment)
                if self._waiters:  # a writer blocked in request(); a receiver's pool has none
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
            reservation = self._reservation
        if reservation is not None:  # still queued: leave the queue, the waiter gets ChannelClosedError
            reservation.cancel()
        self.network.remove_listener(self._on_network_available)
        if free:
            self.network.release(free)
