"""``ControlServer``: serves the operations of one ``control_schema.Service`` to authenticated peers.

Transport: the engine's framed TCP connections (``transport``) after the mutual HMAC handshake
(``auth``), which also yields a per-connection session key; every request and response frame is
sealed with it and numbered (``seq``), so a relayed handshake followed by injected, replayed or
reordered frames is refused (``ShuffleAuthenticationError``). The shared ``acceptor.Acceptor``
gives the handshake its overall deadline (``connect_timeout_s``) and caps connections waiting to
authenticate and connections served. While an operation runs the server sends its client a
keepalive every ``keepalive_interval_s``; a request's payload must arrive within
``peer_timeout_s`` of its header. Both are measured on the server's ``arrowbeat_base.clock.Clock``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from arrow_shuffle.acceptor import AUTHENTICATION, PROTOCOL, AcceptLimits, Acceptor, error_code
from arrow_shuffle.auth import SEAL_SIZE, Session, as_bytes, server_handshake
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_schema import Operation, Service, decode_json, encode_json, reply_code, shape
from arrow_shuffle.errors import (
    ChannelClosedError,
    ControlMessageError,
    DeadlineExceededError,
    OversizedFrameError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import FrameHeader, Kind
from arrow_shuffle.transport import Connection, TcpTransport, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)
REQUEST_DEADLINE = "request-deadline"
"""Refusal cause: a request's payload did not arrive within ``peer_timeout_s`` of its header."""

Handler = Callable[[dict[str, Any]], Any]
"""Runs one operation: gets the validated request fields, returns a value of its response schema."""


