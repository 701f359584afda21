"""The typed control protocol: small request/response calls between arrowbeat processes.

Every control exchange (the agents' map-output service, the pipelined rendezvous) is one of the
*operations* of a ``Service``: a name, a request schema, a response schema, size caps and a
default deadline. Nothing from the network is unpickled, unmarshalled or evaluated: a message is
UTF-8 JSON (``{"op": name, "args": {...}}``; answered by ``{"ok": value}`` or
``{"error": {"code": ..., "message": ...}}``), decoded without duplicate keys or NaN, and then
checked field by field against the operation's schema (exact field names, exact JSON types, bounds
on every number, length and count; bytes travel as base64 with a cap). Anything else - an unknown
operation or field, a wrong type, a value out of bounds, a message over its cap, bytes that are
not JSON (a pickle, say) - is refused with ``ControlMessageError`` naming the operation and the
peer, and the connection is closed. Why JSON and not protobuf: the engine stays free of
generated code and gRPC (``tests/test_architecture.py``), and protobuf would silently keep unknown
fields and has no bounds, which the schemas here check anyway.

Transport: the engine's framed TCP connections (``transport``) after the mutual HMAC handshake
(``auth``), which also yields a per-connection session key; every request and response frame is
sealed with it and numbered (``seq``), so a relayed handshake followed by injected, replayed or
reordered frames is refused (``ShuffleAuthenticationError``). Server side, the shared
``acceptor.Acceptor`` gives the handshake its overall deadline (``connect_timeout_s``) and caps
connections waiting to authenticate and connections served. Client side, connect + handshake
must finish within ``connect_timeout_s`` and every call within its deadline; while an operation
runs the server sends a keepalive every ``keepalive_interval_s``, so a stopped or vanished server
is a ``PeerLostError`` after ``peer_timeout_s`` of silence, and a call never outlives its deadline
(``DeadlineExceededError``). Both are measured on the caller's ``heartbeat.clock.Clock``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from arrow_shuffle.acceptor import AUTHENTICATION, PROTOCOL, AcceptLimits, Acceptor, error_code
from arrow_shuffle.auth import SEAL_SIZE, Session, as_bytes, client_handshake, server_handshake
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import (
    ChannelClosedError,
    ControlMessageError,
    ControlRequestError,
    DeadlineExceededError,
    OversizedFrameError,
    PartitionNotFoundError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, FrameHeader, Kind
from arrow_shuffle.transport import Connection, TcpTransport, Transport
from heartbeat.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)
REQUEST_DEADLINE = "request-deadline"
"""Refusal cause: a request's payload did not arrive within ``peer_timeout_s`` of its header."""

I32 = (1 << 31) - 1
I64 = (1 << 63) - 1


# -- schemas ---------------------------------------------------------------------------------------
class Schema:
    """One JSON value's type and bounds. ``encode`` checks a Python value and makes it JSON-able
    (the sender refuses to send what the receiver would refuse); ``decode`` checks a decoded JSON
    value and returns the Python value. Both raise ``ControlMessageError`` naming the path."""

    def encode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def decode(self, value: Any, path: str) -> Any:
        raise NotImplementedError


def _bad(path: str, what: str, value: Any) -> ControlMessageError:
    shown = type(value).__name__ if not isinstance(value, int | float | bool) else repr(value)
    return ControlMessageError(f"field {path or '<message>'}: expected {what}, got {shown}")


@dataclass(frozen=True)
class Int(Schema):
    low: int = 0
    high: int = I32

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise _bad(path, f"an integer in [{self.low}, {self.high}]", value)
        return value


@dataclass(frozen=True)
class Float(Schema):
    low: float = -math.inf
    high: float = math.inf

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _bad(path, "a number", value)
        number = float(value)
        if not math.isfinite(number) or not self.low <= number <= self.high:
            raise _bad(path, f"a finite number in [{self.low}, {self.high}]", value)
        return number


@dataclass(frozen=True)
class Str(Schema):
    """Printable text only: no NUL, newline or other control character can reach a log line or
    a path through a control message."""

    max_len: int = 256
    min_len: int = 0

    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if (
            not isinstance(value, str)
            or not self.min_len <= len(value) <= self.max_len
            or not value.isprintable()
        ):
            raise _bad(path, f"printable text of {self.min_len}..{self.max_len} characters", value)
        return value


@dataclass(frozen=True)
class Bytes(Schema):
    """Bytes, as base64 text on the wire."""

    max_len: int = MAX_CONTROL_PAYLOAD

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, bytes | bytearray | memoryview) or len(value) > self.max_len:
            raise _bad(path, f"at most {self.max_len} bytes", value)
        return base64.b64encode(bytes(value)).decode("ascii")

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, str) or len(value) > 4 * (self.max_len // 3 + 1):
            raise _bad(path, f"base64 of at most {self.max_len} bytes", value)
        try:
            raw = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ControlMessageError(f"field {path}: not base64") from exc
        if len(raw) > self.max_len:
            raise _bad(path, f"at most {self.max_len} bytes", raw)
        return raw


@dataclass(frozen=True)
class Null(Schema):
    def encode(self, value: Any, path: str) -> Any:
        return self.decode(value, path)

    def decode(self, value: Any, path: str) -> Any:
        if value is not None:
            raise _bad(path, "null", value)
        return None


@dataclass(frozen=True)
class List(Schema):
    item: Schema
    max_items: int

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list | tuple) or len(value) > self.max_items:
            raise _bad(path, f"a list of at most {self.max_items} items", value)
        return [self.item.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list) or len(value) > self.max_items:
            raise _bad(path, f"a list of at most {self.max_items} items", value)
        return [self.item.decode(v, f"{path}[{i}]") for i, v in enumerate(value)]


@dataclass(frozen=True)
class Tuple(Schema):
    """A fixed-length list whose items have their own types; a Python tuple."""

    items: tuple[Schema, ...]

    def encode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list | tuple) or len(value) != len(self.items):
            raise _bad(path, f"a list of exactly {len(self.items)} items", value)
        return [s.encode(v, f"{path}[{i}]") for i, (s, v) in enumerate(zip(self.items, value, strict=True))]

    def decode(self, value: Any, path: str) -> Any:
        if not isinstance(value, list) or len(value) != len(self.items):
            raise _bad(path, f"a list of exactly {len(self.items)} items", value)
        return tuple(
            s.decode(v, f"{path}[{i}]") for i, (s, v) in enumerate(zip(self.items, value, strict=True))
        )


@dataclass(frozen=True)
class Record(Schema):
    """An object with exactly these fields (every one required, no other allowed)."""

    fields: Mapping[str, Schema]

    def _each(self, value: Any, path: str, how: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise _bad(path, "an object", value)
        unknown = sorted(str(k) for k in value if k not in self.fields)
        if unknown:
            raise ControlMessageError(f"field {path or '<message>'}: unknown field(s) {unknown[:5]}")
        missing = sorted(k for k in self.fields if k not in value)
        if missing:
            raise ControlMessageError(f"field {path or '<message>'}: missing field(s) {missing}")
        at = f"{path}." if path else ""
        return {k: getattr(s, how)(value[k], f"{at}{k}") for k, s in self.fields.items()}

    def encode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "encode")

    def decode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "decode")


@dataclass(frozen=True)
class Map(Schema):
    """An object from short string keys to values of one type."""

    value: Schema
    max_items: int
    max_key_len: int = 128

    def _each(self, value: Any, path: str, how: str) -> dict[str, Any]:
        if not isinstance(value, Mapping) or len(value) > self.max_items:
            raise _bad(path, f"an object of at most {self.max_items} entries", value)
        out = {}
        for key, item in value.items():
            Str(self.max_key_len, 1).decode(key, f"{path}<key>")
            out[key] = getattr(self.value, how)(item, f"{path}[{key!r}]")
        return out

    def encode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "encode")

    def decode(self, value: Any, path: str) -> Any:
        return self._each(value, path, "decode")


