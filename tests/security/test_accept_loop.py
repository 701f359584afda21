"""The shared accept loop's limits and the clients' deadlines, on real sockets.

Server side: connections waiting to authenticate and connections served are capped (BUSY beyond,
counted, logged once); a thread that cannot start and an ``accept`` out of descriptors (a real
``EMFILE``, in a process of its own) cost one connection, never the loop. Client side: a silent,
dripping, stopped (SIGSTOP) or mute-mid-call server is a typed ``PeerLostError`` within the
connect deadline or the peer timeout, never a hang; a slow operation stays alive on keepalives.
And every message that is not exactly its operation's schema is refused naming op and peer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from arrow_shuffle import InputGate, NetworkBufferPool, PartitionId, RemoteChannelSpec, ShuffleConfig
from arrow_shuffle import acceptor as acceptor_module
from arrow_shuffle.acceptor import RefusalLog
from arrow_shuffle.auth import server_handshake
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.control_server import ControlServer
from arrow_shuffle.errors import (
    ControlMessageError,
    DeadlineExceededError,
    PeerLostError,
    ShuffleError,
)
from arrow_shuffle.frames import HEADER, MAGIC, ErrorCode, Kind
from arrow_shuffle.transport import TcpConnection
from arrowbeat_base.clock import ManualClock
from harness.procs import freeze, wait_until
from spark_plugin.shuffle.worker.agent_client import MapOutputClient
from tests.security.agent_proc import SCHEMA
from tests.security.attack import ECHO, SECRET, RawPeer, handlers
from tests.security.conftest import AgentProcess

FAST = ShuffleConfig(connect_timeout_s=1.0, peer_timeout_s=1.0, keepalive_interval_s=0.2)


def server(config: ShuffleConfig = FAST, max_connections: int = 256) -> ControlServer:
    return ControlServer(SECRET, ECHO, handlers(), config=config, max_connections=max_connections)


def client(address: tuple[str, int], config: ShuffleConfig = FAST) -> ControlClient:
    return ControlClient(
        address,
        SECRET,
        ECHO,
        connect_timeout_s=config.connect_timeout_s,
        peer_timeout_s=config.peer_timeout_s,
    )


def served(address: tuple[str, int]) -> bool:
    with client(address) as c:
        return bool(c.call("echo", text="hi", times=2, tags=[]) == "hihi")


def outcome(fn: Callable[[], object], timeout_s: float = 30.0) -> BaseException | object:
    """What ``fn`` raised or returned, run on a thread that must finish within ``timeout_s``."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["value"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still running after {timeout_s}s: a hang"
    return box["value"]


def lines(caplog: pytest.LogCaptureFixture, cause: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"refused ({cause})" in r.getMessage()]


# -- caps --------------------------------------------------------------------------------------------
def test_connections_beyond_the_pending_cap_are_refused_busy(caplog: pytest.LogCaptureFixture) -> None:
    srv = server(FAST.replace(max_pending_connections=4, connect_timeout_s=60.0))
    silent = [socket.create_connection(srv.address) for _ in range(4)]
    try:
        assert wait_until(lambda: srv.acceptor.load() == (4, 0), 30)
        with caplog.at_level(logging.WARNING):
            extra = RawPeer(srv.address)
            header, payload = extra.answer()
            assert (header.kind, header.value) == (Kind.ERROR, ErrorCode.BUSY)
            assert b"4 connections are already authenticating" in payload
            extra.close()
            error = outcome(lambda: client(srv.address))
            assert isinstance(error, PeerLostError) and "connection limit" in str(error)
        assert srv.refusals() == {"pending-limit": 2}
        assert len(lines(caplog, "pending-limit")) == 1  # two refusals, one line
    finally:
        for sock in silent:
            sock.close()
    assert wait_until(lambda: srv.acceptor.load() == (0, 0), 30)
    assert served(srv.address)
    srv.close()


def test_connections_beyond_the_served_cap_are_refused_busy() -> None:
    srv = server(max_connections=1)
    try:
        with client(srv.address) as first:
            assert first.call("echo", text="a", times=1, tags=[]) == "a"
            second = client(srv.address)  # authenticated, then told the server is full
            error = outcome(lambda: second.call("echo", text="b", times=1, tags=[]))
            assert isinstance(error, PeerLostError) and "1 connections are served" in str(error)
            assert first.call("echo", text="c", times=1, tags=[]) == "c"  # the first one goes on
        assert srv.refusals() == {"served-limit": 1}
        assert wait_until(lambda: srv.acceptor.load() == (0, 0), 30)
        assert served(srv.address)
    finally:
        srv.close()