class ControlServer:
    """Serves the operations of ``service`` with ``handlers`` (one per operation) behind the
    authenticated, sealed transport; one thread per connection, at most ``max_connections``."""

    def __init__(
        self,
        secret: str | bytes,
        service: Service,
        handlers: Mapping[str, Handler],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        config: ShuffleConfig | None = None,
        max_connections: int = 256,
        clock: Clock = SYSTEM_CLOCK,
        transport: Transport | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self._secret = as_bytes(secret)
        if not self._secret:
            raise ShuffleConfigError("a control server needs the application secret")
        if set(handlers) != set(service.by_name):
            raise ShuffleConfigError(
                f"handlers {sorted(handlers)} do not match the operations {sorted(service.by_name)} "
                f"of service {service.name!r}"
            )
        self.service = service
        self.config = config or ShuffleConfig()
        self._handlers = dict(handlers)
        self._clock = clock
        self._log = logger or log
        self._lock = threading.Lock()
        self._running: dict[Connection, float] = {}
        self._closed = threading.Event()
        listener = (transport or TcpTransport()).listen(host, port, self.config.peer_timeout_s, clock)
        limits = AcceptLimits(
            handshake_timeout_s=self.config.connect_timeout_s,
            max_pending=self.config.max_pending_connections,
            max_served=max_connections,
        )
        self._acceptor: Acceptor[Session] = Acceptor(
            listener,
            f"{service.name} control server",
            self._handshake,
            self._serve,
            limits=limits,
            clock=clock,
            logger=self._log,
        )
        self._ticker = threading.Thread(
            target=self._keepalives, name=f"{service.name}-keepalive", daemon=True
        )
        self._ticker.start()

    @property
    def address(self) -> tuple[str, int]:
        return self._acceptor.address

    @property
    def acceptor(self) -> Acceptor[Session]:
        return self._acceptor

    def refusals(self) -> dict[str, int]:
        """Connections and messages refused so far, by cause (see ``acceptor``)."""
        return self._acceptor.refusals()

    def close(self) -> None:
        self._closed.set()
        self._acceptor.close()
        self._ticker.join(timeout=5)

    def _handshake(self, conn: Connection) -> Session:
        session = server_handshake(conn, self._secret)
        if session.claim != self.service.name:
            raise ShuffleProtocolError(
                f"client {conn.peer} asked for service {session.claim[:64]!r}; this is {self.service.name!r}"
            )
        return session

    def _keepalives(self) -> None:
        """While an operation runs, tell its client every ``keepalive_interval_s`` we are alive."""
        interval = self.config.keepalive_interval_s
        while not self._closed.wait(interval):
            with self._lock:
                running = list(self._running)
            for conn in running:
                conn.try_send(Kind.KEEPALIVE)

    def _serve(self, conn: Connection, session: Session) -> None:
        seq = 0
        while not self._closed.is_set():
            try:
                header = conn.recv_header(idle_ok=True)
                if header is None or (header.kind is Kind.KEEPALIVE and header.length == 0):
                    continue
                op, args = self._read_request(conn, session, header, seq)
            except DeadlineExceededError as exc:  # an authenticated peer dripping a request
                self._acceptor.log.refuse(REQUEST_DEADLINE, str(exc))
                return
            except (ChannelClosedError, PeerLostError):
                return  # the client hung up, or we are closing
            except ShuffleError as exc:
                self._refuse(conn, session, seq, exc)
                return
            self._answer(conn, session, seq, op, args)
            seq += 1

    def _read_request(
        self, conn: Connection, session: Session, header: FrameHeader, seq: int
    ) -> tuple[Operation, dict[str, Any]]:
        where = f"from {conn.peer}"
        if header.kind is not Kind.CONTROL_REQUEST:
            raise ShuffleProtocolError(f"unexpected {header.kind.name} frame on a control connection {where}")
        limit = SEAL_SIZE + self.service.max_request_bytes
        if header.length > limit:
            raise OversizedFrameError(f"control request of {header.length} bytes exceeds {limit} {where}")
        payload = bytearray(header.length)
        conn.set_deadline(self._clock.monotonic() + self.config.peer_timeout_s, "control request")
        try:
            conn.recv_into(memoryview(payload))
        finally:
            conn.set_deadline(None)
        body = session.unseal(header, payload, conn.peer)
        if header.seq != seq:
            raise ShuffleAuthenticationError(
                f"control request numbered {header.seq}, expected {seq} (replayed or reordered) {where}"
            )
        message = decode_json(body, where)
        if not isinstance(message, dict) or set(message) != {"op", "args"}:
            raise ControlMessageError(f"a control request is {{'op', 'args'}}, got {shape(message)} {where}")
        op = self.service.operation(message["op"], where)
        where = f"in request {op.name!r} {where}"
        if len(body) > op.max_request_bytes:
            raise OversizedFrameError(f"{len(body)} bytes exceed the cap of {op.max_request_bytes} {where}")
        try:
            args = op.request.decode(message["args"], "")
        except ControlMessageError as exc:
            raise ControlMessageError(f"{exc} {where}") from exc
        return op, args

    def _refuse(self, conn: Connection, session: Session, seq: int, exc: ShuffleError) -> None:
        """A message broke the protocol: refuse it, log (rate-limited), close the connection."""
        cause = AUTHENTICATION if isinstance(exc, ShuffleAuthenticationError) else PROTOCOL
        message = str(exc) if conn.peer in str(exc) else f"{exc} (peer {conn.peer})"
        self._acceptor.log.refuse(cause, message)
        if isinstance(exc, ControlMessageError):  # sealed and numbered right, only the content is bad
            self._reply(conn, session, seq, {"error": {"code": "protocol", "message": message[:4096]}})
        else:
            with contextlib.suppress(ShuffleError):
                conn.send(Kind.ERROR, message.encode()[:4096], value=error_code(exc))

    def _answer(
        self, conn: Connection, session: Session, seq: int, op: Operation, args: dict[str, Any]
    ) -> None:
        with self._lock:
            self._running[conn] = self._clock.monotonic()
        try:
            result = self._handlers[op.name](args)
            reply: dict[str, Any] = {"ok": op.response.encode(result, "")}
        except Exception as exc:
            code = reply_code(exc)
            if code == "internal":  # a bug: the details stay in our log
                log.exception("control operation %r from %s failed", op.name, conn.peer)
                text = f"internal error in {op.name!r} ({type(exc).__name__})"
            else:
                text = str(exc)
            reply = {"error": {"code": code, "message": text[:4096]}}
        finally:
            with self._lock:
                self._running.pop(conn, None)
        body = encode_json(reply)
        if len(body) > op.max_response_bytes:
            text = f"the response to {op.name!r} ({len(body)} bytes) exceeds its cap {op.max_response_bytes}"
            log.error("%s (peer %s)", text, conn.peer)
            reply = {"error": {"code": "internal", "message": text}}
        self._reply(conn, session, seq, reply)

    @staticmethod
    def _reply(conn: Connection, session: Session, seq: int, reply: dict[str, Any]) -> None:
        with contextlib.suppress(ShuffleError):
            conn.send(
                Kind.CONTROL_RESPONSE,
                session.seal(Kind.CONTROL_RESPONSE, seq, 0, encode_json(reply)),
                seq=seq,
            )
