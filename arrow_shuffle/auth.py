"""Mutual HMAC challenge-response on every stream; the secret itself never crosses the wire.

Server sends a random nonce; the client answers with its own nonce, its application id and
``HMAC(secret, "client" | server_nonce | client_nonce | app_id)``; the server proves itself
with ``HMAC(secret, "server" | client_nonce | server_nonce)``. Digests are compared in constant
time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hashlib
import hmac
import os

from arrow_shuffle.errors import ShuffleAuthenticationError, ShuffleProtocolError
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, Kind
from arrow_shuffle.transport import Connection

_NONCE = 32
_DIGEST = 32


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).digest()


def _expect(conn: Connection, kind: Kind, limit: int = MAX_CONTROL_PAYLOAD) -> bytes:
    header = conn.recv_header()
    assert header is not None
    if header.length > limit:
        raise ShuffleProtocolError(
            f"handshake frame of {header.length} bytes from {conn.peer} exceeds {limit}"
        )
    payload = bytearray(header.length)
    conn.recv_into(memoryview(payload))
    if header.kind is Kind.ERROR:
        message = payload.decode("utf-8", "replace")
        if header.value == ErrorCode.AUTHENTICATION:
            raise ShuffleAuthenticationError(f"peer {conn.peer} refused the handshake: {message}")
        raise ShuffleProtocolError(f"peer {conn.peer} failed the handshake: {message}")
    if header.kind is not kind:
        raise ShuffleProtocolError(
            f"expected {kind.name} during the handshake, got {header.kind.name} from {conn.peer}"
        )
    return bytes(payload)


def server_handshake(conn: Connection, secret: bytes) -> str:
    """Authenticate the client; returns the application id it claims (and proved)."""
    server_nonce = os.urandom(_NONCE)
    conn.send(Kind.HELLO, server_nonce)
    answer = _expect(conn, Kind.AUTH)
    if len(answer) < _NONCE + _DIGEST:
        raise ShuffleProtocolError(f"short AUTH frame from {conn.peer}")
    client_nonce, digest, app_id = (
        answer[:_NONCE],
        answer[_NONCE : _NONCE + _DIGEST],
        answer[_NONCE + _DIGEST :],
    )
    if not hmac.compare_digest(digest, _mac(secret, b"client", server_nonce, client_nonce, app_id)):
        raise ShuffleAuthenticationError(f"client {conn.peer} failed authentication (wrong secret)")
    conn.send(Kind.AUTH_OK, _mac(secret, b"server", client_nonce, server_nonce))
    return app_id.decode("utf-8", "replace")


def client_handshake(conn: Connection, secret: bytes, app_id: str) -> None:
    """Prove we hold ``secret`` and check that the server does too."""
    server_nonce = _expect(conn, Kind.HELLO)
    client_nonce = os.urandom(_NONCE)
    app = app_id.encode()
    conn.send(Kind.AUTH, client_nonce + _mac(secret, b"client", server_nonce, client_nonce, app) + app)
    proof = _expect(conn, Kind.AUTH_OK)
    if not hmac.compare_digest(proof, _mac(secret, b"server", client_nonce, server_nonce)):
        raise ShuffleAuthenticationError(f"shuffle server {conn.peer} does not hold the application secret")


def as_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret
