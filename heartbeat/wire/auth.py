"""Proof of the shared secret without sending it: HMAC-SHA256 over fresh nonces, both directions.

Nothing here touches the network; ``rm.server``, ``agent.async_agent`` and ``rm.admin`` put the proofs on it.

* ``Connect`` (one stream per agent): the RM sends a fresh ``rm_nonce``; the agent answers with
  its own ``agent_nonce`` and ``agent_proof`` over both nonces and every field of its register
  request; the RM answers with ``rm_proof`` over both nonces and every field of its answer. Each
  side accepts the other only once the proof checks, so a process squatting the RM's port learns
  one proof bound to a nonce it chose, which no RM will ever ask for again.
* Unary calls: the RM hands out a single-use ``challenge`` (``ChallengeIssuer``: stateless, signed
  with a key that lives as long as the RM instance, valid for ``max_age_s`` on the RM's clock); a
  call carries a token over the method, that challenge, a client nonce and the request bytes; the
  RM remembers each used challenge until it expires (``ReplayCache``) and proves its reply over
  the same plus the reply bytes. A token is good for one call to the one RM instance that issued
  its challenge, within the window: captured by a squatter, it is useless to the real RM.

Every MAC input is a domain label (the direction and the protocol version) followed by
length-prefixed fields, so no two different messages share an input, and a proof made for one
direction is never accepted for the other. Digests are compared in constant time.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import struct
from typing import NoReturn

from arrowbeat_base.clock import Clock

PROTOCOL_VERSION = 2
"""arrowbeat's heartbeat wire version: 1 sent the secret as metadata; 2 proves it (this module)."""

VERSION_MISMATCH = "protocol version mismatch"
"""How every version refusal starts: ``agent.core.error_for_status`` reads it as ``ProtocolVersionError``."""

NONCE_BYTES = 16
MIN_NONCE_BYTES = 16
MAX_NONCE_BYTES = 64
MAC_BYTES = 32
CHALLENGE_BYTES = 8 + 16 + 16  # issued-at ms, random, truncated signature
MAX_TOKEN_CHARS = 2 * (CHALLENGE_BYTES + MAX_NONCE_BYTES + MAC_BYTES) + 2

_LABEL = f"arrowbeat.heartbeat.v{PROTOCOL_VERSION}/".encode()
_AGENT_REGISTER = _LABEL + b"agent-register"
_RM_REGISTERED = _LABEL + b"rm-registered"
_RM_REPLACED = _LABEL + b"rm-replaced"
_CALL = _LABEL + b"call"
_CALL_REPLY = _LABEL + b"call-reply"
_CHALLENGE = _LABEL + b"challenge"
_TOKEN = re.compile(r"([0-9a-f]+)\.([0-9a-f]+)\.([0-9a-f]+)")

Field = bytes | str | int


def version_mismatch(peer: str, peer_version: int, own: str) -> str:
    """The refusal's message, naming both versions."""
    return (
        f"{VERSION_MISMATCH}: the {peer} speaks heartbeat wire version {peer_version}, the {own} speaks "
        f"{PROTOCOL_VERSION}; every process of one application must run the same arrowbeat"
    )


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def nonce_ok(nonce: bytes) -> bool:
    return MIN_NONCE_BYTES <= len(nonce) <= MAX_NONCE_BYTES


def _encode(label: bytes, fields: tuple[Field, ...]) -> bytes:
    parts = [struct.pack(">I", len(label)), label]
    for field in fields:
        if isinstance(field, bool | int):
            data = struct.pack(">q", int(field))
        elif isinstance(field, str):
            data = field.encode("utf-8", "surrogatepass")
        else:
            data = bytes(field)
        parts += [struct.pack(">I", len(data)), data]
    return b"".join(parts)


