"""The transport seam: a framed, bidirectional byte stream per channel.

``Connection`` is all the engine needs from a transport (send a frame, receive a header,
receive a payload into a given memory); ``Transport`` opens and accepts them. ``TcpTransport``
is the implementation chosen by measurement (see ``benchmarks/shuffle_transport.py``):
length-prefixed frames on plain sockets, payloads received with ``recv_into`` straight into the
memory the caller gives (Arrow memory that the decoded batches keep), and sent with ``sendmsg``
from where they are (``send_parts``: a record batch's own buffers). A frame sent with ``checksum``
carries the checksum of its payload after the header (``frames``), computed from the pieces where
they are; ``recv_header`` reads it with the header, and the receiver checks the payload against it
(``RemoteInputChannel``). Socket errors are mapped to ``PeerLostError`` / ``ChannelClosedError``.

"Is the peer lost?" is decided on the engine's ``Clock``, not by the socket: the socket's receive
timeout is only a short tick (``silence_tick``) at which the receiving thread wakes up and asks
the clock how long the peer has been silent; ``read_timeout_s`` of silence (the engine passes
``peer_timeout_s``) means it is lost. With a ``ManualClock`` a test jumps past the timeout and the
loss is seen at the next tick, no real waiting. Sending stays bounded by a real socket timeout of
``read_timeout_s`` (a stalled ``sendall`` cannot be resumed).

Silence is not the only bound: a peer dripping one byte per tick is never silent. A handshake or a
control call therefore sets an *overall* deadline (``set_deadline``), fixed when it starts and
checked on the same clock at every tick and after every byte, so nothing the peer sends extends it.

TLS (optional, ``TcpTransport(server_context=..., client_context=..., server_name=...)``): a client
wraps its socket in ``connect`` (handshake within ``timeout_s``); a server wraps an accepted socket
in ``TcpConnection.start_tls``, which the acceptor calls on the connection's own thread (never the
accept loop) under the handshake's overall deadline, before the HMAC handshake. A TLS socket keeps
Python-level timeouts (``settimeout``): Python's ``ssl`` retries kernel ``SO_RCVTIMEO`` timeouts,
so a silent TLS peer would otherwise block a reader forever. The plain path is unchanged.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from arrow_shuffle.errors import (
    ChannelClosedError,
    DeadlineExceededError,
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
)
from arrow_shuffle.frames import (
    CHECKSUM_SIZE,
    HEADER_SIZE,
    FrameHeader,
    Kind,
    pack_header,
    payload_crc,
    unpack_header,
    with_checksum,
)
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    import pyarrow as pa

_SOCKET_BUFFER = 4 << 20
_IOV_MAX = 1024
"""Most pieces one ``sendmsg`` takes (Linux's ``IOV_MAX``)."""
_MAX_TICK_S = 0.25


def silence_tick(read_timeout_s: float) -> float:
    """How often a silent receiver wakes to ask the clock whether the peer is lost: a quarter of
    the timeout, at most 0.25 s (so a loss is reported at most that late)."""
    return min(read_timeout_s / 4, _MAX_TICK_S)


class Connection(Protocol):
    """One framed stream. ``send`` is thread-safe; receiving is done by a single thread.

    A receive that hears nothing from the peer for the connection's read timeout (measured on
    the clock it was opened with) raises ``PeerLostError``."""

    peer: str

    def send(
        self,
        kind: Kind,
        payload: bytes | memoryview = b"",
        seq: int = 0,
        value: int = 0,
        *,
        checksum: bool = False,
    ) -> None:
        """One frame; with ``checksum`` (BUFFER frames) it carries the payload's checksum (``frames``)."""
        ...

    def send_parts(
        self,
        kind: Kind,
        parts: Sequence[bytes | pa.Buffer],
        size: int,
        seq: int = 0,
        value: int = 0,
        scratch: memoryview | None = None,
        *,
        checksum: bool = False,
    ) -> None:
        """``send`` of a payload given as pieces of ``size`` bytes in all, never joined where the
        transport can gather them (a record batch's own buffers go out without a copy); where it
        cannot, they are copied into ``scratch`` if it is large enough. The checksum is computed
        from the pieces where they are."""
        ...

    def recv_header(self, idle_ok: bool = False) -> FrameHeader | None:
        """The next header; a checksummed frame's with its ``crc`` (the payload is still to read)."""
        ...

    def recv_into(self, target: memoryview) -> None: ...

    def set_deadline(self, deadline: float | None, what: str = "handshake") -> None:
        """Receives after ``deadline`` (the connection clock's ``monotonic()``) raise
        ``DeadlineExceededError`` naming ``what``; ``None`` lifts it."""
        ...

    def try_send(self, kind: Kind) -> bool:
        """Send an empty frame unless that would wait (socket full, or another send in progress)."""
        ...

    def close(self) -> None: ...


class Listener(Protocol):
    address: tuple[str, int]

    def accept(self) -> Connection | None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Opens and accepts ``Connection``s; ``clock`` is the caller's, for their peer timeouts."""

    def connect(
        self, address: tuple[str, int], timeout_s: float, read_timeout_s: float, clock: Clock
    ) -> Connection: ...

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock) -> Listener: ...


