"""A TCP relay between a reader and a shuffle server that reads the server's frames off the wire.

It parses what the server sends with its own ``struct`` reading (not the engine's ``recv_header``),
so a test sees the bytes as they travel: each frame's kind, raw flags byte, the checksum after the
header if there is one, and the payload. ``damage`` may change a BUFFER payload on its way (a bit
flipped between the two processes); the header and checksum go on unchanged. The reader's frames
(credit, cancel) are relayed untouched.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from arrow_shuffle.frames import HEADER, Kind

Damage = Callable[[int, bytearray], None]
"""Given the BUFFER frame's index on its stream (0, 1, ...) and its payload, change it in place."""

_CRC = struct.Struct("!I")


@dataclass(frozen=True)
class SeenFrame:
    kind: int
    flags: int
    crc: bytes | None
    """The 4 bytes after the header when the flags say a checksum follows, else ``None``."""
    payload: bytes
    """As the server sent it (before any damage)."""

    @property
    def sent_crc(self) -> int | None:
        return None if self.crc is None else int(_CRC.unpack(self.crc)[0])


class FrameProxy:
    """Relays one connection at a time to ``upstream``; ``frames`` lists what the server sent."""

    def __init__(self, upstream: tuple[str, int], damage: Damage | None = None) -> None:
        self._upstream = upstream
        self._damage = damage
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self.frames: list[SeenFrame] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="frame-proxy", daemon=True)]
        self._threads[0].start()

    def buffers(self) -> list[SeenFrame]:
        with self._lock:
            return [f for f in self.frames if f.kind == Kind.BUFFER]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                down, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            up = socket.create_connection(self._upstream, timeout=10)
            down.settimeout(30)
            up.settimeout(30)
            with self._lock:
                self._socks += [down, up]
            for target, args in ((self._pipe, (down, up)), (self._frames, (up, down))):
                thread = threading.Thread(target=target, args=args, daemon=True)
                thread.start()
                self._threads.append(thread)

    @staticmethod
    def _exact(sock: socket.socket, n: int) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        """The reader's bytes to the server, as they come."""
        with contextlib.suppress(OSError):
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _frames(self, src: socket.socket, dst: socket.socket) -> None:
        """The server's frames to the reader, one by one, read and recorded (and maybe damaged)."""
        index = 0
        try:
            while (head := self._exact(src, HEADER.size)) is not None:
                _magic, kind, flags, length, _seq, _value = HEADER.unpack(head)
                crc = self._exact(src, _CRC.size) if flags & 0x01 else None
                payload = self._exact(src, length) if length else b""
                if payload is None or (flags & 0x01 and crc is None):
                    break
                with self._lock:
                    self.frames.append(SeenFrame(kind, flags, crc, payload))
                out = bytearray(payload)
                if kind == Kind.BUFFER:
                    if self._damage is not None:
                        self._damage(index, out)
                    index += 1
                dst.sendall(head + (crc or b"") + out)
        except OSError:
            pass  # either side hung up
        except BaseException as exc:  # a test's damage function failed: seen by the test
            self.errors.append(exc)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        self._server.close()
        with self._lock:
            socks = list(self._socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(10)
