"""``PartitionServer``: serves the subpartitions of this process's ``ResultPartition``s over TCP.

One per process (Flink's netty server of a TaskExecutor): a ``RemoteInputChannel`` in another
process connects, names a partition and a subpartition, and receives that subpartition's buffers
as its credit allows (a reader in the same process connects over loopback). Each accepted
connection is one stream: authenticate (HMAC), read the partition request with the channel's
initial credit (sealed with the session key), then a sender thread pushes buffers while this
connection's thread reads credit announcements from the same socket. Getting in
(handshake + request) runs on the connection's own thread under one overall deadline,
``connect_timeout_s``; at most ``max_pending_connections`` may be getting in and ``max_streams``
be served at once (``acceptor.Acceptor``, shared with the control servers). A consumer that disappears before
end-of-partition releases its subpartition, so a blocked producer fails fast instead of hanging.
A peer that breaks the protocol (garbage, an oversized control frame, non-positive credit) gets
an ERROR frame; the error names the partition and the peer, is logged and kept in
``stream_errors()``, and only that stream ends.

Nothing grows with the number of streams: a stream's sender is dropped when its connection ends
(completed, failed or cancelled) and only its figures are kept, summed into ``stream_counts()``;
``senders()`` shows the open streams and the last ``RECENT_STREAMS`` that ended (an agent serves
streams for the executor's whole life: keeping every sender cost about 7.6 KB per stream).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from arrow_shuffle.acceptor import AcceptLimits, Acceptor
from arrow_shuffle.auth import Session, as_bytes, server_handshake
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_schema import PARTITION_REQUEST, decode_json
from arrow_shuffle.errors import (
    ChannelClosedError,
    ControlMessageError,
    OversizedFrameError,
    PartitionNotFoundError,
    ProducerFailedError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    ShuffleProtocolError,
    describe,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, Kind
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import ResultPartition
from arrow_shuffle.stream_sender import StreamSender
from arrow_shuffle.transport import Connection, TcpTransport, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

RECENT_STREAMS = 16
"""Ended streams ``senders()`` still shows (the newest), for tests and debugging."""


@dataclass(frozen=True)
class StreamCounts:
    """Every stream a server served, in aggregate: what outlives the streams themselves."""

    opened: int = 0
    """Streams that got a sender (a partition request that was accepted)."""
    live: int = 0
    """Streams open now."""
    completed: int = 0
    """Streams that sent END_OF_PARTITION, open or ended."""
    ended: int = 0
    """Streams whose connection ended."""
    ended_completed: int = 0
    """Streams that ended after END: the reader had its whole subpartition and hung up."""
    buffers_sent: int = 0
    """Buffers sent by every stream, open or ended."""
    keepalives_sent: int = 0
    max_overdraft: int = 0
    """Most buffers any stream sent beyond its credit: > 0 would be a protocol bug."""

    @property
    def failed(self) -> int:
        """Streams that ended without END (the reader cancelled or went away, or the stream failed)."""
        return self.ended - self.ended_completed


@dataclass(frozen=True)
class _Request:
    """What a connection that got in asked for."""

    app_id: str
    partition_id: PartitionId
    subpartition: int
    credit: int


class PartitionServer:
    """Serves the subpartitions of registered ``ResultPartition``s of one application to remote
    readers, behind an authenticated listener (TCP unless another ``Transport`` is given).

    ``clock`` measures every stream's keepalive interval, peer timeout and time blocked on credit.
    """

    def __init__(
        self,
        secret: str | bytes,
        app_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ShuffleConfig | None = None,
        transport: Transport | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.app_id = app_id
        self.config = config or ShuffleConfig()
        self.clock = clock
        self._secret = as_bytes(secret)
        if not self._secret:
            raise ShuffleConfigError("secret must be non-empty")
        self._partitions: dict[PartitionId, ResultPartition] = {}
        self._lock = threading.Lock()
        self._streams_changed = threading.Condition(self._lock)
        """Notified when a stream sent its END or ended (``wait_for_streams``)."""
        self._senders: dict[StreamSender, None] = {}
        """The open streams, in the order they opened (a dict as an ordered set)."""
        self._recent: deque[StreamSender] = deque(maxlen=RECENT_STREAMS)
        self._ended = StreamCounts()
        """The figures of every stream that ended (``live`` unused)."""
        self._stream_errors: deque[ShuffleError] = deque(maxlen=100)
        self._closed = False
        listener = (transport or TcpTransport()).listen(host, port, self.config.peer_timeout_s, clock)
        self._acceptor: Acceptor[_Request] = Acceptor(
            listener,
            "shuffle data server",
            self._get_in,
            self._serve,
            limits=AcceptLimits(
                handshake_timeout_s=self.config.connect_timeout_s,
                max_pending=self.config.max_pending_connections,
                max_served=self.config.max_streams,
            ),
            clock=clock,
            logger=log,
            on_refused=self._refused,
        )

    @property
    def address(self) -> tuple[str, int]:
        return self._acceptor.address

    @property
    def acceptor(self) -> Acceptor[_Request]:
        """The accept loop: its ``refusals()`` by cause and ``load()`` (pending, served)."""
        return self._acceptor

    def register(self, partition: ResultPartition) -> None:
        if partition.partition_id.app_id != self.app_id:
            raise ShuffleConfigError(
                f"partition {partition.partition_id} belongs to application "
                f"{partition.partition_id.app_id!r}, this server to {self.app_id!r}"
            )
        with self._lock:
            if self._closed:
                raise ChannelClosedError("shuffle server is closed")
            self._partitions[partition.partition_id] = partition

    def release(self, partition_id: PartitionId) -> None:
        """Forget the partition and return its buffers; later requests for it are refused."""
        with self._lock:
            partition = self._partitions.pop(partition_id, None)
        if partition is not None:
            partition.release()

    def senders(self) -> list[StreamSender]:
        """The last ``RECENT_STREAMS`` streams that ended, oldest first, then the open ones (tests
        assert their credit counters); ``stream_counts()`` has the figures of all of them."""
        with self._lock:
            return [*self._recent, *self._senders]

    def stream_counts(self) -> StreamCounts:
        """Every stream served so far, in aggregate."""
        with self._lock:
            return self._counts()

    def wait_for_streams(self, done: Callable[[StreamCounts], bool], timeout_s: float) -> bool:
        """Wait until ``done(stream_counts())`` holds, at most ``timeout_s`` of real time (a caller
        on a ``ManualClock`` waits in short slices and checks its own deadline); whether it holds."""
        with self._streams_changed:
            return self._streams_changed.wait_for(lambda: done(self._counts()), max(0.0, timeout_s))

    def _counts(self) -> StreamCounts:
        ended, live = self._ended, list(self._senders)
        return StreamCounts(
            opened=ended.ended + len(live),
            live=len(live),
            completed=ended.ended_completed + sum(1 for s in live if s.completed),
            ended=ended.ended,
            ended_completed=ended.ended_completed,
            buffers_sent=ended.buffers_sent + sum(s.buffers_sent for s in live),
            keepalives_sent=ended.keepalives_sent + sum(s.keepalives_sent for s in live),
            max_overdraft=max([ended.max_overdraft, *(s.max_overdraft for s in live)]),
        )

    def _stream_ended(self, sender: StreamSender) -> None:
        """Drop an ended stream's sender, keeping its figures (and it among the recent few)."""
        with self._lock:
            if sender not in self._senders:
                return  # counted already
            del self._senders[sender]
            ended = self._ended
            self._ended = StreamCounts(
                ended=ended.ended + 1,
                ended_completed=ended.ended_completed + int(sender.completed),
                buffers_sent=ended.buffers_sent + sender.buffers_sent,
                keepalives_sent=ended.keepalives_sent + sender.keepalives_sent,
                max_overdraft=max(ended.max_overdraft, sender.max_overdraft),
            )
            self._recent.append(sender)
            self._streams_changed.notify_all()

    def _run_sender(self, sender: StreamSender) -> None:
        """The sender thread: its stream's END wakes ``wait_for_streams``."""
        try:
            sender.run()
        finally:
            with self._lock:
                self._streams_changed.notify_all()

    def stream_errors(self) -> list[ShuffleError]:
        """Errors that ended streams by the peer's fault (wrong secret, unknown partition, broken
        protocol), newest last; the last 100 are kept. Each names the partition and the peer."""
        with self._lock:
            return list(self._stream_errors)

    def close(self) -> None:
        """Stop accepting, close every stream and release every registered partition."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            partitions = list(self._partitions.values())
            self._partitions.clear()
            senders = list(self._senders)
        for sender in senders:
            sender.stop()
        for partition in partitions:
            partition.release()
        self._acceptor.close()

    # -- connection handling --------------------------------------------------------------------
    def _get_in(self, conn: Connection) -> _Request:
        """Handshake and partition request, under the acceptor's overall deadline."""
        session = server_handshake(conn, self._secret)
        return self._read_request(conn, session)

    def _refused(self, conn: Connection, exc: ShuffleError) -> ShuffleError:
        """A connection that did not get in: the error names it, and is kept (the peer's fault)."""
        error = _located(exc, describe("(not requested yet)", conn.peer))
        if isinstance(exc, ShuffleAuthenticationError | ShuffleProtocolError):
            with self._lock:
                self._stream_errors.append(error)
        return error

    def _serve(self, conn: Connection, request: _Request) -> None:
        sender: StreamSender | None = None
        sender_thread: threading.Thread | None = None
        where = describe(f"{request.partition_id}#{request.subpartition}", conn.peer)
        try:
            sender = self._open_stream(
                conn, request.app_id, request.partition_id, request.subpartition, request.credit, where
            )
            sender_thread = threading.Thread(
                target=self._run_sender, args=(sender,), name="shuffle-sender", daemon=True
            )
            sender_thread.start()
            self._read_control(conn, sender)
        except (
            ShuffleAuthenticationError,
            PartitionNotFoundError,
            ShuffleProtocolError,
        ) as exc:  # the peer's fault
            error = _located(exc, where)
            with self._lock:
                self._stream_errors.append(error)
            log.warning("%s shuffle stream: %s", "refused" if sender is None else "failed", error)
            if sender is not None:
                sender.stop()  # no more buffers after the error frame
            self._send_error(conn, error)
        except ProducerFailedError as exc:  # the partition failed before this reader attached
            log.info("shuffle stream refused: %s", exc)
            self._send_error(conn, _located(exc, where))
        except ShuffleError as exc:
            if sender is None or not sender.completed:  # after END the reader hangs up: no news
                log.info("shuffle stream ended: %s", _located(exc, where))
        finally:
            if sender is not None:
                sender.hung_up.set()
                sender.stop()
                if not sender.completed:  # the consumer went away mid-stream: fail the producer fast
                    sender.subpartition.release()
            if sender_thread is not None:
                sender_thread.join(timeout=5)
            if sender is not None:
                self._stream_ended(sender)

    @staticmethod
    def _read_request(conn: Connection, session: Session) -> _Request:
        """The partition request (sealed): partition, subpartition and initial credit."""
        header = conn.recv_header()
        assert header is not None
        if header.kind is not Kind.PARTITION_REQUEST:
            raise ShuffleProtocolError(f"expected a PARTITION_REQUEST, got {header.kind.name}")
        if header.length > MAX_CONTROL_PAYLOAD:
            raise OversizedFrameError(
                f"partition request of {header.length} bytes exceeds max {MAX_CONTROL_PAYLOAD}"
            )
        raw = bytearray(header.length)
        conn.recv_into(memoryview(raw))
        body = session.unseal(header, raw, conn.peer)
        try:
            request = PARTITION_REQUEST.decode(decode_json(body, ""), "")
        except ControlMessageError as exc:
            raise ControlMessageError(f"malformed partition request: {exc}") from exc
        return _Request(
            session.claim, PartitionId.from_wire(request["partition"]), request["subpartition"], header.value
        )

    def _open_stream(
        self,
        conn: Connection,
        app_id: str,
        partition_id: PartitionId,
        subpartition: int,
        credit: int,
        where: str,
    ) -> StreamSender:
        if partition_id.app_id != self.app_id or app_id != self.app_id:
            raise PartitionNotFoundError(
                f"partition of application {partition_id.app_id!r} requested by {app_id!r} from a server of "
                f"{self.app_id!r}: refused {where}"
            )
        with self._lock:
            partition = self._partitions.get(partition_id)
        if partition is None:
            raise PartitionNotFoundError(f"partition not hosted here (never registered or released) {where}")
        if not 0 <= subpartition < partition.num_subpartitions:
            raise PartitionNotFoundError(
                f"no subpartition {subpartition} (has {partition.num_subpartitions}) {where}"
            )
        if credit < 1:
            raise ShuffleProtocolError(f"initial credit must be >= 1, got {credit} {where}")
        sender = StreamSender(conn, partition, subpartition, credit, self.clock)
        sender.subpartition.attach_reader(sender.notify)
        with self._lock:
            self._senders[sender] = None
        return sender

    def _read_control(self, conn: Connection, sender: StreamSender) -> None:
        while True:
            header = conn.recv_header(idle_ok=True)
            if header is None:
                if self._closed:
                    return
                continue
            if header.length > MAX_CONTROL_PAYLOAD:
                raise OversizedFrameError(
                    f"{header.kind.name} frame of {header.length} bytes exceeds the control frame max "
                    f"{MAX_CONTROL_PAYLOAD} {sender.where}"
                )
            if header.length:
                conn.recv_into(memoryview(bytearray(header.length)))
            if header.kind is Kind.ADD_CREDIT:
                if header.value < 1:
                    raise ShuffleProtocolError(f"non-positive credit {header.value} {sender.where}")
                sender.grant(header.value)
            elif header.kind is Kind.CANCEL:
                return
            elif header.kind is not Kind.KEEPALIVE:
                raise ShuffleProtocolError(f"unexpected {header.kind.name} frame {sender.where}")

    @staticmethod
    def _send_error(conn: Connection, exc: ShuffleError) -> None:
        code = ErrorCode.OTHER
        if isinstance(exc, PartitionNotFoundError):
            code = ErrorCode.PARTITION_NOT_FOUND
        elif isinstance(exc, ShuffleAuthenticationError):
            code = ErrorCode.AUTHENTICATION
        elif isinstance(exc, ShuffleProtocolError):
            code = ErrorCode.PROTOCOL
        elif isinstance(exc, ProducerFailedError):
            code = ErrorCode.PRODUCER_FAILED
        with contextlib.suppress(ShuffleError):
            conn.send(Kind.ERROR, str(exc).encode(), value=code)


def _located(exc: ShuffleError, where: str) -> ShuffleError:
    """``exc`` naming the stream's partition and peer: the same type, chained to the original."""
    if where in str(exc):
        return exc
    located = type(exc)(f"{exc} {where}")
    located.__cause__ = exc
    return located
