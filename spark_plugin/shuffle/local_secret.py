"""The application secret, handed by an executor's agent to that executor's own Python workers.

Why: a shuffle planned from a Spark Connect session ships no secret in its task closures. Spark
Connect withholds every conf entry matching ``spark.redaction.regex`` from its clients (the
arrowbeat secret among them: a client is not the driver), so the plan has none to carry. A reduce
task still needs it to stream map outputs from other executors' agents, so it asks its own agent.

How: the agent (``agent_service.MapOutputService``) listens on a Unix socket in Linux's abstract
namespace under a random name, written into its private discovery file (``agent_client``). On
each connection it asks the kernel who the peer is (``SO_PEERCRED``) and answers only a process
of this user that descends from the agent's executor JVM within ``MAX_DEPTH`` steps: the Python
workers Spark runs for that executor, the same processes a classic plan's closure hands the
secret to. The answer is one length-prefixed message, then the connection closes; the peer sends
nothing. Anyone else is refused by closing the connection, logged at most once a minute.

Errors are the engine's: an unreachable agent is ``PeerLostError``, a refusal
``ShuffleAuthenticationError``, a malformed answer ``ShuffleProtocolError``.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import struct
import threading

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.errors import (
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleProtocolError,
)
from arrowbeat_base.rate_log import RateLog

log = logging.getLogger(__name__)
_refused = RateLog(log)

MAX_DEPTH = 6
"""Parent steps from a Python worker up to its executor JVM searched (daemon, wrappers)."""
MAX_SECRET_BYTES = 4096
NAME = re.compile(r"arrowbeat-[0-9a-f]{32}")
"""What a desk's socket name looks like (a discovery file naming anything else is not trusted)."""
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_LENGTH = struct.Struct(">I")


def parent_pid(pid: int) -> int:
    """``pid``'s parent from ``/proc`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may contain spaces: the ppid follows the last ')'.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def ancestors(pid: int, depth: int = MAX_DEPTH) -> list[int]:
    """Up to ``depth`` ancestors of ``pid``, nearest first, init excluded."""
    found = []
    for _ in range(depth):
        pid = parent_pid(pid)
        if pid <= 1:
            break
        found.append(pid)
    return found


class SecretDesk:
    """The agent's side: answers this executor's own workers with the secret, refuses anyone else."""

    def __init__(self, secret: str | bytes, jvm_pid: int, poll_s: float = 0.25) -> None:
        self._secret = as_bytes(secret)
        if not 0 < len(self._secret) <= MAX_SECRET_BYTES:
            raise ShuffleConfigError(f"the secret must be 1..{MAX_SECRET_BYTES} bytes")
        if jvm_pid <= 1:
            raise ShuffleConfigError(f"jvm pid {jvm_pid}: no executor JVM to check workers against")
        self.jvm_pid = jvm_pid
        self.name = f"arrowbeat-{secrets.token_hex(16)}"
        self.handed = 0
        """Answers given (for tests and metrics)."""
        self._closed = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind("\0" + self.name)
            self._sock.listen(64)
            self._sock.settimeout(poll_s)  # the loop notices close() within poll_s
        except BaseException:
            self._sock.close()
            raise
        self._thread = threading.Thread(target=self._serve, name="shuffle-secret-desk", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed under us
                return
            with conn:
                try:
                    self._answer(conn)
                except OSError as exc:  # a peer that went away: its loss, never the desk's
                    log.debug("secret desk: %s", exc)

    def _answer(self, conn: socket.socket) -> None:
        pid, uid, _ = _CREDENTIALS.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
        )
        if uid != os.getuid() or self.jvm_pid not in ancestors(pid):
            _refused.warning(
                "refused",
                "refused the application secret to pid %d (uid %d): not a process of executor JVM %d",
                pid,
                uid,
                self.jvm_pid,
            )
            return
        conn.settimeout(2.0)
        conn.sendall(_LENGTH.pack(len(self._secret)) + self._secret)
        self.handed += 1

    def close(self) -> None:
        self._closed.set()
        self._sock.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)


def _receive(conn: socket.socket, size: int, who: str) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            if not data and size == _LENGTH.size:
                raise ShuffleAuthenticationError(
                    f"{who} refused this process the application secret (not one of its executor's workers)"
                )
            raise ShuffleProtocolError(f"{who} closed the connection in the middle of its answer")
        data += chunk
    return bytes(data)


def secret_from_agent(name: str, who: str, timeout_s: float = 10.0) -> str:
    """The application secret from the desk named ``name`` (a discovery file's ``secret_socket``)."""
    if not NAME.fullmatch(name):
        raise ShuffleConfigError(f"{who}: {name!r} is not a secret desk's name")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            conn.connect("\0" + name)
            (size,) = _LENGTH.unpack(_receive(conn, _LENGTH.size, who))
            if not 0 < size <= MAX_SECRET_BYTES:
                raise ShuffleProtocolError(f"{who} announced a secret of {size} bytes")
            raw = _receive(conn, size, who)
    except OSError as exc:
        raise PeerLostError(f"{who} did not answer for the application secret: {exc}") from exc
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ShuffleProtocolError(f"{who} answered a secret that is not UTF-8") from None
