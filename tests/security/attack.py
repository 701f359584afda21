"""An attacker's tools against arrowbeat's ports, built from plain sockets and the engine's framing.

``RawPeer`` speaks frames by hand (the real handshake when an attack needs to be authenticated),
``drip`` sends a frame one byte at a time, ``Siege`` holds N silent and M dripping connections
open on a port, reopening each one the server closes, and ``Relay`` is a man in the middle that
relays a victim's handshake and then injects frames of its own. Every loop here is bounded in
count and in time.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arrow_shuffle.auth import Session, client_handshake
from arrow_shuffle.control_schema import Float, Int, List, Null, Operation, Record, Service, Str
from arrow_shuffle.control_server import Handler
from arrow_shuffle.errors import ShuffleError
from arrow_shuffle.frames import HEADER, MAGIC, FrameHeader, Kind
from arrow_shuffle.transport import TcpConnection
from harness.procs import wait_until

SECRET = "security-test-secret-0123456789abcdef"
APP = "app-sec"

ECHO = Service(
    "test-echo",
    (
        Operation("echo", Record({"text": Str(100), "times": Int(1, 3), "tags": List(Str(8), 4)}), Str(300)),
        Operation("sleep", Record({"s": Float(0.0, 30.0)}), Null()),
    ),
)
"""A small service of our own for the control protocol's tests."""


def handlers() -> dict[str, Handler]:
    def echo(args: dict[str, object]) -> str:
        return str(args["text"]) * int(str(args["times"]))

    def sleep(args: dict[str, object]) -> None:
        time.sleep(float(str(args["s"])))

    return {"echo": echo, "sleep": sleep}


class Pickled:
    """Unpickling this creates ``marker``: what an attacker's payload would do (run code)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(Pickled(marker))


class RawPeer:
    """One connection whose frames the test writes itself."""

    def __init__(self, address: tuple[str, int], read_timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        host, port = self.sock.getsockname()[:2]
        self.name = f"{host}:{port}"
        """How the server names us in its errors."""
        self.conn = TcpConnection(self.sock, read_timeout_s)
        self.session: Session | None = None

    def authenticate(self, claim: str, secret: str = SECRET) -> Session:
        self.session = client_handshake(self.conn, secret.encode(), claim)
        return self.session

    def send_sealed(self, kind: Kind, body: bytes, seq: int = 0, value: int = 0) -> None:
        assert self.session is not None
        self.conn.send(kind, self.session.seal(kind, seq, value, body), seq=seq, value=value)

    def header_only(self, kind: Kind, length: int, seq: int = 0, value: int = 0) -> None:
        """A header announcing ``length`` payload bytes that never follow."""
        self.sock.sendall(HEADER.pack(MAGIC, kind, 0, length, seq, value))

    def frame(self) -> tuple[FrameHeader, bytes]:
        header = self.conn.recv_header()
        assert header is not None
        payload = bytearray(header.length)
        self.conn.recv_into(memoryview(payload))
        return header, bytes(payload)

    def answer(self) -> tuple[FrameHeader, bytes]:
        """The first ERROR or CONTROL_RESPONSE frame (skipping HELLO and keepalives)."""
        for _ in range(100):
            header, payload = self.frame()
            if header.kind in (Kind.ERROR, Kind.CONTROL_RESPONSE):
                return header, payload
        raise AssertionError("no answer in 100 frames")

    def closed_by_server(self) -> bool:
        """Reads until the server closes the connection (True) or a read times out (False)."""
        try:
            for _ in range(1000):
                self.frame()
        except ShuffleError as exc:
            return "EOF" in str(exc) or "receive failed" in str(exc)
        return False

    def close(self) -> None:
        self.conn.close()


def auth_frame_bytes(claim: str = APP) -> bytes:
    """An AUTH frame's bytes (a wrong proof: what matters is how slowly they arrive)."""
    body = os.urandom(64) + claim.encode()
    return HEADER.pack(MAGIC, Kind.AUTH, 0, len(body), 0, 0) + body


def drip(address: tuple[str, int], interval_s: float = 0.5, max_bytes: int = 60) -> tuple[int, float]:
    """Send an AUTH frame one byte every ``interval_s``; returns ``(bytes sent, seconds)`` when
    the server closed the connection, or raises ``AssertionError`` if it never did."""
    data = auth_frame_bytes()[:max_bytes]
    started = time.monotonic()
    with socket.create_connection(address, timeout=5) as sock:
        sock.settimeout(interval_s)
        for sent in range(len(data)):
            try:
                sock.sendall(data[sent : sent + 1])
                while True:  # drain what the server says (HELLO, then its error) until quiet
                    if not sock.recv(4096):
                        return sent + 1, time.monotonic() - started
            except TimeoutError:
                continue
            except OSError:
                return sent + 1, time.monotonic() - started
    raise AssertionError(f"the server still held a connection dripping for {time.monotonic() - started:.1f}s")


@dataclass
class SiegeStats:
    opened: int = 0
    closed_by_server: int = 0
    refused_connect: int = 0
    max_open: int = 0
    bytes_dripped: int = 0