def test_a_thread_that_cannot_start_costs_only_its_connection(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failures = {"left": 3}
    real_start = acceptor_module._start_thread

    def exhausted(thread: threading.Thread) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(acceptor_module, "_start_thread", exhausted)
    srv = server()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                peer = RawPeer(srv.address)
                assert peer.closed_by_server()
                peer.close()
        assert srv.refusals() == {"thread-start": 3}
        assert len(lines(caplog, "thread-start")) == 1
        assert served(srv.address)  # the accept loop lives on
    finally:
        srv.close()


def test_accept_out_of_file_descriptors_backs_off_and_recovers(tmp_path: Path) -> None:
    """A real EMFILE: the server process may open only a few more descriptors; 12 silent
    connections exhaust them, ``accept`` fails until the handshake deadline frees some, and
    then every connection is handled and a real client is served."""
    log = tmp_path / "server.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.security.emfile_proc", "3"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(SECRET + "\n")
            proc.stdin.flush()
            address = tuple(json.loads(proc.stdout.readline()))

            def refusals() -> dict[str, int]:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("refusals\n")
                proc.stdin.flush()
                counts: dict[str, int] = json.loads(proc.stdout.readline())
                return counts

            silent = [socket.create_connection(address) for _ in range(12)]
            try:
                assert wait_until(lambda: refusals().get("accept-error", 0) > 0, 30)
                # The deadline frees descriptors; every silent connection is handled in turn.
                assert wait_until(lambda: refusals().get("handshake-deadline", 0) >= 12, 60)
            finally:
                for sock in silent:
                    sock.close()
            assert served(address)
            errors = [line for line in log.read_text().splitlines() if "refused (accept-error)" in line]
            assert errors and "Too many open files" in errors[0]
            assert len(errors) == 1  # one line, however often accept failed
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def test_the_refusal_log_says_each_cause_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), "a server", clock, 60.0)
    with caplog.at_level(logging.INFO, logger="test.refusals"):
        for i in range(5):
            refusals.refuse("protocol", f"peer {i}: garbage")
        refusals.refuse("authentication", "peer 9: wrong secret")
        clock.jump(59.0)
        refusals.refuse("protocol", "peer 5: garbage")
        clock.jump(1.0)
        refusals.refuse("protocol", "peer 6: garbage")
    assert [r.getMessage() for r in caplog.records] == [
        "a server refused (protocol): peer 0: garbage",
        "a server refused (authentication): peer 9: wrong secret",
        "a server refused (protocol): peer 6: garbage (and 5 more of this cause since the last report)",
    ]
    assert refusals.counts() == {"protocol": 7, "authentication": 1}


def test_the_refusal_log_keeps_its_line_and_level_with_the_shared_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The accept loops' line, on the shared rate: the level and traceback flag go through."""
    clock = ManualClock()
    refusals = RefusalLog(logging.getLogger("test.refusals"), "a server", clock, 60.0)
    with caplog.at_level(logging.INFO, logger="test.refusals"):
        refusals.refuse("peer-lost", "peer 1 hung up", logging.INFO)
        refusals.refuse("peer-lost", "peer 2 hung up", logging.INFO)
        clock.jump(60.0)
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            refusals.refuse("internal", "a handler failed", logging.ERROR, True)
    assert [(r.levelno, r.getMessage(), bool(r.exc_info)) for r in caplog.records] == [
        (logging.INFO, "a server refused (peer-lost): peer 1 hung up", False),
        (logging.ERROR, "a server refused (internal): a handler failed", True),
    ]
    assert refusals.counts() == {"peer-lost": 2, "internal": 1}


# -- client deadlines --------------------------------------------------------------------------------
class FakeServer:
    """Accepts one connection and runs ``script`` on the raw socket (bounded by ``stop``)."""

    def __init__(self, script: Callable[[socket.socket, threading.Event], None]) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(30)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self.stop = threading.Event()
        self._script = script
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError, ShuffleError):
            conn, _ = self._sock.accept()
            with conn:
                self._script(conn, self.stop)

    def close(self) -> None:
        self.stop.set()
        self._thread.join(30)
        self._sock.close()


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait(30)


def _dripping_hello(conn: socket.socket, stop: threading.Event) -> None:
    hello = HEADER.pack(MAGIC, Kind.HELLO, 0, 32, 0, 0) + bytes(32)
    for i in range(len(hello)):
        if stop.wait(0.2):
            return
        conn.sendall(hello[i : i + 1])


def _mute_after_request(conn: socket.socket, stop: threading.Event) -> None:
    tcp = TcpConnection(conn, 30.0)
    server_handshake(tcp, SECRET.encode())
    tcp.recv_header()
    stop.wait(30)