class TcpConnection:
    """A ``Connection`` over a TCP socket: ``read_timeout_s`` of silence on ``clock`` means the
    peer is lost."""

    def __init__(
        self,
        sock: socket.socket,
        read_timeout_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        tls_server: ssl.SSLContext | None = None,
    ) -> None:
        self._sock = sock
        self._tls_server = tls_server
        self._tls_lock = threading.Lock()
        self.tls = isinstance(sock, ssl.SSLSocket)
        """The stream is inside TLS (a client's after ``connect``, a server's after ``start_tls``)."""
        self._send_lock = threading.Lock()
        self._header = bytearray(HEADER_SIZE + CHECKSUM_SIZE)
        self._closed = False
        self._clock = clock
        self._heard_at = clock.monotonic()
        self._deadline: float | None = None
        self._deadline_what = ""
        self.read_timeout_s = read_timeout_s
        self.silent_ticks = 0
        """Receive ticks that passed with nothing from the peer (each one looked at the clock)."""
        self.peer = _peer_name(sock)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        if self.tls:
            self._tls_timeouts()
        else:
            # Kernel-side timeouts on a blocking socket: Python's settimeout() would add a poll()
            # syscall before every recv/send, which costs throughput on 1 MiB frames.
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(silence_tick(read_timeout_s)))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(read_timeout_s))

    def _tls_timeouts(self) -> None:
        """A TLS socket is non-blocking, every ``ssl`` call made under ``_tls_lock`` and every wait
        done by ``select`` outside it: OpenSSL allows no concurrent use of one connection (the
        receiving thread and a sender share it), and Python's ``ssl`` retries a kernel
        ``SO_RCVTIMEO``, so a blocking TLS read would never wake for the silence tick."""
        self._sock.setblocking(False)

    def _recv_tls(self, view: memoryview) -> int:
        """``recv_into`` for a TLS socket: bytes once a whole record is in, else ``TimeoutError``
        when a silence tick passes with nothing arriving (the caller's tick handling, as on plain
        TCP). Bytes that do not yet complete a record do not reset the handshake deadline."""
        tick = silence_tick(self.read_timeout_s)
        while True:
            with self._tls_lock:
                try:
                    return self._sock.recv_into(view)
                except ssl.SSLWantReadError:
                    readable = True
                except ssl.SSLWantWriteError:
                    readable = False
            if self._deadline is not None:
                self._check_deadline()
            if readable:
                ready = select.select([self._sock], [], [], tick)[0]
            else:
                ready = select.select([], [self._sock], [], tick)[1]
            if not ready:
                raise TimeoutError("silence tick")

    def start_tls(self) -> None:
        """Server side: run the TLS handshake of an accepted socket within the deadline set by
        ``set_deadline`` (the acceptor's overall handshake deadline); a no-op without TLS.

        Raises ``DeadlineExceededError`` when the peer is too slow or silent, and
        ``ShuffleAuthenticationError`` when it does not speak TLS or refuses the certificate."""
        context, self._tls_server = self._tls_server, None
        if context is None or self.tls:
            return
        deadline = self._deadline
        remaining = self.read_timeout_s if deadline is None else deadline - self._clock.monotonic()
        if remaining <= 0:
            self._check_deadline()
            remaining = 0.001
        raw = self._sock
        raw.settimeout(remaining)  # one overall bound: CPython's do_handshake keeps one deadline
        try:
            wrapped = context.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError) as exc:
            raise self._lost("cannot start TLS", exc) from exc
        self._sock = wrapped
        try:
            wrapped.do_handshake()
        except TimeoutError as exc:
            raise DeadlineExceededError(
                f"peer {self.peer}: {self._deadline_what or 'TLS handshake'} not completed by its "
                "deadline (silent, stopped or too slow a peer)"
            ) from exc
        except ssl.SSLError as exc:
            raise ShuffleAuthenticationError(
                f"peer {self.peer}: TLS handshake failed ({exc.reason or type(exc).__name__}); "
                "a client without this application's TLS settings?"
            ) from None
        except OSError as exc:
            raise self._lost("TLS handshake failed", exc) from exc
        self.tls = True
        self._heard_at = self._clock.monotonic()
        self._tls_timeouts()

    @property
    def heard_at(self) -> float:
        """When a byte last arrived from the peer (``clock.monotonic()``; creation time before)."""
        return self._heard_at

    def send(
        self,
        kind: Kind,
        payload: bytes | memoryview = b"",
        seq: int = 0,
        value: int = 0,
        *,
        checksum: bool = False,
    ) -> None:
        header = pack_header(kind, len(payload), seq, value, payload_crc((payload,)) if checksum else None)
        with self._send_lock:
            self._check_open()
            if self.tls:
                self._send_tls(header, payload)
                return
            try:
                if len(payload) <= 4096:
                    self._sock.sendall(header + bytes(payload))
                else:
                    self._send_two(header, memoryview(payload))
            except (BlockingIOError, TimeoutError) as exc:
                raise self._lost(f"send stalled for {self.read_timeout_s:.1f}s", exc) from exc
            except OSError as exc:
                raise self._lost("send failed", exc) from exc

    def send_parts(
        self,
        kind: Kind,
        parts: Sequence[bytes | pa.Buffer],
        size: int,
        seq: int = 0,
        value: int = 0,
        scratch: memoryview | None = None,
        *,
        checksum: bool = False,
    ) -> None:
        """Plain TCP: header and pieces in one ``sendmsg`` (the kernel gathers them from where they
        are: no copy in user space). TLS has no ``sendmsg`` and would cut a record per piece: the
        pieces are copied together first, into ``scratch`` when it is large enough (the pool
        buffer the payload holds anyway; no allocation per frame). The checksum is computed from
        the pieces themselves, before any copy."""
        total = 0
        for part in parts:
            total += len(part)
        if total != size:
            raise ShuffleError(f"internal: payload pieces hold {total} bytes, not {size} (to {self.peer})")
        header = pack_header(kind, size, seq, value, payload_crc(parts) if checksum else None)
        with self._send_lock:
            self._check_open()
            if self.tls:
                views = [memoryview(part).cast("B") for part in parts]
                self._send_tls(header, _joined(views, size, scratch))
                return
            try:
                self._send_gather([header, *parts])
            except (BlockingIOError, TimeoutError) as exc:
                raise self._lost(f"send stalled for {self.read_timeout_s:.1f}s", exc) from exc
            except OSError as exc:
                raise self._lost("send failed", exc) from exc

    def _send_gather(self, pieces: list[bytes | pa.Buffer]) -> None:
        """Every byte of ``pieces`` with ``sendmsg`` (which takes any buffer as it is), resuming
        after a partial send."""
        views: list[bytes | pa.Buffer | memoryview] = [p for p in pieces if len(p)]
        i = 0
        while i < len(views):
            sent = self._sock.sendmsg(views[i : i + _IOV_MAX])
            while sent > 0:
                n = len(views[i])
                if sent < n:
                    views[i] = memoryview(views[i]).cast("B")[sent:]
                    break
                sent -= n
                i += 1

    def _send_tls(self, header: bytes, payload: bytes | memoryview) -> None:
        """``sendall`` for a TLS socket (no ``sendmsg`` there; the caller holds ``_send_lock``): a
        write that would block is retried with the same bytes (as OpenSSL requires) when the
        socket has room, for at most ``read_timeout_s`` on the connection's clock."""
        give_up = self._clock.monotonic() + self.read_timeout_s
        for part in (header + bytes(payload),) if len(payload) <= 4096 else (header, payload):
            view = memoryview(part).cast("B")
            while view:
                want_read = False
                with self._tls_lock:
                    try:
                        view = view[self._sock.send(view) :]
                        continue
                    except ssl.SSLWantWriteError:
                        pass
                    except ssl.SSLWantReadError:
                        want_read = True
                    except OSError as exc:
                        raise self._lost("send failed", exc) from exc
                left = give_up - self._clock.monotonic()
                if left <= 0:
                    raise self._lost(f"send stalled for {self.read_timeout_s:.1f}s", None)
                wait = min(left, silence_tick(self.read_timeout_s))
                if want_read:
                    select.select([self._sock], [], [], wait)
                else:
                    select.select([], [self._sock], [], wait)

    def try_send(self, kind: Kind) -> bool:
        """An empty frame (a keepalive) if it can go out at once; ``False`` if that would wait.

        A peer that stops reading must not hold up the thread that keeps other peers alive."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            if self._closed:
                return False
            header = pack_header(kind, 0)
            if self.tls:  # no MSG_DONTWAIT on TLS: send only into a socket with room
                try:
                    if not select.select([], [self._sock], [], 0)[1]:
                        return False
                    self._send_tls(header, b"")
                except (OSError, ValueError, PeerLostError):
                    return False
                return True
            try:
                sent = self._sock.send(header, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return False  # the receiving thread sees the loss
            if sent < len(header):  # never split a frame: finish it (bounded by SO_SNDTIMEO)
                try:
                    self._sock.sendall(header[sent:])
                except OSError:
                    return False
            return True
        finally:
            self._send_lock.release()

    def set_deadline(self, deadline: float | None, what: str = "handshake") -> None:
        self._deadline = deadline
        self._deadline_what = what

    def _send_two(self, header: bytes, payload: memoryview) -> None:
        """Header and payload in one ``sendmsg`` (one syscall in the common case)."""
        sent = self._sock.sendmsg([header, payload])
        if sent < len(header):
            self._sock.sendall(header[sent:])
            sent = len(header)
        if sent - len(header) < len(payload):
            self._sock.sendall(payload[sent - len(header) :])

    def recv_header(self, idle_ok: bool = False) -> FrameHeader | None:
        """The next header, and the checksum after it if it has one. With ``idle_ok``, ``None``
        when a silence tick passes before any byte of it (the caller checks its own state and
        calls again); the peer is never lost then."""
        view = memoryview(self._header)
        if not self._recv_exact(view[:HEADER_SIZE], idle_ok):
            return None
        header = unpack_header(view)
        if header.checksummed:
            trailer = view[HEADER_SIZE:]
            self._recv_exact(trailer, False)
            header = with_checksum(header, trailer)
        return header

    def recv_into(self, target: memoryview) -> None:
        self._recv_exact(target, False)

    def _recv_exact(self, view: memoryview, idle_ok: bool) -> bool:
        got = 0
        while got < len(view):
            try:
                if self.tls:
                    n = self._recv_tls(view[got:])
                else:
                    # MSG_WAITALL: the kernel fills the whole view before it returns (or a silence
                    # tick passes: SO_RCVTIMEO still bounds the call, it returns what it has), so a
                    # 1 MiB payload costs one system call and one GIL hand-back, not one per segment.
                    n = self._sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
            except (BlockingIOError, TimeoutError) as exc:  # SO_RCVTIMEO: one silence tick
                self.silent_ticks += 1
                if self._deadline is not None:
                    self._check_deadline()
                if idle_ok and got == 0:
                    return False
                if self._clock.monotonic() - self._heard_at < self.read_timeout_s:
                    continue
                raise self._lost(f"no data for {self.read_timeout_s:.1f}s (peer hung or gone)", exc) from exc
            except OSError as exc:
                raise self._lost("receive failed", exc) from exc
            if n == 0:
                raise self._lost("connection closed by peer (EOF)", None)
            self._heard_at = self._clock.monotonic()
            got += n
            if self._deadline is not None:
                self._check_deadline()
        return True

    def _check_deadline(self) -> None:
        deadline = self._deadline
        if deadline is not None and self._clock.monotonic() >= deadline and not self._closed:
            raise DeadlineExceededError(
                f"peer {self.peer}: {self._deadline_what} not completed by its deadline "
                "(silent, stopped or too slow a peer)"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"connection to {self.peer} was closed locally")

    def _lost(self, what: str, exc: BaseException | None) -> Exception:
        if self._closed:
            return ChannelClosedError(f"connection to {self.peer} was closed locally")
        detail = f": {exc}" if exc is not None else ""
        return PeerLostError(f"peer {self.peer}: {what}{detail}")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _joined(views: list[memoryview], size: int, scratch: memoryview | None) -> memoryview | bytes:
    """The pieces as one contiguous payload: copied into ``scratch``, or into new bytes."""
    if scratch is None or len(scratch) < size:
        return b"".join(views)
    out = scratch.cast("B")
    offset = 0
    for view in views:
        out[offset : offset + len(view)] = view
        offset += len(view)
    return out[:size]


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for ``SO_RCVTIMEO`` / ``SO_SNDTIMEO``."""
    whole = int(seconds)
    return struct.pack("ll", whole, int((seconds - whole) * 1e6))


