"""Mutual HMAC challenge-response on every connection; the secret itself never crosses the wire.

Server sends a random nonce; the client answers with its own nonce, a claim (the application id
on data streams, the service name on control connections) and
``HMAC(secret, "client" | server_nonce | client_nonce | claim)``; the server proves itself with
``HMAC(secret, "server" | client_nonce | server_nonce)``. Digests are compared in constant time
(``hmac.compare_digest``).

Both ends then derive a session key, ``HMAC(secret, "session" | server_nonce | client_nonce |
claim)``: fresh per connection, known only to holders of the secret. Requests (PARTITION_REQUEST,
CONTROL_REQUEST) and control responses are *sealed* with it: an HMAC over the direction, the frame
kind, sequence number, value and body. A man in the middle who relays a handshake learns neither
the secret nor the key, so a frame it injects afterwards fails the seal and is refused
(``ShuffleAuthenticationError``). Data frames (BUFFER, credit, keepalive) are not sealed: a MAC
over every MiB would cost the hot path; integrity and secrecy of the data itself are TLS's job.

The caller bounds a handshake in time (``Connection.set_deadline``); these functions only speak it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from dataclasses import dataclass, field
from typing import Literal

from arrow_shuffle.errors import (
    OversizedFrameError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import MAX_CONTROL_PAYLOAD, ErrorCode, FrameHeader, Kind
from arrow_shuffle.transport import Connection

_NONCE = 32
_DIGEST = 32
SEAL_SIZE = _DIGEST
"""Bytes a sealed frame's payload carries in front of its body."""
MAX_CLAIM = 256
"""Longest claim (application id or service name) a client may present, in UTF-8 bytes."""
_HANDSHAKE_FRAME = _NONCE + _DIGEST + MAX_CLAIM
_SEAL_FIELDS = struct.Struct("!Bqi")
_LABEL = {"client": b"c>s", "server": b"s>c"}


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), hashlib.sha256).digest()


@dataclass(frozen=True)
class Session:
    """What a completed handshake leaves: the client's claim and a key only the two ends know.

    ``seal``/``unseal`` protect the frames that make the peer act (requests) or that it acts on
    (responses); the key never leaves this object (not in ``repr``)."""

    claim: str
    role: Literal["client", "server"]
    key: bytes = field(repr=False)

    def _tag(self, label: bytes, kind: Kind, seq: int, value: int, body: bytes | memoryview) -> bytes:
        mac = hmac.new(self.key, label, hashlib.sha256)
        mac.update(_SEAL_FIELDS.pack(kind, seq, value))
        mac.update(body)
        return mac.digest()

    def seal(self, kind: Kind, seq: int, value: int, body: bytes) -> bytes:
        """The payload to send for ``body``: its seal followed by the body."""
        return self._tag(_LABEL[self.role], kind, seq, value, body) + body

    def unseal(self, header: FrameHeader, payload: bytes | bytearray, peer: str) -> bytes:
        """The body of a frame the peer sealed; ``ShuffleAuthenticationError`` if it did not."""
        if len(payload) < SEAL_SIZE:
            raise ShuffleAuthenticationError(f"unsealed {header.kind.name} frame from {peer}")
        tag, body = bytes(payload[:SEAL_SIZE]), bytes(payload[SEAL_SIZE:])
        other = "server" if self.role == "client" else "client"
        expected = self._tag(_LABEL[other], header.kind, header.seq, header.value, body)
        if not hmac.compare_digest(tag, expected):
            raise ShuffleAuthenticationError(
                f"{header.kind.name} frame {header.seq} from {peer} is not sealed with this connection's "
                "session key (forged or injected after the handshake): refused"
            )
        return body


def _expect(conn: Connection, kind: Kind) -> bytes:
    header = conn.recv_header()
    assert header is not None
    limit = MAX_CONTROL_PAYLOAD if header.kind is Kind.ERROR else _HANDSHAKE_FRAME
    if header.length > limit:
        raise OversizedFrameError(
            f"handshake frame of {header.length} bytes from {conn.peer} exceeds {limit}"
        )
    payload = bytearray(header.length)
    conn.recv_into(memoryview(payload))
    if header.kind is Kind.ERROR:
        message = "".join(c if c.isprintable() else "?" for c in payload.decode("utf-8", "replace")[:4096])
        if header.value == ErrorCode.AUTHENTICATION:
            raise ShuffleAuthenticationError(f"peer {conn.peer} refused the handshake: {message}")
        if header.value == ErrorCode.BUSY:
            raise PeerLostError(f"peer {conn.peer} is at its connection limit: {message}")
        raise ShuffleProtocolError(f"peer {conn.peer} failed the handshake: {message}")
    if header.kind is not kind:
        raise ShuffleProtocolError(
            f"expected {kind.name} during the handshake, got {header.kind.name} from {conn.peer}"
        )
    return bytes(payload)


def server_handshake(conn: Connection, secret: bytes) -> Session:
    """Authenticate the client; returns its session (with the claim it proved)."""
    server_nonce = os.urandom(_NONCE)
    conn.send(Kind.HELLO, server_nonce)
    answer = _expect(conn, Kind.AUTH)
    if len(answer) < _NONCE + _DIGEST:
        raise ShuffleProtocolError(f"short AUTH frame from {conn.peer}")
    client_nonce, digest, raw_claim = (
        answer[:_NONCE],
        answer[_NONCE : _NONCE + _DIGEST],
        answer[_NONCE + _DIGEST :],
    )
    if not hmac.compare_digest(digest, _mac(secret, b"client", server_nonce, client_nonce, raw_claim)):
        raise ShuffleAuthenticationError(f"client {conn.peer} failed authentication (wrong secret)")
    try:
        claim = raw_claim.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ShuffleProtocolError(f"client {conn.peer} claimed a non-UTF-8 identity") from exc
    conn.send(Kind.AUTH_OK, _mac(secret, b"server", client_nonce, server_nonce))
    return Session(claim, "server", _mac(secret, b"session", server_nonce, client_nonce, raw_claim))


def client_handshake(conn: Connection, secret: bytes, claim: str) -> Session:
    """Prove we hold ``secret``, check that the server does too; returns the session."""
    raw_claim = claim.encode()
    if len(raw_claim) > MAX_CLAIM:
        raise ShuffleProtocolError(f"claim {claim[:40]!r}... is over {MAX_CLAIM} bytes")
    server_nonce = _expect(conn, Kind.HELLO)
    if len(server_nonce) != _NONCE:
        raise ShuffleProtocolError(f"HELLO of {len(server_nonce)} bytes from {conn.peer}")
    client_nonce = os.urandom(_NONCE)
    proof = _mac(secret, b"client", server_nonce, client_nonce, raw_claim)
    conn.send(Kind.AUTH, client_nonce + proof + raw_claim)
    answer = _expect(conn, Kind.AUTH_OK)
    if not hmac.compare_digest(answer, _mac(secret, b"server", client_nonce, server_nonce)):
        raise ShuffleAuthenticationError(f"shuffle server {conn.peer} does not hold the application secret")
    return Session(claim, "client", _mac(secret, b"session", server_nonce, client_nonce, raw_claim))


def as_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret
