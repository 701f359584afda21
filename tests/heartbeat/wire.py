"""Raw gRPC peers for the wire tests: a hand-driven client of the RM and a port squatter.

``raw_stream`` plays an agent frame by frame (each frame bytes, or built from the RM's challenge
nonce, so a test can send a valid or a forged register); ``raw_unary`` makes one unary call with
any token. ``Squatter`` is a gRPC server on the RM's port that records every method, metadata
value and message it receives, and answers as a fake RM would (``mode``). Everything runs on the
process's one grpc.aio loop (``heartbeat.wire.io_loop``) with deadlines on every wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from heartbeat.wire import auth as _auth
from heartbeat.wire.codec import CALL_PROOF_KEY, CALL_TOKEN_KEY, CONNECT_METHOD, HELLO_METHOD, SERVICE_NAME
from heartbeat.wire.io_loop import submit
from heartbeat.wire.proto import heartbeat_pb2 as pb

from .conftest import SECRET

Frame = bytes | Callable[[bytes], bytes]
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]


@dataclass
class StreamResult:
    code: grpc.StatusCode
    details: str
    replies: list[pb.RmMessage]

    @property
    def kinds(self) -> list[str | None]:
        return [r.WhichOneof("body") for r in self.replies]


def register_frame(
    executor_id: str,
    secret: str | None = SECRET,
    *,
    host: str = "h",
    version: int = _auth.PROTOCOL_VERSION,
    resume_epoch: str = "",
    resume_instance_id: str = "",
) -> Callable[[bytes], bytes]:
    """A register answering the RM's challenge; ``secret=None``: with no proof at all."""

    def build(rm_nonce: bytes) -> bytes:
        agent_nonce = _auth.new_nonce()
        request = pb.RegisterRequest(
            executor_id=executor_id,
            host=host,
            pid=1,
            resume_epoch=resume_epoch,
            resume_instance_id=resume_instance_id,
            protocol_version=version,
            agent_nonce=agent_nonce,
        )
        if secret is not None:
            request.proof = _auth.agent_proof(
                _auth.SharedSecret(secret or "x"),  # "": a proof made with some other secret
                rm_nonce=rm_nonce,
                agent_nonce=agent_nonce,
                protocol_version=version,
                executor_id=executor_id,
                host=host,
                pid=1,
                resume_epoch=resume_epoch,
                resume_instance_id=resume_instance_id,
            )
        return pb.AgentMessage(register=request).SerializeToString()

    return build


def message(**body: Any) -> bytes:
    return pb.AgentMessage(**body).SerializeToString()


def raw_stream(
    address: str,
    frames: Sequence[Frame],
    *,
    metadata: tuple[tuple[str, str], ...] = (),
    after_registered: Callable[[pb.RegisterResponse], Sequence[bytes]] | None = None,
    timeout_s: float = 5.0,
) -> StreamResult:
    """One Connect stream: read the challenge, write ``frames``, then (once registered) what
    ``after_registered`` builds from the answer; read until the RM ends the stream."""

    async def run() -> StreamResult:
        options = [("grpc.max_send_message_length", 8 << 20), ("grpc.use_local_subchannel_pool", 1)]
        replies: list[pb.RmMessage] = []
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = channel.stream_stream(CONNECT_METHOD, None, pb.RmMessage.FromString)(
                None, metadata=metadata, timeout=timeout_s
            )
            try:
                first = await asyncio.wait_for(call.read(), timeout_s)
                nonce = b""
                if isinstance(first, pb.RmMessage):
                    replies.append(first)
                    nonce = first.challenge.rm_nonce
                for frame in frames:
                    await call.write(frame(nonce) if callable(frame) else frame)
                for _ in range(1000):  # bounded: a refused stream ends after a few replies
                    reply = await asyncio.wait_for(call.read(), timeout_s)
                    if not isinstance(reply, pb.RmMessage):
                        break
                    replies.append(reply)
                    if reply.WhichOneof("body") == "registered" and after_registered is not None:
                        for extra in after_registered(reply.registered):
                            await call.write(extra)
                        await call.done_writing()
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, TimeoutError):
                pass
            call.cancel()
            return StreamResult(await call.code(), await call.details() or "", replies)

    return submit(run()).result(timeout_s * 3)


