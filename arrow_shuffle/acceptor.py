"""``Acceptor``: the accept loop and handshake gate shared by every arrowbeat server socket
(``PartitionServer`` for data, ``control_server.ControlServer`` for control requests).

Why one component: each of the old loops had its own way to be stalled. Here

- the accept thread only accepts and hands off: the handshake runs on the connection's own
  thread, so a silent peer holds one thread of its own, never the door;
- the handshake (and whatever the server counts as "getting in", e.g. the data server's
  partition request) has an overall deadline fixed when the connection is handed off,
  ``handshake_timeout_s`` on the server's clock; a peer dripping a byte at a time cannot extend it;
- at most ``max_pending`` connections may be waiting to authenticate and at most ``max_served``
  be served; beyond either, a new connection gets a BUSY error frame and is closed, counted;
- the loop survives every exception: a failing ``accept`` (``EMFILE``: out of descriptors) backs
  off and retries, a thread that cannot be started (``RuntimeError: can't start new thread``)
  costs that one connection;
- every refusal is counted per cause and logged once per cause per ``log_interval_s``
  (``RefusalLog``, a ``arrowbeat_base.rate_log.RateLog``), so a flood of bad peers is one log line a
  minute, not a disk full of them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from arrow_shuffle.errors import (
    ChannelClosedError,
    DeadlineExceededError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.frames import ErrorCode, Kind
from arrow_shuffle.transport import Connection, Listener
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog

T = TypeVar("T")

PENDING_LIMIT = "pending-limit"
SERVED_LIMIT = "served-limit"
THREAD_START = "thread-start"
ACCEPT_ERROR = "accept-error"
HANDSHAKE_DEADLINE = "handshake-deadline"
AUTHENTICATION = "authentication"
PROTOCOL = "protocol"
PEER_LOST = "peer-lost"
INTERNAL = "internal"
"""Refusal causes, as counted by ``Acceptor.refusals()`` and named in the log."""


@dataclass(frozen=True)
class AcceptLimits:
    """How long a connection may take to get in, and how many may be waiting or served."""

    handshake_timeout_s: float = 5.0
    max_pending: int = 64
    max_served: int = 256
    log_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.handshake_timeout_s <= 3600:
            raise ShuffleConfigError(f"handshake_timeout_s={self.handshake_timeout_s} must be in (0, 3600]")
        if self.max_pending < 1 or self.max_served < 1:
            raise ShuffleConfigError(
                f"max_pending={self.max_pending} and max_served={self.max_served} must be >= 1"
            )


class RefusalLog(RateLog):
    """The refusals of one server: counted per cause (``counts()``), each cause logged as
    ``<server> refused (<cause>): ...`` at most once per ``interval_s`` (on ``clock``), with the
    number of refusals left unlogged since its last line. The rate is ``arrowbeat_base.rate_log``'s."""

    def __init__(self, logger: logging.Logger, name: str, clock: Clock, interval_s: float) -> None:
        super().__init__(logger, interval_s, clock, more=" (and {} more of this cause since the last report)")
        self._name = name

    def refuse(self, cause: str, message: str, level: int = logging.WARNING, exc_info: bool = False) -> None:
        self.log(cause, level, "%s refused (%s): %s", self._name, cause, message, exc_info=exc_info)


def _start_thread(thread: threading.Thread) -> None:
    """``thread.start()``; a seam for tests that make it fail as an exhausted process does."""
    thread.start()


def _cause(exc: ShuffleError) -> str:
    if isinstance(exc, DeadlineExceededError):
        return HANDSHAKE_DEADLINE
    if isinstance(exc, ShuffleAuthenticationError):
        return AUTHENTICATION
    if isinstance(exc, ShuffleProtocolError):
        return PROTOCOL
    if isinstance(exc, PeerLostError):
        return PEER_LOST
    return INTERNAL


def error_code(exc: ShuffleError) -> ErrorCode:
    """The ERROR frame code telling a peer why it was refused."""
    if isinstance(exc, ShuffleAuthenticationError):
        return ErrorCode.AUTHENTICATION
    if isinstance(exc, ShuffleProtocolError):
        return ErrorCode.PROTOCOL
    return ErrorCode.OTHER