def _keepalives_forever(conn: socket.socket, stop: threading.Event) -> None:
    tcp = TcpConnection(conn, 30.0)
    server_handshake(tcp, SECRET.encode())
    tcp.recv_header()
    while not stop.wait(0.1):
        tcp.send(Kind.KEEPALIVE)


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[socket.socket, threading.Event], None]], FakeServer]]:
    made: list[FakeServer] = []

    def make(script: Callable[[socket.socket, threading.Event], None]) -> FakeServer:
        made.append(FakeServer(script))
        return made[-1]

    yield make
    for f in made:
        f.close()


@pytest.mark.parametrize("script", [_silent, _dripping_hello], ids=["silent", "dripping-hello"])
def test_a_server_that_never_completes_the_handshake_is_a_deadline(
    fake: Callable[..., FakeServer], script: Callable[..., None]
) -> None:
    srv = fake(script)
    started = time.monotonic()
    error = outcome(lambda: client(srv.address))
    assert isinstance(error, DeadlineExceededError), repr(error)
    assert "connect and handshake with test-echo" in str(error)
    assert time.monotonic() - started < 10 * FAST.connect_timeout_s  # not the 30 s the server holds


def test_a_data_stream_from_a_silent_server_is_a_deadline(fake: Callable[..., FakeServer]) -> None:
    srv = fake(_silent)
    config = ShuffleConfig(buffer_size=16 * 1024, network_memory_bytes=1 << 20, connect_timeout_s=1.0)
    pool = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    spec = RemoteChannelSpec(srv.address, PartitionId("app", 1, 0), 0)
    with InputGate([spec], SCHEMA, pool, config, SECRET) as gate:
        error = outcome(lambda: list(gate))
    assert isinstance(error, DeadlineExceededError), repr(error)


def test_a_server_mute_mid_call_is_lost_after_the_peer_timeout(fake: Callable[..., FakeServer]) -> None:
    srv = fake(_mute_after_request)
    c = client(srv.address)
    error = outcome(lambda: c.call("echo", timeout_s=60.0, text="x", times=1, tags=[]))
    assert isinstance(error, PeerLostError) and not isinstance(error, DeadlineExceededError), repr(error)
    assert "no data for 1.0s" in str(error)
    later = outcome(lambda: c.call("echo", text="x", times=1, tags=[]))
    assert isinstance(later, PeerLostError) and "failed earlier" in str(later)


def test_keepalives_cannot_stretch_a_call_past_its_deadline(fake: Callable[..., FakeServer]) -> None:
    srv = fake(_keepalives_forever)
    c = client(srv.address)
    error = outcome(lambda: c.call("echo", timeout_s=1.5, text="x", times=1, tags=[]))
    assert isinstance(error, DeadlineExceededError) and "'echo' call to test-echo" in str(error)


def test_a_slow_operation_lives_on_keepalives() -> None:
    """2.5 s of work with a 1 s peer timeout: the server's keepalives say it is alive."""
    srv = server()
    try:
        with client(srv.address) as c:
            assert c.call("sleep", s=2.5) is None
            assert c.call("echo", text="ok", times=1, tags=[]) == "ok"
    finally:
        srv.close()


def test_a_deadline_on_a_manual_clock_is_not_extended_by_a_dripping_peer() -> None:
    clock = ManualClock()
    ours, theirs = socket.socketpair()
    conn = TcpConnection(ours, 3600.0, clock)
    conn.set_deadline(clock.monotonic() + 5.0, "handshake")
    with theirs:
        theirs.sendall(HEADER.pack(MAGIC, Kind.AUTH, 0, 10, 0, 0)[:5])
        clock.jump(4.0)
        theirs.sendall(b"\x00")  # a byte arrives before the deadline: nothing is extended
        clock.jump(1.5)
        theirs.sendall(b"\x00")
        with pytest.raises(DeadlineExceededError, match="handshake not completed by its deadline"):
            conn.recv_header()
    conn.close()


# -- a stopped agent ---------------------------------------------------------------------------------
@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    proc = AgentProcess(tmp_path / "root", tmp_path / "agent.log")
    yield proc
    proc.stop()


