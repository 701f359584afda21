"""An in-process ``Transport``: connections are socket pairs handed over a queue, no TCP, no ports.

Proves the engine depends only on the ``Transport``/``Connection`` seam (httpx ``MockTransport``
style), and lets tests observe or sever one stream without touching others.
"""

from __future__ import annotations

import itertools
import queue
import socket

from arrow_shuffle.errors import ChannelClosedError, PeerLostError
from arrow_shuffle.transport import Connection, Listener, TcpConnection
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

_ports = itertools.count(1)


class MemoryListener:
    def __init__(
        self, registry: dict[tuple[str, int], MemoryListener], read_timeout_s: float, clock: Clock
    ) -> None:
        self.address = ("memory", next(_ports))
        self._pending: queue.Queue[socket.socket] = queue.Queue()
        self._registry = registry
        self._read_timeout_s = read_timeout_s
        self._clock = clock
        self._closed = False
        registry[self.address] = self

    def offer(self, sock: socket.socket) -> None:
        self._pending.put(sock)

    def accept(self) -> Connection | None:
        if self._closed:
            raise ChannelClosedError("listener closed")
        try:
            sock = self._pending.get(timeout=0.2)
        except queue.Empty:
            return None
        return TcpConnection(sock, self._read_timeout_s, self._clock)

    def close(self) -> None:
        self._closed = True
        self._registry.pop(self.address, None)


class MemoryTransport:
    """Connect to listeners of the same ``MemoryTransport`` instance by their address."""

    def __init__(self) -> None:
        self.listeners: dict[tuple[str, int], MemoryListener] = {}
        self.connections: list[TcpConnection] = []
        self.server_ends: list[socket.socket] = []
        """``server_ends[i]`` is the raw socket the server got for ``connections[i]``."""

    def connect(
        self, address: tuple[str, int], timeout_s: float, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK
    ) -> Connection:
        listener = self.listeners.get(address)
        if listener is None:
            raise PeerLostError(f"no in-memory listener at {address}")
        mine, theirs = socket.socketpair()
        self.server_ends.append(theirs)
        listener.offer(theirs)
        conn = TcpConnection(mine, read_timeout_s, clock)
        self.connections.append(conn)
        return conn

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> Listener:
        return MemoryListener(self.listeners, read_timeout_s, clock)
