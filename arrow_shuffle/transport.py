"""The transport seam: a framed, bidirectional byte stream per channel.

``Connection`` is all the engine needs from a transport (send a frame, receive a header,
receive a payload into a given memory); ``Transport`` opens and accepts them. ``TcpTransport``
is the implementation chosen by measurement (see ``benchmarks/shuffle_transport.py``):
length-prefixed frames on plain sockets, payloads received with ``recv_into`` straight into
pooled segments. Socket errors are mapped to ``PeerLostError`` / ``ChannelClosedError``.

"Is the peer lost?" is decided on the engine's ``Clock``, not by the socket: the socket's receive
timeout is only a short tick (``silence_tick``) at which the receiving thread wakes up and asks
the clock how long the peer has been silent; ``read_timeout_s`` of silence (the engine passes
``peer_timeout_s``) means it is lost. With a ``ManualClock`` a test jumps past the timeout and the
loss is seen at the next tick, no real waiting. Sending stays bounded by a real socket timeout of
``read_timeout_s`` (a stalled ``sendall`` cannot be resumed).

Silence is not the only bound: a peer dripping one byte per tick is never silent. A handshake or a
control call therefore sets an *overall* deadline (``set_deadline``), fixed when it starts and
checked on the same clock at every tick and after every byte, so nothing the peer sends extends it.

TLS (a later step) wraps the socket at the two places sockets are made: ``TcpTransport.connect``
and ``TcpListener.accept``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Protocol

from arrow_shuffle.errors import ChannelClosedError, DeadlineExceededError, PeerLostError
from arrow_shuffle.frames import HEADER_SIZE, FrameHeader, Kind, unpack_header
from heartbeat.clock import SYSTEM_CLOCK, Clock

_SOCKET_BUFFER = 4 << 20
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

    def send(self, kind: Kind, payload: bytes | memoryview = b"", seq: int = 0, value: int = 0) -> None: ...

    def recv_header(self, idle_ok: bool = False) -> FrameHeader | None: ...

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

    def __init__(self, sock: socket.socket, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._header = bytearray(HEADER_SIZE)
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
        # Kernel-side timeouts on a blocking socket: Python's settimeout() would add a poll()
        # syscall before every recv/send, which costs throughput on 1 MiB frames.
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(silence_tick(read_timeout_s)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(read_timeout_s))

    @property
    def heard_at(self) -> float:
        """When a byte last arrived from the peer (``clock.monotonic()``; creation time before)."""
        return self._heard_at

    def send(self, kind: Kind, payload: bytes | memoryview = b"", seq: int = 0, value: int = 0) -> None:
        header = FrameHeader(kind, len(payload), seq, value).pack()
        with self._send_lock:
            self._check_open()
            try:
                if len(payload) <= 4096:
                    self._sock.sendall(header + bytes(payload))
                else:
                    self._send_two(header, memoryview(payload))
            except (BlockingIOError, TimeoutError) as exc:
                raise self._lost(f"send stalled for {self.read_timeout_s:.1f}s", exc) from exc
            except OSError as exc:
                raise self._lost("send failed", exc) from exc

    def try_send(self, kind: Kind) -> bool:
        """An empty frame (a keepalive) if it can go out at once; ``False`` if that would wait.

        A peer that stops reading must not hold up the thread that keeps other peers alive."""
        if not self._send_lock.acquire(blocking=False):
            return False
        try:
            if self._closed:
                return False
            header = FrameHeader(kind, 0).pack()
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
        """The next header. With ``idle_ok``, ``None`` when a silence tick passes before any byte
        of it (the caller checks its own state and calls again); the peer is never lost then."""
        view = memoryview(self._header)
        if not self._recv_exact(view, idle_ok):
            return None
        return unpack_header(self._header)

    def recv_into(self, target: memoryview) -> None:
        self._recv_exact(target, False)

    def _recv_exact(self, view: memoryview, idle_ok: bool) -> bool:
        got = 0
        while got < len(view):
            try:
                n = self._sock.recv_into(view[got:])
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

    def __init__(self, host: str, port: int, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> None:
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
            return TcpConnection(sock, self._read_timeout_s, self._clock)
        except BaseException:  # e.g. the peer reset before setsockopt: never leak the socket
            sock.close()
            raise

    def close(self) -> None:
        self._closed = True
        self._sock.close()


class TcpTransport:
    """Plain TCP sockets; the measured winner over Flight ``do_exchange`` on this machine."""

    def connect(
        self, address: tuple[str, int], timeout_s: float, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK
    ) -> Connection:
        """Connect within ``timeout_s`` (a real socket deadline: no clock can speed up a SYN)."""
        try:
            sock = socket.create_connection(address, timeout=timeout_s)
        except OSError as exc:
            raise PeerLostError(f"cannot connect to shuffle server {address[0]}:{address[1]}: {exc}") from exc
        return TcpConnection(sock, read_timeout_s, clock)

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> Listener:
        return TcpListener(host, port, read_timeout_s, clock)
