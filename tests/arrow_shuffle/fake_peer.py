"""A misbehaving shuffle server for fault tests: authenticates, then sends scripted frames."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from arrow_shuffle.auth import server_handshake
from arrow_shuffle.errors import ShuffleError
from arrow_shuffle.transport import TcpConnection

Script = Callable[[TcpConnection, int], None]
"""Given the connection and the announced initial credit, send whatever frames to test."""


class FakeServer:
    def __init__(self, secret: bytes, script: Script, *, hang_up: bool = False) -> None:
        """``hang_up``: close the connection as soon as the script is done (a server that ends
        after END without waiting for the reader), instead of holding it until ``close()``."""
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._secret = secret
        self._script = script
        self.done = threading.Event()
        self.hung_up = threading.Event()
        self._hang_up = hang_up
        self.credits: list[int] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock, _ = self._sock.accept()
        conn = TcpConnection(sock, 5.0)
        try:
            server_handshake(conn, self._secret)
            header = conn.recv_header()
            assert header is not None
            conn.recv_into(memoryview(bytearray(header.length)))
            with contextlib.suppress(ShuffleError):  # the receiver hung up on us, as it should
                self._script(conn, header.value)
            if not self._hang_up:
                self.done.wait(10)  # keep the socket open until the test has seen the error
        finally:
            conn.close()
            self._sock.close()
            self.hung_up.set()

    def close(self) -> None:
        self.done.set()
        self._thread.join(10)