class SharedSecret:
    """The application's secret, held so that no ``repr``, ``str``, log line or pickle shows it."""

    __slots__ = ("_key",)
    _key: bytes

    def __init__(self, secret: str | bytes | SharedSecret) -> None:
        if isinstance(secret, SharedSecret):
            key = secret._key
        elif isinstance(secret, str):
            key = secret.encode("utf-8", "surrogatepass")
        else:
            key = bytes(secret)
        if not key:
            raise ValueError("a non-empty shared secret is required")
        self._key = key

    def mac(self, label: bytes, *fields: Field) -> bytes:
        return hmac.new(self._key, _encode(label, fields), hashlib.sha256).digest()

    def verify(self, tag: bytes, label: bytes, *fields: Field) -> bool:
        """Constant time in the tag's content (a wrong length is refused at once, it says nothing)."""
        return hmac.compare_digest(self.mac(label, *fields), bytes(tag))

    def __repr__(self) -> str:
        return "SharedSecret(<hidden>)"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a SharedSecret is never pickled")


# ---- Connect ------------------------------------------------------------------------------


def agent_proof(
    secret: SharedSecret,
    *,
    rm_nonce: bytes,
    agent_nonce: bytes,
    protocol_version: int,
    executor_id: str,
    host: str,
    pid: int,
    resume_epoch: str,
    resume_instance_id: str,
) -> bytes:
    """The agent's proof in its register request: binds the RM's nonce to every field it sends."""
    return secret.mac(
        _AGENT_REGISTER,
        rm_nonce,
        agent_nonce,
        protocol_version,
        executor_id,
        host,
        pid,
        resume_epoch,
        resume_instance_id,
    )


def rm_proof(
    secret: SharedSecret,
    *,
    rm_nonce: bytes,
    agent_nonce: bytes,
    executor_id: str,
    epoch: str,
    instance_id: str,
    interval_ms: int,
    timeout_ms: int,
    resumed: bool,
) -> bytes:
    """The RM's proof in its answer: binds the agent's nonce to the registration it grants."""
    return secret.mac(
        _RM_REGISTERED,
        agent_nonce,
        rm_nonce,
        executor_id,
        epoch,
        instance_id,
        interval_ms,
        timeout_ms,
        resumed,
    )


_REPLACED_PROOF = re.compile(r" \[rm-proof ([0-9a-f]{64})\]$")


def with_replaced_proof(
    secret: SharedSecret, details: str, *, rm_nonce: bytes, agent_nonce: bytes, executor_id: str, resumed: str
) -> str:
    """A refusal of a registration that resumes ``resumed``, an instance a newer registration
    replaced, with the RM's proof appended: the agent may take it as final only if it checks (a port
    squatter must not be able to stop agents for good with a bare status)."""
    tag = secret.mac(_RM_REPLACED, agent_nonce, rm_nonce, executor_id, resumed)
    return f"{details} [rm-proof {tag.hex()}]"


def replaced_proof_ok(
    secret: SharedSecret, details: str, *, rm_nonce: bytes, agent_nonce: bytes, executor_id: str, resumed: str
) -> tuple[bool, str]:
    """Does ``details`` end with the RM's proof for this refusal (``with_replaced_proof``)? Also
    the message: ``details`` without the proof when it checks, as it came otherwise (a proof that
    does not check stays visible in the log)."""
    found = _REPLACED_PROOF.search(details)
    if found is None:
        return False, details
    tag = bytes.fromhex(found.group(1))
    if not secret.verify(tag, _RM_REPLACED, agent_nonce, rm_nonce, executor_id, resumed):
        return False, details
    return True, details[: found.start()]


# ---- unary calls --------------------------------------------------------------------------


def _digest(body: bytes) -> bytes:
    return hashlib.sha256(body).digest()


def call_token(secret: SharedSecret, method: str, challenge: bytes, body: bytes) -> tuple[str, bytes]:
    """``(token, client_nonce)`` for one call of ``method`` with request ``body``."""
    client_nonce = new_nonce()
    tag = secret.mac(_CALL, method, challenge, client_nonce, _digest(body))
    return f"{challenge.hex()}.{client_nonce.hex()}.{tag.hex()}", client_nonce


