"""``RemoteInputChannel``: reads one subpartition from a ``PartitionServer`` in another process
(usually on another host) over one connection, with credit-based flow control.

Flink's rules, in order of appearance: the partition request carries the initial credit (the
exclusive buffers); every BUFFER frame must carry the next sequence number (else
``SequenceGapError``) and find announced, unused credit and a free buffer here (else the sender
broke the credit contract: counted in ``stats().buffers_without_credit``, then
``CreditViolationError``); its backlog makes us request floating buffers up to
``backlog + initial_credit``; every buffer gained is one unannounced credit, announced once that
count reaches what the sender holds unspent (Flink announces when the count leaves zero:
one message, and a wake-up on both sides, per buffer; we batch them while the sender still has
enough to go on, and look again after every buffer received). The consumer is woken once a few
buffers are in, or at once when no more are coming (no backlog, no credit, a keepalive). The
receiver thread's failure is sticky: stored and raised by the next ``poll``. A producer that
stops sending, keepalives included, for ``peer_timeout_s`` on the gate's clock is lost
(``PeerLostError``, decided by the connection, see ``transport``).

A large BUFFER payload is received straight into Arrow memory, which its decoded batches then
view (``codec.ReceiveBlocks``, ``codec.ArrowPayload``); the buffer its credit stands for is held
until the payload is consumed, exactly as if the bytes were in it, so the credit rules above count
the same.

Every BUFFER payload is checked against the checksum its sender put in the frame (``frames``) by the
receiver thread, as soon as it is in and before it is queued, so nothing decodes a damaged one: a
mismatch is a ``FrameChecksumError`` (naming the stream, the buffer's number and both checksums)
that ends the channel as any corrupt frame does. With ``config.checksum`` (the default) a BUFFER
frame without a checksum is refused too, before its payload is read: a bit that clears the flag
must not turn the check off.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable

import pyarrow as pa

from arrow_shuffle.auth import client_handshake
from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, NetworkBufferPool, Segment
from arrow_shuffle.checksum import digest
from arrow_shuffle.codec import ArrowPayload, blocks_for
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_schema import PARTITION_REQUEST, encode_json
from arrow_shuffle.credit import ReceiverLedger, UnannouncedCredit
from arrow_shuffle.errors import (
    ChannelClosedError,
    CreditViolationError,
    FrameChecksumError,
    OversizedFrameError,
    PartitionNotFoundError,
    ProducerFailedError,
    RemoteFailureError,
    SequenceGapError,
    ShuffleAuthenticationError,
    ShuffleError,
    ShuffleProtocolError,
    describe,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, FrameHeader, Kind
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.stats import ChannelStats
from arrow_shuffle.transport import Connection, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

_WAKE_AFTER = 3
"""Buffers a channel queues before it wakes the consumer, while more are on their way (the sender
said it has a backlog and has credit for it): one wake-up per few buffers, not one per buffer."""


class RemoteInputChannel:
    """One subpartition of a ``ResultPartition`` served by a ``PartitionServer`` (usually in another
    process), received over one connection."""

    def __init__(
        self,
        index: int,
        address: tuple[str, int],
        partition_id: PartitionId,
        subpartition: int,
        exclusive: list[Segment],
        network: NetworkBufferPool,
        floating: LocalBufferPool,
        config: ShuffleConfig,
        secret: bytes,
        transport: Transport,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.index = index
        self.address = address
        self.partition_id = partition_id
        self.subpartition = subpartition
        self.config = config
        self.initial_credit = len(exclusive)
        self.where = describe(f"{partition_id}#{subpartition}", f"{address[0]}:{address[1]}")
        self._network = network
        self._floating = floating
        self._secret = secret
        self._transport = transport
        self._clock = clock
        self._exclusive_total = len(exclusive)
        self._lock = threading.Lock()
        self._free: list[Buffer] = [Buffer(s, self) for s in exclusive]
        self._received: deque[Buffer] = deque()
        self._required = self.initial_credit
        self._expected_seq = 0
        self._ended = False
        self._closed = False
        self._error: BaseException | None = None
        self._credit_error: ShuffleError | None = None
        """A credit announcement that failed: named in the receiver's error if one follows."""
        self._credit = UnannouncedCredit()
        self._conn: Connection | None = None
        self._thread: threading.Thread | None = None
        self._on_data: Callable[[int], None] = lambda _i: None
        self._ledger = ReceiverLedger(self.initial_credit)  # guarded by _lock
        self._blocks = blocks_for(floating, config.buffer_size)
        self._blocks.join(self.initial_credit)
        self._bytes_received = 0
        self.terminated = threading.Event()
        """Set when the receiver thread ends (end-of-partition or failure)."""

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self, on_data: Callable[[int], None]) -> None:
        self._on_data = on_data
        self._thread = threading.Thread(target=self._run, name=f"recv-{self.where}", daemon=True)
        self._thread.start()

    def _connect(self) -> Connection:
        """Connect, authenticate and send the sealed request, all within ``connect_timeout_s``."""
        deadline = self._clock.monotonic() + self.config.connect_timeout_s
        conn = self._transport.connect(
            self.address, self.config.connect_timeout_s, self.config.peer_timeout_s, self._clock
        )
        try:
            conn.set_deadline(deadline, "connect and handshake")
            session = client_handshake(conn, self._secret, self.partition_id.app_id)
            body = encode_json(
                PARTITION_REQUEST.encode(
                    {"partition": self.partition_id.to_wire(), "subpartition": self.subpartition}, ""
                )
            )
            sealed = session.seal(Kind.PARTITION_REQUEST, 0, self.initial_credit, body)
            conn.send(Kind.PARTITION_REQUEST, sealed, value=self.initial_credit)
            conn.set_deadline(None)
        except BaseException:
            conn.close()
            raise
        return conn

    def _run(self) -> None:
        try:
            self._run_stream()
        finally:
            self.terminated.set()

    def _run_stream(self) -> None:
        try:
            conn = self._connect()
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conn = conn
            self._receive_loop(conn)
        except Exception as exc:
            with self._lock:
                if self._closed:
                    return
                self._error = self._located(exc)
                if self._credit_error is not None and self._error.__cause__ is None:
                    self._error.__cause__ = self._credit_error
            self._on_data(self.index)

    def _located(self, exc: Exception) -> ShuffleError:
        """The same error type, naming this channel's partition and peer; chained to the original."""
        if isinstance(exc, ShuffleError) and self.where in str(exc):
            return exc
        kind = type(exc) if isinstance(exc, ShuffleError) else ShuffleError
        located = kind(f"{exc} {self.where}")
        located.__cause__ = exc
        return located

    def _receive_loop(self, conn: Connection) -> None:
        limit = self.config.frame_limit
        required = self.config.checksum
        while True:
            header = conn.recv_header()
            assert header is not None
            if header.kind is Kind.BUFFER:
                if header.length > limit:
                    raise OversizedFrameError(
                        f"frame of {header.length} bytes exceeds max {limit} {self.where}"
                    )
                self._check_seq(header)
                if header.crc is None and required:
                    raise FrameChecksumError(
                        f"buffer {header.seq} carries no checksum, and this reader requires one "
                        "(a bit that cleared its flag, or a server with spark.arrowbeat.shuffle.checksum "
                        f"off while this reader has it on: set it alike on both) {self.where}"
                    )
                with self._lock:
                    if self._closed:  # cancelled: close() took our buffers back; nothing to account
                        return
                    unused = self._ledger.announced - self._ledger.received
                    if not self._ledger.receive(has_free_buffer=bool(self._free)):
                        raise CreditViolationError(
                            f"buffer {header.seq} arrived without credit ({unused} announced and unused, "
                            f"{len(self._free)} free buffers) {self.where}"
                        )
                    lease = self._free.pop()
                try:
                    buffer = self._receive_payload(conn, lease, header)
                except BaseException:
                    self._give_back(lease)
                    raise
                with self._lock:
                    closed = self._closed
                    if not closed:
                        self._received.append(buffer)
                        self._bytes_received += header.length
                        # Wake the consumer once a few buffers are in, or when no more are coming
                        # at once (none queued behind it, or the sender is out of credit).
                        wake = (
                            len(self._received) >= _WAKE_AFTER
                            or header.value == 0
                            or self._ledger.announced <= self._ledger.received
                        )
                if closed:
                    buffer.recycle()
                    return
                if wake:
                    self._on_data(self.index)
                self._on_backlog(header.value)
                self._announce_due()
            elif header.kind is Kind.END_OF_PARTITION:
                self._check_seq(header)
                with self._lock:
                    self._ended = True
                    self._conn = None  # nothing more to announce: hang up, so the server may close
                conn.close()
                self._on_data(self.index)
                return
            elif header.kind is Kind.KEEPALIVE:
                if header.length:
                    raise ShuffleProtocolError(f"keepalive with a payload {self.where}")
                with self._lock:
                    waiting = bool(self._received)
                if waiting:  # a sender that claimed a backlog went idle: hand over what came
                    self._on_data(self.index)
            elif header.kind is Kind.ERROR:
                raise self._remote_error(conn, header)
            else:
                raise ShuffleProtocolError(f"unexpected {header.kind.name} frame {self.where}")

    def _receive_payload(self, conn: Connection, lease: Buffer, header: FrameHeader) -> Buffer:
        """The payload of a BUFFER frame, on ``lease`` (the credit it spent, held until the
        payload is consumed), checked against its checksum before it is wrapped. A large one goes
        straight into a block of Arrow memory that its decoded batches will view (no copy out of a
        segment; ``codec.ReceiveBlocks``, which takes the block back if the check fails); a small
        one into the segment, copied out at decode (a block would be mostly empty, yet pinned by
        the batches); one larger than a segment (``max_frame_bytes`` above ``buffer_size``) into
        memory of its own."""
        length = header.length
        blocks = self._blocks

        def fill(view: memoryview) -> None:
            conn.recv_into(view)
            self._verify(header, view)

        if blocks.block_size // 2 <= length <= blocks.block_size:
            return ArrowPayload(lease, [blocks.receive(length, fill)], length)
        if length <= lease.capacity:
            fill(lease.segment.view[:length])
            lease.size = length
            return lease
        data = pa.allocate_buffer(length)
        fill(memoryview(data))
        return ArrowPayload(lease, [data], length)

    def _verify(self, header: FrameHeader, payload: memoryview) -> None:
        """``FrameChecksumError`` unless ``payload`` has the checksum the sender put in ``header``
        (``checksum.digest``, read in place)."""
        if header.crc is None:
            return
        actual = digest(payload)
        if actual != header.crc:
            raise FrameChecksumError(
                f"buffer {header.seq} ({header.length} bytes) fails its checksum: 0x{actual:08x}, "
                f"sender's 0x{header.crc:08x}; damaged between the two processes, not decoded {self.where}"
            )

    def _check_seq(self, header: FrameHeader) -> None:
        if header.seq != self._expected_seq:
            kind = "duplicate" if header.seq < self._expected_seq else "gap"
            raise SequenceGapError(
                f"{kind}: expected buffer {self._expected_seq}, got {header.seq} {self.where}"
            )
        self._expected_seq += 1

    def _remote_error(self, conn: Connection, header: FrameHeader) -> ShuffleError:
        if header.length > MAX_CONTROL_PAYLOAD:
            return OversizedFrameError(f"error frame of {header.length} bytes {self.where}")
        raw = bytearray(header.length)
        conn.recv_into(memoryview(raw))
        message = raw.decode("utf-8", "replace")
        if header.value == ErrorCode.PARTITION_NOT_FOUND:
            return PartitionNotFoundError(f"{message} (server side) {self.where}")
        if header.value == ErrorCode.AUTHENTICATION:
            return ShuffleAuthenticationError(f"{message} {self.where}")
        if header.value == ErrorCode.PRODUCER_FAILED:
            return ProducerFailedError(f"producer reported: {message} {self.where}")
        return RemoteFailureError(f"producer reported: {message} {self.where}")

    # -- credit ---------------------------------------------------------------------------------
    def _on_backlog(self, backlog: int) -> None:
        """Request floating buffers until we hold ``backlog + initial_credit`` (Flink)."""
        gained = 0
        with self._lock:
            self._required = backlog + self.initial_credit
        while True:
            with self._lock:
                if self._closed or len(self._free) >= self._required:
                    break
            buffer = self._floating.request_or_listen(self._on_floating_buffer)
            if buffer is None:
                break
            with self._lock:
                closed = self._closed
                if not closed:
                    self._free.append(buffer)
            if closed:
                buffer.recycle()
                break
            gained += 1
        self._add_credit(gained)

    def _on_floating_buffer(self, buffer: Buffer) -> bool:
        """Pool listener: a floating buffer became free; keep it if we still need one."""
        with self._lock:
            if self._closed or self._error is not None or len(self._free) >= self._required:
                return False
            self._free.append(buffer)
        self._add_credit(1)
        return True

    def recycle_segment(self, segment: Segment) -> None:
        """An exclusive buffer came back from the consumer: it is one more credit."""
        with self._lock:
            if self._closed:
                to_network = True
            else:
                to_network = False
                self._free.append(Buffer(segment, self))
        if to_network:
            self._network.release([segment])
        else:
            self._add_credit(1)

    def _add_credit(self, n: int) -> None:
        """``n`` more credits: announced now if the sender is running low, else later (see
        ``_announce_due``)."""
        if n <= 0:
            return
        self._credit.add(n)
        self._announce_due()

    def _announce_due(self) -> None:
        """Announce the unannounced credit once it is as large as what the sender still holds
        unspent (as far as we know: announced minus received), or that is down to
        ``initial_credit``; until then it is kept, and the receiver thread calls this again after
        every buffer received, so it goes out, all in one ADD_CREDIT, while the sender still has
        half the window to go on (a window update at half, as TCP's). One message per few buffers
        instead of one per buffer: each one costs both processes a wake-up and a system call.

        A failed announcement is not this channel's verdict: the peer may have sent END and hung
        up before it arrived (the receiver has yet to read END from the socket). The receiver
        thread decides: it reads what the peer sent, END included, and then fails on the closed
        connection only if END was not among it."""
        with self._lock:  # in the ledger before it is sent: a buffer spending it cannot come earlier
            unspent = self._ledger.announced - self._ledger.received
            if unspent > self.initial_credit and unspent > self._credit.pending:
                return  # the sender has credit enough to keep going; the next receive looks again
            credit = self._credit.take()
            if credit == 0:
                return
            self._ledger.announce(credit)
            conn = None if self._ended else self._conn
        if conn is None:  # the send is I/O: outside our lock
            return
        try:
            conn.send(Kind.ADD_CREDIT, value=credit)
        except ShuffleError as exc:
            with self._lock:
                if self._credit_error is None:
                    self._credit_error = exc

    @property
    def credits_announced(self) -> int:
        with self._lock:
            return self._ledger.announced

    def stats(self) -> ChannelStats:
        """This channel's counters, including its witness of the credit contract."""
        with self._lock:
            ledger = self._ledger
            return ChannelStats(
                buffers_received=ledger.received,
                bytes_received=self._bytes_received,
                buffers_consumed=ledger.consumed,
                credits_announced=ledger.announced,
                credit_announcements=ledger.announcements,
                buffers_without_credit=ledger.without_credit,
                max_in_flight=ledger.max_in_flight,
                max_in_flight_over_credit=ledger.max_in_flight_over_credit,
            )

    # -- consumer side ----------------------------------------------------------------------------
    def poll(self) -> tuple[Buffer | None, bool]:
        """Next received buffer and whether end-of-partition was reached (after all buffers)."""
        with self._lock:
            if self._closed:
                raise ChannelClosedError(f"channel closed {self.where}")
            if self._received:
                self._ledger.consume()
                return self._received.popleft(), False
            if self._error is not None:
                raise self._error
            return None, self._ended

    def _give_back(self, buffer: Buffer) -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._free.append(buffer)
        if closed:
            buffer.recycle()

    def close(self) -> None:
        """Cancel the stream and return every buffer this channel holds."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn = self._conn
            held = list(self._free) + list(self._received)
            self._free.clear()
            self._received.clear()
        self._floating.remove_listener(self._on_floating_buffer)
        self._blocks.leave(self.initial_credit)
        if conn is not None:
            if not self._ended:
                with contextlib.suppress(ShuffleError):
                    conn.send(Kind.CANCEL)
            conn.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.config.connect_timeout_s + 1)
        for buffer in held:
            buffer.recycle()