class Acceptor(Generic[T]):
    """Accepts on ``listener``; each connection runs ``authenticate(conn)`` under the handshake
    deadline, then ``serve(conn, result)`` on the same thread, and is closed afterwards.

    ``on_refused(conn, exc)`` (optional) turns a handshake failure into the error that is logged
    and sent back (e.g. naming a partition) and may record it; ``serve`` handles its own errors."""

    def __init__(
        self,
        listener: Listener,
        name: str,
        authenticate: Callable[[Connection], T],
        serve: Callable[[Connection, T], None],
        *,
        limits: AcceptLimits | None = None,
        clock: Clock = SYSTEM_CLOCK,
        logger: logging.Logger | None = None,
        on_refused: Callable[[Connection, ShuffleError], ShuffleError] | None = None,
    ) -> None:
        self.name = name
        self.limits = limits or AcceptLimits()
        self._listener = listener
        self._authenticate = authenticate
        self._serve = serve
        self._clock = clock
        self._on_refused = on_refused
        self.log = RefusalLog(logger or logging.getLogger(__name__), name, clock, self.limits.log_interval_s)
        self._lock = threading.Lock()
        self._pending = 0
        self._served = 0
        self._conns: set[Connection] = set()
        self._threads: set[threading.Thread] = set()
        self._closed = threading.Event()
        self._accept_thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)
        self._accept_thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self._listener.address

    def refusals(self) -> dict[str, int]:
        """Connections refused so far, by cause (``PENDING_LIMIT``, ``HANDSHAKE_DEADLINE``, ...)."""
        return self.log.counts()

    def load(self) -> tuple[int, int]:
        """``(pending, served)`` connections right now."""
        with self._lock:
            return self._pending, self._served

    def connections(self) -> list[Connection]:
        with self._lock:
            return list(self._conns)

    def close(self) -> None:
        """Stop accepting, close every connection, wait (bounded) for their threads."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(Exception):
            self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()
        if self._accept_thread is not threading.current_thread():
            self._accept_thread.join(timeout=5)
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(timeout=5)

    # -- the accept thread: accept and hand off, nothing else -----------------------------------
    def _accept_loop(self) -> None:
        backoff = 0.0
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except ChannelClosedError:
                if not self._closed.is_set():
                    self.log.refuse(ACCEPT_ERROR, "the listening socket was closed under us", logging.ERROR)
                return
            except Exception as exc:  # EMFILE/ENFILE/ENOBUFS...: wait for descriptors to free up
                if self._closed.is_set():
                    return
                self.log.refuse(ACCEPT_ERROR, f"accept failed: {exc!r}; retrying", logging.ERROR)
                backoff = min(max(backoff * 2, 0.01), 1.0)
                self._closed.wait(backoff)
                continue
            backoff = 0.0
            if conn is None:
                continue
            try:
                self._hand_off(conn)
            except Exception as exc:  # nothing may end this loop but close()
                with contextlib.suppress(Exception):
                    conn.close()
                self.log.refuse(INTERNAL, f"handing off {conn.peer} failed: {exc!r}", logging.ERROR, True)

    def _hand_off(self, conn: Connection) -> None:
        with self._lock:
            closed = self._closed.is_set()
            full = self._pending >= self.limits.max_pending
            if not (closed or full):
                self._pending += 1
                self._conns.add(conn)
        if closed:
            conn.close()
            return
        if full:
            self.log.refuse(
                PENDING_LIMIT,
                f"{conn.peer}: {self.limits.max_pending} connections are already authenticating",
            )
            self._busy(conn, f"{self.limits.max_pending} connections are already authenticating")
            return
        thread = threading.Thread(target=self._handle, args=(conn,), name=f"{self.name}-conn", daemon=True)
        with self._lock:
            self._threads.add(thread)
        try:
            _start_thread(thread)
        except Exception as exc:  # RuntimeError("can't start new thread") and its kin
            with self._lock:
                self._threads.discard(thread)
                self._pending -= 1
                self._conns.discard(conn)
            self.log.refuse(
                THREAD_START, f"{conn.peer}: cannot start a thread for it: {exc!r}", logging.ERROR
            )
            conn.close()

    @staticmethod
    def _busy(conn: Connection, why: str) -> None:
        with contextlib.suppress(Exception):
            conn.send(Kind.ERROR, f"server busy: {why}".encode(), value=ErrorCode.BUSY)
        with contextlib.suppress(Exception):
            conn.close()

    # -- one connection's thread ----------------------------------------------------------------
    def _handle(self, conn: Connection) -> None:
        phase = "pending"
        try:
            conn.set_deadline(self._clock.monotonic() + self.limits.handshake_timeout_s, "handshake")
            try:
                start_tls = getattr(conn, "start_tls", None)  # TLS first, under the same deadline
                if start_tls is not None:
                    start_tls()
                result = self._authenticate(conn)
            finally:
                conn.set_deadline(None)
            with self._lock:
                self._pending -= 1
                if self._served >= self.limits.max_served:
                    phase = "refused"
                else:
                    self._served += 1
                    phase = "served"
            if phase == "refused":
                self.log.refuse(SERVED_LIMIT, f"{conn.peer}: {self.limits.max_served} connections are served")
                self._busy(conn, f"{self.limits.max_served} connections are served")
                return
            self._serve(conn, result)
        except ShuffleError as exc:
            if phase == "pending" and not self._closed.is_set():
                self._refused(conn, exc)
        except Exception as exc:  # a bug in a handler: this connection only
            if not self._closed.is_set():
                self.log.refuse(INTERNAL, f"{conn.peer}: {exc!r}", logging.ERROR, True)
        finally:
            with self._lock:
                if phase == "pending":
                    self._pending -= 1
                elif phase == "served":
                    self._served -= 1
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
            with contextlib.suppress(Exception):
                conn.close()

    def _refused(self, conn: Connection, exc: ShuffleError) -> None:
        if isinstance(exc, ChannelClosedError):
            return
        cause = _cause(exc)
        error = self._on_refused(conn, exc) if self._on_refused is not None else exc
        message = str(error) if conn.peer in str(error) else f"{error} (peer {conn.peer})"
        self.log.refuse(cause, message, logging.INFO if cause == PEER_LOST else logging.WARNING)
        if cause != PEER_LOST:  # a peer that hung up cannot read it
            with contextlib.suppress(Exception):
                conn.send(Kind.ERROR, message.encode()[:4096], value=error_code(error))