@dataclass
class _Slot:
    dripping: bool
    sock: socket.socket | None = None
    sent: int = 0


class Siege:
    """Holds ``silent`` connections that send nothing and ``dripping`` ones that send one byte of
    an AUTH frame every ``interval_s``, on one port, from one thread; a connection the server
    closes is reopened (so the pressure stays on), at most ``max_reopen`` times per slot and for
    at most ``max_s`` seconds."""

    def __init__(
        self,
        address: tuple[str, int],
        silent: int = 20,
        dripping: int = 20,
        interval_s: float = 0.5,
        max_s: float = 300.0,
        max_reopen: int = 400,
    ) -> None:
        self.address = address
        self.interval_s = interval_s
        self.max_s = max_s
        self.max_reopen = max_reopen
        self.stats = SiegeStats()
        self._slots = [_Slot(False) for _ in range(silent)] + [_Slot(True) for _ in range(dripping)]
        self._data = auth_frame_bytes()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="siege", daemon=True)

    def __enter__(self) -> Siege:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def open_now(self) -> int:
        with self._lock:
            return sum(1 for s in self._slots if s.sock is not None)

    def wait_full(self, timeout_s: float = 30.0) -> bool:
        return wait_until(lambda: self.open_now() == len(self._slots), timeout_s, 0.02)

    def stop(self) -> SiegeStats:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.stats

    def _open(self, slot: _Slot, selector: selectors.BaseSelector, reopened: dict[int, int]) -> None:
        if reopened[id(slot)] >= self.max_reopen:
            return
        reopened[id(slot)] += 1
        try:
            sock = socket.create_connection(self.address, timeout=2)
        except OSError:
            self.stats.refused_connect += 1
            return
        sock.setblocking(False)
        with self._lock:
            slot.sock, slot.sent = sock, 0
        selector.register(sock, selectors.EVENT_READ, slot)
        self.stats.opened += 1

    def _drop(self, slot: _Slot, selector: selectors.BaseSelector) -> None:
        assert slot.sock is not None
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(slot.sock)
        slot.sock.close()
        with self._lock:
            slot.sock = None

    def _run(self) -> None:
        started = time.monotonic()
        reopened = {id(s): 0 for s in self._slots}
        selector = selectors.DefaultSelector()
        next_drip = time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() - started < self.max_s:
                for slot in self._slots:
                    if slot.sock is None:
                        self._open(slot, selector, reopened)
                self.stats.max_open = max(self.stats.max_open, self.open_now())
                if time.monotonic() >= next_drip:
                    next_drip += self.interval_s
                    for slot in self._slots:
                        if slot.dripping and slot.sock is not None and slot.sent < len(self._data):
                            try:
                                slot.sock.send(self._data[slot.sent : slot.sent + 1])
                                slot.sent += 1
                                self.stats.bytes_dripped += 1
                            except OSError:
                                self.stats.closed_by_server += 1
                                self._drop(slot, selector)
                for key, _ in selector.select(timeout=0.05):
                    slot = key.data
                    try:
                        gone = not slot.sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        gone = True
                    if gone:
                        self.stats.closed_by_server += 1
                        self._drop(slot, selector)
        finally:
            for slot in self._slots:
                if slot.sock is not None:
                    self._drop(slot, selector)
            selector.close()


@dataclass
class Relay:
    """A man in the middle between a victim and ``upstream``: relays the handshake (HELLO, AUTH,
    AUTH_OK) and then the victim's first ``relay_after`` frames with their answers, then calls
    ``inject`` with its upstream connection and every frame it saw from the victim."""

    upstream: tuple[str, int]
    inject: Callable[[TcpConnection, list[tuple[FrameHeader, bytes]]], object]
    relay_after: int = 0
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(30)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        threading.Thread(target=self._run, name="mitm", daemon=True).start()

    @staticmethod
    def _pass(src: TcpConnection, dst: TcpConnection) -> tuple[FrameHeader, bytes]:
        header = src.recv_header()
        assert header is not None
        payload = bytearray(header.length)
        src.recv_into(memoryview(payload))
        dst.send(header.kind, bytes(payload), seq=header.seq, value=header.value)
        return header, bytes(payload)

    def _run(self) -> None:
        victim: TcpConnection | None = None
        up: TcpConnection | None = None
        try:
            sock, _ = self._server.accept()
            victim = TcpConnection(sock, 10.0)
            up = TcpConnection(socket.create_connection(self.upstream, timeout=5), 10.0)
            seen = []
            self._pass(up, victim)  # HELLO
            seen.append(self._pass(victim, up))  # AUTH
            self._pass(up, victim)  # AUTH_OK
            for _ in range(self.relay_after):
                seen.append(self._pass(victim, up))
                for _ in range(1000):  # keepalives, then the answer
                    if self._pass(up, victim)[0].kind is not Kind.KEEPALIVE:
                        break
            self.result = self.inject(up, seen)
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()
            for conn in (victim, up):
                if conn is not None:
                    conn.close()
            self._server.close()

    def wait(self, timeout_s: float = 30.0) -> Any:
        assert self.done.wait(timeout_s), "the relay did not finish"
        if self.error is not None:
            raise self.error
        return self.result