PARTITION_ID = Record(
    {"app": Str(256, 1), "shuffle": Int(0, I32), "map": Int(0, I32), "attempt": Int(0, I64)}
)
"""``ids.PartitionId.to_wire()`` as a schema."""
PARTITION_REQUEST = Record({"partition": PARTITION_ID, "subpartition": Int(0, I32)})
"""The body of a data stream's PARTITION_REQUEST frame (``partition_server``)."""


# -- operations and services -----------------------------------------------------------------------
@dataclass(frozen=True)
class Operation:
    """One call: its request fields, its response, their size caps (encoded JSON bytes) and the
    client's default overall deadline."""

    name: str
    request: Record
    response: Schema
    max_request_bytes: int = MAX_CONTROL_PAYLOAD
    max_response_bytes: int = MAX_CONTROL_PAYLOAD
    timeout_s: float = 30.0


@dataclass(frozen=True)
class Service:
    """A named set of operations; the name is what a client claims in the handshake, so a
    client of one service is refused by another's server."""

    name: str
    operations: tuple[Operation, ...]
    by_name: dict[str, Operation] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {op.name: op for op in self.operations})
        for op in self.operations:  # ControlClient.call(op, timeout_s, **fields)
            if {"op", "timeout_s"} & set(op.request.fields):
                raise ShuffleConfigError(f"operation {op.name!r}: 'op' and 'timeout_s' are not field names")

    @property
    def max_request_bytes(self) -> int:
        return max(op.max_request_bytes for op in self.operations)

    def operation(self, name: Any, where: str) -> Operation:
        op = self.by_name.get(name) if isinstance(name, str) else None
        if op is None:
            shown = repr(name)[:80]
            raise ControlMessageError(f"unknown operation {shown} for service {self.name!r} {where}")
        return op


def decode_json(body: bytes, where: str) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity; else ``ControlMessageError``."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(pairs)
        if len(out) != len(pairs):
            raise ValueError("duplicate key")
        return out

    def no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(body.decode("utf-8"), object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ControlMessageError(
            f"not a JSON control message ({type(exc).__name__}: {str(exc)[:80]}) {where}".rstrip()
        ) from exc


def encode_json(message: Any) -> bytes:
    """Compact JSON of an already schema-checked message."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


_ERROR = Record({"code": Str(32, 1), "message": Str(4096)})
_CODES: dict[str, Callable[[str], ShuffleError]] = {
    "protocol": ControlMessageError,
    "authentication": ShuffleAuthenticationError,
    "not-found": PartitionNotFoundError,
    "refused": ControlRequestError,
    "internal": ControlRequestError,
}


def _code_of(exc: BaseException) -> str:
    if isinstance(exc, ShuffleProtocolError):
        return "protocol"
    if isinstance(exc, ShuffleAuthenticationError):
        return "authentication"
    if isinstance(exc, PartitionNotFoundError):
        return "not-found"
    if isinstance(exc, ShuffleError):
        return "refused"
    return "internal"


Handler = Callable[[dict[str, Any]], Any]
"""Runs one operation: gets the validated request fields, returns a value of its response schema."""


# -- server ----------------------------------------------------------------------------------------
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
            raise ControlMessageError(f"a control request is {{'op', 'args'}}, got {_shape(message)} {where}")
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
            code = _code_of(exc)
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


def printable(text: str, limit: int = 4096) -> str:
    """Text from a peer, safe to log: control characters (newlines included) become ``?``."""
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _shape(message: Any) -> str:
    if isinstance(message, dict):
        return f"an object with fields {sorted(str(k) for k in message)[:5]}"
    return f"a JSON {type(message).__name__}"


# -- client ----------------------------------------------------------------------------------------
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
            error = _ERROR.decode(reply["error"], "error")
            kind = _CODES.get(error["code"], ControlRequestError)
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
                    f"a response is {{'ok'}} or {{'error'}}, got {_shape(reply)} {where}"
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