def hello(address: str, version: int = _auth.PROTOCOL_VERSION) -> bytes:
    """A fresh challenge from the RM at ``address``."""
    reply, _ = raw_unary(address, HELLO_METHOD, pb.HelloRequest(protocol_version=version).SerializeToString())
    return pb.HelloResponse.FromString(reply).challenge


def raw_unary(
    address: str, method: str, body: bytes, token: str | None = None, timeout_s: float = 5.0
) -> tuple[bytes, dict[str, str]]:
    """One unary call with bytes in and out; raises ``grpc.RpcError`` on a non-OK status."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        metadata = () if token is None else ((CALL_TOKEN_KEY, token),)
        reply, rpc = call.with_call(body, timeout=timeout_s, metadata=metadata)
        trailing = {k: v for k, v in rpc.trailing_metadata() or () if isinstance(v, str)}
        return bytes(reply), trailing


def status_of(fn: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status a raw unary call ended with (OK if it returned)."""
    try:
        fn()
    except grpc.RpcError as exc:
        assert isinstance(exc, grpc.Call)
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def raw_http2_call(address: str, path: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """One gRPC call hand-made at the HTTP/2 level, so header bytes a gRPC client would refuse
    (a newline in the path or in a metadata value) reach the server; returns what it answered."""

    def literal(name: bytes, value: bytes) -> bytes:  # HPACK: literal, not indexed, new name
        assert len(name) < 127 and len(value) < 127
        return bytes([0, len(name)]) + name + bytes([len(value)]) + value

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload
        )

    fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", path), (b":authority", b"x")]
    fields += [(b"content-type", b"application/grpc"), (b"te", b"trailers"), *headers]
    block = b"".join(literal(name, value) for name, value in fields)
    host, port = address.rsplit(":", 1)
    answer = b""
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        sock.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + frame(4, 0, 0, b"")  # SETTINGS
            + frame(1, 4, 1, block)  # HEADERS, END_HEADERS
            + frame(0, 1, 1, b"\x00" * 5)  # DATA: an empty gRPC message, END_STREAM
        )
        with contextlib.suppress(OSError):
            for _ in range(100):  # bounded: the server answers and closes the stream
                data = sock.recv(65536)
                if not data or b"grpc-status" in answer + data:
                    answer += data
                    break
                answer += data
    return answer