def test_a_sigstopped_agent_is_peer_lost_within_the_peer_timeout(agent: AgentProcess) -> None:
    config = ShuffleConfig(connect_timeout_s=1.0, peer_timeout_s=1.0, keepalive_interval_s=0.2)
    connected = MapOutputClient(agent.address["control"], SECRET, "executor 1", config=config)
    assert "shuffle_streams_open" in connected.metrics()
    freeze(agent.proc.pid)
    try:
        error = outcome(connected.metrics)
        assert isinstance(error, PeerLostError) and "no data for 1.0s" in str(error), repr(error)
        fresh = outcome(
            lambda: MapOutputClient(agent.address["control"], SECRET, "executor 1", config=config)
        )
        assert isinstance(fresh, DeadlineExceededError), repr(fresh)
        assert "the shuffle agent of executor 1" in str(fresh)
    finally:
        agent.proc.send_signal(signal.SIGCONT)
        connected.close()
    with MapOutputClient(agent.address["control"], SECRET, "executor 1", config=config) as again:
        assert "shuffle_streams_open" in again.metrics()


# -- schemas -----------------------------------------------------------------------------------------
BAD_MESSAGES = {
    "unknown-op": ({"op": "exec", "args": {}}, "unknown operation 'exec'"),
    "unknown-field": (
        {"op": "echo", "args": {"text": "a", "times": 1, "tags": [], "shell": "rm"}},
        "unknown field(s) ['shell']",
    ),
    "missing-field": ({"op": "echo", "args": {"text": "a", "tags": []}}, "missing field(s) ['times']"),
    "wrong-type": (
        {"op": "echo", "args": {"text": 5, "times": 1, "tags": []}},
        "field text: expected printable text",
    ),
    "newline-in-text": (
        {"op": "echo", "args": {"text": "a\nINJECTED LOG LINE", "times": 1, "tags": []}},
        "field text: expected printable text",
    ),
    "bool-as-int": (
        {"op": "echo", "args": {"text": "a", "times": True, "tags": []}},
        "field times: expected",
    ),
    "out-of-bounds": ({"op": "echo", "args": {"text": "a", "times": 4, "tags": []}}, "in [1, 3], got 4"),
    "too-long": ({"op": "echo", "args": {"text": "a" * 101, "times": 1, "tags": []}}, "of 0..100 characters"),
    "too-many": ({"op": "echo", "args": {"text": "a", "times": 1, "tags": ["x"] * 5}}, "at most 4 items"),
    "extra-envelope": ({"op": "echo", "args": {}, "pickle": "gASV"}, "a control request is {'op', 'args'}"),
    "not-an-object": ([1, 2, 3], "a control request is {'op', 'args'}, got a JSON list"),
}
RAW_MESSAGES = {
    "nan": (b'{"op": "sleep", "args": {"s": NaN}}', "NaN is not JSON"),
    "duplicate-key": (b'{"op": "echo", "op": "sleep", "args": {}}', "duplicate key"),
    "deep-nesting": (b"[" * 30_000 + b"]" * 30_000, "RecursionError"),
    "not-utf8": (b'{"op": "\xff"}', "UnicodeDecodeError"),
}


@pytest.mark.parametrize("name", [*BAD_MESSAGES, *RAW_MESSAGES])
def test_a_message_outside_its_schema_is_refused_naming_op_and_peer(name: str) -> None:
    srv = server()
    try:
        body, expected = (
            (json.dumps(BAD_MESSAGES[name][0]).encode(), BAD_MESSAGES[name][1])
            if name in BAD_MESSAGES
            else RAW_MESSAGES[name]
        )
        peer = RawPeer(srv.address)
        peer.authenticate(ECHO.name)
        peer.send_sealed(Kind.CONTROL_REQUEST, body)
        header, payload = peer.answer()
        assert header.kind is Kind.CONTROL_RESPONSE and peer.session is not None
        error = json.loads(peer.session.unseal(header, payload, "server"))["error"]
        assert error["code"] == "protocol" and expected in error["message"], error
        assert peer.name in error["message"]
        if name not in RAW_MESSAGES and name not in ("unknown-op", "extra-envelope", "not-an-object"):
            assert "in request 'echo'" in error["message"]  # names the operation
        assert peer.closed_by_server()
        peer.close()
        assert srv.refusals() == {"protocol": 1}
        assert served(srv.address)
    finally:
        srv.close()


def test_the_client_refuses_to_send_what_the_schema_forbids() -> None:
    srv = server()
    try:
        with client(srv.address) as c:
            with pytest.raises(ControlMessageError, match=r"refusing to send 'echo'.*field times"):
                c.call("echo", text="a", times=9, tags=[])
            with pytest.raises(ControlMessageError, match="unknown operation 'exec'"):
                c.call("exec")
            assert c.call("echo", text="a", times=1, tags=["t"]) == "a"  # nothing was sent
        assert srv.refusals() == {}
    finally:
        srv.close()