def _peer_name(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "<unconnected>"
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return f"local:{sock.fileno()}"


class TcpListener:
    """Accepts ``TcpConnection``s that measure their peer timeout on ``clock``."""

    def __init__(
        self,
        host: str,
        port: int,
        read_timeout_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._ssl_context = ssl_context
        self._sock = socket.create_server((host, port), backlog=128)
        self._sock.settimeout(0.2)
        self._read_timeout_s = read_timeout_s
        self._clock = clock
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._closed = False

    def accept(self) -> Connection | None:
        """A new connection, or ``None`` after a short idle wait (so the loop can check closed)."""
        try:
            sock, _ = self._sock.accept()
        except TimeoutError:
            return None
        except OSError as exc:
            if self._closed:
                raise ChannelClosedError("listener closed") from exc
            raise
        try:
            return TcpConnection(sock, self._read_timeout_s, self._clock, tls_server=self._ssl_context)
        except BaseException:  # e.g. the peer reset before setsockopt: never leak the socket
            sock.close()
            raise

    def close(self) -> None:
        self._closed = True
        self._sock.close()


class TcpTransport:
    """TCP sockets; the measured winner over Flight ``do_exchange`` on this machine.

    Optionally TLS: ``server_context`` (an ``ssl.SSLContext`` for the server side) makes listeners
    wrap every accepted connection (``TcpConnection.start_tls``, run by the acceptor under the
    handshake deadline); ``client_context`` with ``server_name`` (the name the server's certificate
    must carry, whatever host is dialled) makes ``connect`` wrap. Plain TCP without either."""

    def __init__(
        self,
        *,
        server_context: ssl.SSLContext | None = None,
        client_context: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        if client_context is not None and not server_name:
            raise ShuffleConfigError("a TLS client context needs the server name to check")
        self.server_context = server_context
        self.client_context = client_context
        self.server_name = server_name

    def connect(
        self, address: tuple[str, int], timeout_s: float, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK
    ) -> Connection:
        """Connect within ``timeout_s`` (a real socket deadline: no clock can speed up a SYN)."""
        try:
            sock = socket.create_connection(address, timeout=timeout_s)
        except OSError as exc:
            raise PeerLostError(f"cannot connect to shuffle server {address[0]}:{address[1]}: {exc}") from exc
        if self.client_context is not None:
            sock = self._wrap_client(sock, address, timeout_s)
        try:
            return TcpConnection(sock, read_timeout_s, clock)
        except BaseException:
            sock.close()
            raise

    def _wrap_client(self, sock: socket.socket, address: tuple[str, int], timeout_s: float) -> socket.socket:
        """The TLS handshake of a new client socket, within ``timeout_s`` overall."""
        assert self.client_context is not None
        where = f"{address[0]}:{address[1]}"
        try:
            sock.settimeout(timeout_s)
            wrapped = self.client_context.wrap_socket(
                sock, server_hostname=self.server_name, do_handshake_on_connect=False
            )
        except (OSError, ValueError) as exc:
            sock.close()
            raise PeerLostError(f"cannot start TLS to {where}: {exc}") from exc
        try:
            wrapped.do_handshake()
        except TimeoutError as exc:
            wrapped.close()
            raise DeadlineExceededError(
                f"TLS handshake with {where} not completed in {timeout_s:.1f}s"
            ) from exc
        except ssl.SSLError as exc:
            wrapped.close()
            raise ShuffleAuthenticationError(
                f"TLS handshake with {where} failed ({exc.reason or type(exc).__name__}): "
                "not this application's server, or not TLS"
            ) from None
        except OSError as exc:
            wrapped.close()
            raise PeerLostError(f"TLS handshake with {where} failed: {exc}") from exc
        return wrapped

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> Listener:
        return TcpListener(host, port, read_timeout_s, clock, ssl_context=self.server_context)