def parse_call_token(token: str) -> tuple[bytes, bytes, bytes] | None:
    """``(challenge, client_nonce, tag)``, or None for anything but a well-formed token."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    match = _TOKEN.fullmatch(token)
    if match is None or any(len(part) % 2 for part in match.groups()):
        return None
    challenge, nonce, tag = (bytes.fromhex(part) for part in match.groups())
    if len(challenge) != CHALLENGE_BYTES or not nonce_ok(nonce) or len(tag) != MAC_BYTES:
        return None
    return challenge, nonce, tag


def call_token_ok(
    secret: SharedSecret, method: str, challenge: bytes, client_nonce: bytes, tag: bytes, body: bytes
) -> bool:
    return secret.verify(tag, _CALL, method, challenge, client_nonce, _digest(body))


def reply_proof(
    secret: SharedSecret, method: str, challenge: bytes, client_nonce: bytes, reply: bytes
) -> bytes:
    """The RM's proof on a unary reply: over the client's nonce and the reply's bytes."""
    return secret.mac(_CALL_REPLY, method, challenge, client_nonce, _digest(reply))


def reply_proof_ok(
    secret: SharedSecret, method: str, challenge: bytes, client_nonce: bytes, reply: bytes, tag: bytes
) -> bool:
    return secret.verify(tag, _CALL_REPLY, method, challenge, client_nonce, _digest(reply))


class ChallengeIssuer:
    """Single-use challenges for unary calls, signed with a key of this RM instance only.

    Stateless until used: a challenge carries when it was issued (the RM's monotonic clock) and
    a signature, so asking for challenges costs the RM no memory. A challenge from another RM
    instance (a squatter's, or this port's previous RM) fails the signature.
    """

    def __init__(self, clock: Clock, max_age_s: float = 60.0) -> None:
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self.max_age_s = max_age_s

    def issue(self) -> bytes:
        head = struct.pack(">q", round(self._clock.monotonic() * 1000)) + secrets.token_bytes(16)
        return head + self._sign(head)

    def check(self, challenge: bytes) -> str | None:
        """None if ``challenge`` is ours and fresh; else why not (a fixed phrase, no input echoed)."""
        if len(challenge) != CHALLENGE_BYTES:
            return "malformed challenge"
        head, signature = challenge[:-16], challenge[-16:]
        if not hmac.compare_digest(self._sign(head), signature):
            return "challenge not issued by this RM"
        age_s = self._clock.monotonic() - self.issued_at(challenge)
        if age_s > self.max_age_s or age_s < -1.0:
            return "stale challenge"
        return None

    def issued_at(self, challenge: bytes) -> float:
        (millis,) = struct.unpack(">q", challenge[:8])
        return float(millis) / 1000.0

    def _sign(self, head: bytes) -> bytes:
        return hmac.new(self._key, _encode(_CHALLENGE, (head,)), hashlib.sha256).digest()[:16]


class ReplayCacheFull(Exception):
    """More authenticated calls within one freshness window than the cache may remember."""


class ReplayCache:
    """Remembers each used challenge until it expires, so a token works once; bounded.

    Only calls whose token checked get in (an unauthenticated flood cannot fill it). Full, it
    refuses rather than forgets: forgetting an unexpired challenge would let its token replay.
    """

    def __init__(self, clock: Clock, max_entries: int = 65_536) -> None:
        self._clock = clock
        self._max_entries = max_entries
        self._expiry: list[tuple[float, bytes]] = []
        self._seen: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, key: bytes, expires_at: float) -> bool:
        """True the first time ``key`` is seen; raises ``ReplayCacheFull`` if it cannot be kept."""
        now = self._clock.monotonic()
        while self._expiry and self._expiry[0][0] < now:
            _, old = heapq.heappop(self._expiry)
            self._seen.discard(old)
        if key in self._seen:
            return False
        if len(self._seen) >= self._max_entries:
            raise ReplayCacheFull(f"{len(self._seen)} calls within the freshness window")
        self._seen.add(key)
        heapq.heappush(self._expiry, (expires_at, key))
        return True