def secret_forms(secret: str) -> list[bytes]:
    """Every form in which a leaked secret would show: raw, hex, base64 (both alphabets)."""
    raw = secret.encode()
    return [raw, raw.hex().encode(), base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


@dataclass
class Received:
    method: str
    metadata: list[tuple[str, str | bytes]]
    messages: list[bytes] = field(default_factory=list)


class Squatter:
    """A fake RM on a port: records everything it receives; answers as ``mode`` says.

    Modes: ``fake-rm`` (challenge, then a `registered` with a forged proof, then heartbeat
    requests: would the agent answer?), ``refuse:<STATUS>`` (challenge, then that status after
    the register), ``silent`` (reads, never answers: an RM of protocol 1 would have been sent
    the secret here), ``version:<n>`` (a challenge claiming protocol n). ``Hello`` and unary
    calls get a challenge of the squatter's own and a reply with a forged proof.
    """

    def __init__(self, port: int, mode: str = "fake-rm") -> None:
        self.port = port
        self.mode = mode
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server: grpc.aio.Server | None = None

    # ---- what it saw ----------------------------------------------------------------------

    def calls(self, method: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.received if method is None or r.method == method]

    def registers(self) -> list[pb.RegisterRequest]:
        out = []
        for call in self.calls(CONNECT_METHOD):
            for raw in list(call.messages):
                parsed = pb.AgentMessage.FromString(raw)
                if parsed.WhichOneof("body") == "register":
                    out.append(parsed.register)
        return out

    def agent_message_kinds(self) -> list[str | None]:
        return [
            pb.AgentMessage.FromString(raw).WhichOneof("body")
            for call in self.calls(CONNECT_METHOD)
            for raw in list(call.messages)
        ]

    def everything(self) -> bytes:
        """Every byte it was sent: method names, metadata keys and values, messages."""
        parts: list[bytes] = []
        for call in self.calls():
            parts.append(call.method.encode())
            for key, value in call.metadata:
                parts += [key.encode(), value if isinstance(value, bytes) else value.encode()]
            parts += list(call.messages)
        return b"\n".join(parts)

    # ---- serving --------------------------------------------------------------------------

    def start(self) -> Squatter:
        submit(self._start()).result(10.0)
        return self

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            submit(server.stop(0)).result(10.0)

    async def _start(self) -> None:
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((_AnyMethod(self),))
        if server.add_insecure_port(f"127.0.0.1:{self.port}") != self.port:
            raise RuntimeError(f"the squatter could not take port {self.port}")
        await server.start()
        self._server = server

    def _record(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> Received:
        entry = Received(method, [(key, value) for key, value in context.invocation_metadata() or ()])
        with self._lock:
            self.received.append(entry)
        return entry

    async def connect(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        entry = self._record(method, context)
        version = int(self.mode.split(":")[1]) if self.mode.startswith("version:") else _auth.PROTOCOL_VERSION
        if self.mode != "silent":
            challenge = pb.Challenge(rm_nonce=b"squatter-nonce-0123456789", protocol_version=version)
            await context.write(pb.RmMessage(challenge=challenge).SerializeToString())
        for _ in range(100):  # bounded: an agent sends a register and, at most, a few answers
            raw = await context.read()
            if raw is EOF:
                return
            entry.messages.append(raw)
            if self.mode.startswith("refuse:"):
                code = getattr(grpc.StatusCode, self.mode.split(":")[1])
                await context.abort(code, "go away\nARROWBEAT-CMD x")
            if self.mode == "fake-rm" and len(entry.messages) == 1:
                forged = pb.RegisterResponse(epoch="squat", instance_id="i", interval_ms=50, timeout_ms=1000)
                forged.proof = secrets.token_bytes(32)
                await context.write(pb.RmMessage(registered=forged).SerializeToString())
                for seq in range(1, 4):
                    request = pb.HeartbeatRequest(epoch="squat", instance_id="i", seq=seq)
                    await context.write(pb.RmMessage(heartbeat_request=request).SerializeToString())

    async def unary(self, method: str, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        entry = self._record(method, context)
        entry.messages.append(raw)
        if method == HELLO_METHOD:
            own = pb.HelloResponse(challenge=b"c" * _auth.CHALLENGE_BYTES)
            own.protocol_version = _auth.PROTOCOL_VERSION
            return own.SerializeToString()
        context.set_trailing_metadata(((CALL_PROOF_KEY, secrets.token_hex(32)),))
        fake = pb.ListExecutorsResponse(epoch="squat", executors=[pb.ExecutorStatus(executor_id="fake")])
        return fake.SerializeToString()


class _AnyMethod(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    def __init__(self, squatter: Squatter) -> None:
        self._squatter = squatter

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:  # type: ignore[type-arg]
        method = handler_call_details.method
        squatter = self._squatter
        if method == CONNECT_METHOD:

            async def connect(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
                await squatter.connect(method, context)

            return grpc.stream_stream_rpc_method_handler(connect)
        if method.startswith(f"/{SERVICE_NAME}/"):

            async def unary(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
                return await squatter.unary(method, raw, context)

            return grpc.unary_unary_rpc_method_handler(unary)
        return None
