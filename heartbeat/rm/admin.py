"""A client for the RM's ``ListExecutors`` call: its live view of the executors, for operators,
demos and driver-side code. A short deadline on every call.

The secret never travels (``_auth``): the client asks the RM for a single-use challenge
(``Hello``), sends a token over it, the method, a nonce of its own and the request bytes, and
accepts the reply only with the RM's proof over the same and the reply bytes. A process
squatting the RM's address is refused (``HeartbeatAuthenticationError``), and the token it
collected is worth nothing to the real RM (the challenge was not the real RM's).
"""

from __future__ import annotations

from typing import TypeVar

import grpc

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.errors import (
    HeartbeatAuthenticationError,
    HeartbeatRpcError,
    MalformedMessageError,
    ProtocolVersionError,
)
from heartbeat.executor_info import ExecutorInfo
from heartbeat.wire import auth as _auth
from heartbeat.wire.codec import (
    CALL_PROOF_KEY,
    CALL_TOKEN_KEY,
    HELLO_METHOD,
    LIST_EXECUTORS_METHOD,
    status_from_proto,
)
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import one_line
from heartbeat.wire.transport import ChannelOptions, sync_channel

__all__ = ["LIST_EXECUTORS_METHOD", "list_executors"]

_Reply = TypeVar("_Reply", pb.HelloResponse, pb.ListExecutorsResponse)


def list_executors(
    address: str,
    secret: str | _auth.SharedSecret,
    timeout_s: float = 5.0,
    *,
    clock: Clock = SYSTEM_CLOCK,
    channel_credentials: grpc.ChannelCredentials | None = None,
    channel_options: ChannelOptions = (),
) -> list[ExecutorInfo]:
    """Every executor the RM at ``address`` knows, with state, agent pid and last payload.

    ``timeout_s`` bounds the whole exchange (both calls). With ``channel_credentials`` the call
    runs over TLS (``channel_options`` added, e.g. the server name the certificate must carry).
    """
    key = _auth.SharedSecret(secret)
    deadline = clock.monotonic() + timeout_s
    with sync_channel(address, channel_credentials, channel_options) as channel:
        hello = pb.HelloRequest(protocol_version=_auth.PROTOCOL_VERSION).SerializeToString()
        raw, _ = _call(channel, HELLO_METHOD, hello, None, deadline - clock.monotonic(), address)
        answer = _parse(pb.HelloResponse, raw, address)
        if answer.protocol_version != _auth.PROTOCOL_VERSION:
            raise ProtocolVersionError(_auth.version_mismatch("server", answer.protocol_version, "client"))
        body = pb.ListExecutorsRequest().SerializeToString()
        token, client_nonce = _auth.call_token(key, LIST_EXECUTORS_METHOD, answer.challenge, body)
        reply, trailing = _call(
            channel, LIST_EXECUTORS_METHOD, body, token, deadline - clock.monotonic(), address
        )
    proof = next((v for k, v in trailing if k == CALL_PROOF_KEY and isinstance(v, str)), "")
    try:
        tag = bytes.fromhex(proof) if len(proof) == 2 * _auth.MAC_BYTES else b""
    except ValueError:
        tag = b""
    if not _auth.reply_proof_ok(key, LIST_EXECUTORS_METHOD, answer.challenge, client_nonce, reply, tag):
        raise HeartbeatAuthenticationError(
            f"the server at {address} did not prove that it knows the application's secret: it is not "
            "this application's RM (another application's, or another process on the RM's port)"
        )
    return [status_from_proto(s) for s in _parse(pb.ListExecutorsResponse, reply, address).executors]


def _call(
    channel: grpc.Channel, method: str, body: bytes, token: str | None, timeout_s: float, address: str
) -> tuple[bytes, tuple[tuple[str, str | bytes], ...]]:
    """One unary call with bytes in and out (the proofs cover the exact bytes)."""
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    metadata = () if token is None else ((CALL_TOKEN_KEY, token),)
    try:
        reply, rpc = call.with_call(body, timeout=max(0.0, timeout_s), metadata=metadata)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = one_line((exc.details() if isinstance(exc, grpc.Call) else None) or "")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise HeartbeatAuthenticationError(
                f"the RM at {address} refused our proof of the application's secret: {details}"
            ) from None
        if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(_auth.VERSION_MISMATCH):
            raise ProtocolVersionError(details) from None
        raise HeartbeatRpcError(f"{method} on {address} failed: {code}: {details}") from None
    trailing = tuple((key, value) for key, value in rpc.trailing_metadata() or ())
    return bytes(reply), trailing


def _parse(message_type: type[_Reply], data: bytes, address: str) -> _Reply:
    try:
        return message_type.FromString(data)
    except Exception:
        raise MalformedMessageError(f"malformed {message_type.__name__} from {address}") from None
