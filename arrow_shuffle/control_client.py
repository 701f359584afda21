"""``ControlClient``: calls the operations of one ``control_schema.Service`` on a ``ControlServer``.

Transport: the engine's framed TCP connections (``transport``) after the mutual HMAC handshake
(``auth``); every request is sealed with the session key and numbered (``seq``), and so is every
response, checked here. Connect + handshake must finish within ``connect_timeout_s`` and every
call within its deadline; while an operation runs the server sends a keepalive every
``keepalive_interval_s``, so a stopped or vanished server is a ``PeerLostError`` after
``peer_timeout_s`` of silence, and a call never outlives its deadline (``DeadlineExceededError``).
Both are measured on the caller's ``arrowbeat_base.clock.Clock``.
"""

from __future__ import annotations

import threading
from typing import Any

from arrow_shuffle.auth import SEAL_SIZE, as_bytes, client_handshake
from arrow_shuffle.control_schema import (
    ERROR_CLASSES,
    ERROR_REPLY,
    Operation,
    Service,
    decode_json,
    encode_json,
    printable,
    shape,
)
from arrow_shuffle.errors import (
    ChannelClosedError,
    ControlMessageError,
    ControlRequestError,
    OversizedFrameError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, Kind
from arrow_shuffle.transport import Connection, TcpTransport, Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock


class ControlClient:
    """One authenticated control connection to a ``ControlServer`` of ``service``.

    Connect + handshake finish within ``connect_timeout_s`` or raise ``PeerLostError``
    (``DeadlineExceededError`` when the server accepted but did not complete the handshake). Each
    call has an overall deadline (the operation's ``timeout_s`` unless given) and fails after
    ``peer_timeout_s`` of silence; after any failure but a refused request, the connection is
    closed and every later call raises ``PeerLostError``. Calls are serialized."""

    def __init__(
        self,
        address: tuple[str, int],
        secret: str | bytes,
        service: Service,
        *,
        who: str | None = None,
        connect_timeout_s: float = 5.0,
        peer_timeout_s: float = 4.0,
        clock: Clock = SYSTEM_CLOCK,
        transport: Transport | None = None,
    ) -> None:
        self.service = service
        self.address = address
        self.who = f"{who or service.name} at {address[0]}:{address[1]}"
        self._clock = clock
        self._lock = threading.Lock()
        self._seq = 0
        self._broken: ShuffleError | None = None
        self._closed = False
        deadline = clock.monotonic() + connect_timeout_s
        try:
            self._conn = (transport or TcpTransport()).connect(
                address, connect_timeout_s, peer_timeout_s, clock
            )
        except PeerLostError as exc:
            raise PeerLostError(f"cannot reach {self.who}: {exc}") from exc
        try:
            self._conn.set_deadline(deadline, f"connect and handshake with {self.who}")
            self._session = client_handshake(self._conn, as_bytes(secret), service.name)
            self._conn.set_deadline(None)
        except BaseException:
            self._conn.close()
            raise

    def call(self, op: str, timeout_s: float | None = None, **args: Any) -> Any:
        """Run ``op`` with ``args`` on the server; its validated response value."""
        operation = self.service.operation(op, f"(client of {self.who})")
        try:
            body = encode_json({"op": op, "args": operation.request.encode(args, "")})
        except ControlMessageError as exc:
            raise ControlMessageError(f"refusing to send {op!r} to {self.who}: {exc}") from exc
        if len(body) > operation.max_request_bytes:
            raise ControlMessageError(
                f"request {op!r} to {self.who} is {len(body)} bytes, "
                f"over its cap {operation.max_request_bytes}"
            )
        with self._lock:
            if self._closed:
                raise ChannelClosedError(f"the connection to {self.who} was closed")
            if self._broken is not None:
                raise PeerLostError(f"the connection to {self.who} failed earlier: {self._broken}")
            seq = self._seq
            self._seq += 1
            conn = self._conn
            deadline = self._clock.monotonic() + (timeout_s if timeout_s is not None else operation.timeout_s)
            try:
                conn.set_deadline(deadline, f"{op!r} call to {self.who}")
                conn.send(
                    Kind.CONTROL_REQUEST, self._session.seal(Kind.CONTROL_REQUEST, seq, 0, body), seq=seq
                )
                reply = self._receive(conn, operation, seq)
                conn.set_deadline(None)
            except ShuffleError as exc:
                self._broken = exc
                conn.close()
                raise
        if "error" in reply:
            error = ERROR_REPLY.decode(reply["error"], "error")
            kind = ERROR_CLASSES.get(error["code"], ControlRequestError)
            raise kind(f"{self.who} refused {op!r}: {printable(error['message'])}")
        try:
            return operation.response.decode(reply["ok"], "ok")
        except ControlMessageError as exc:
            raise ControlMessageError(f"response to {op!r} from {self.who}: {exc}") from exc

    def _receive(self, conn: Connection, op: Operation, seq: int) -> dict[str, Any]:
        where = f"(call {op.name!r} to {self.who})"
        while True:
            header = conn.recv_header()
            assert header is not None
            if header.kind is Kind.KEEPALIVE and header.length == 0:
                continue  # the server is alive and still working on it
            if header.kind is Kind.ERROR:
                limit = MAX_CONTROL_PAYLOAD
            elif header.kind is Kind.CONTROL_RESPONSE:
                limit = SEAL_SIZE + max(op.max_response_bytes, 4200)
            else:
                raise ShuffleProtocolError(f"unexpected {header.kind.name} frame {where}")
            if header.length > limit:
                raise OversizedFrameError(
                    f"{header.kind.name} frame of {header.length} bytes exceeds {limit} {where}"
                )
            payload = bytearray(header.length)
            conn.recv_into(memoryview(payload))
            if header.kind is Kind.ERROR:
                text = printable(payload.decode("utf-8", "replace"))
                if header.value == ErrorCode.AUTHENTICATION:
                    raise ShuffleAuthenticationError(f"{text} {where}")
                if header.value == ErrorCode.BUSY:
                    raise PeerLostError(f"{text} {where}")
                if header.value == ErrorCode.PROTOCOL:
                    raise ShuffleProtocolError(f"{text} {where}")
                raise ControlRequestError(f"{text} {where}")
            body = self._session.unseal(header, payload, conn.peer)
            if header.seq != seq:
                raise ShuffleAuthenticationError(f"response numbered {header.seq}, expected {seq} {where}")
            reply = decode_json(body, where)
            if not isinstance(reply, dict) or len(reply) != 1 or not ({"ok", "error"} & set(reply)):
                raise ControlMessageError(
                    f"a response is {{'ok'}} or {{'error'}}, got {shape(reply)} {where}"
                )
            return reply

    def close(self) -> None:
        """Close the connection (a call in progress on another thread ends with ``ChannelClosedError``)."""
        self._closed = True
        self._conn.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
