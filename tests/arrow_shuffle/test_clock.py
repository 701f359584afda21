"""The engine's time decisions on a ``ManualClock``: keepalives, the peer timeout, time blocked on
credit (the buffer-request deadline and the flush timeout: ``test_buffer_pool``, ``test_producer``).
Each test jumps the clock and then waits for the outcome on
a condition with a generous deadline: nothing is decided by how long the test happens to take.
"""

from __future__ import annotations

import ast
import socket
import threading
from pathlib import Path
from typing import cast

import pytest

from arrow_shuffle import (
    InputGate,
    NetworkBufferPool,
    PartitionId,
    PartitionServer,
    PeerLostError,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
)
from arrow_shuffle.frames import FrameHeader, Kind
from arrow_shuffle.remote_channel import RemoteInputChannel
from arrow_shuffle.transport import Connection, Listener, TcpConnection, TcpTransport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock, ManualClock
from harness.procs import wait_until

from .conftest import APP, SCHEMA, SECRET, make_batch
from .fake_peer import FakeServer

DEADLINE_S = 30.0
"""How long a test waits for what a jump of the clock must cause: generous, it is never the figure."""


def _ticks_pass(conn: TcpConnection, ticks: int = 2) -> None:
    """Wait until the receiving thread has woken ``ticks`` more times and read the clock."""
    seen = conn.silent_ticks
    assert wait_until(lambda: conn.silent_ticks >= seen + ticks, DEADLINE_S), "the receiver never ticked"


def test_silence_is_measured_on_the_clock_and_any_frame_resets_it() -> None:
    clock = ManualClock()
    mine, theirs = socket.socketpair()
    conn, peer = TcpConnection(mine, 2.0, clock), TcpConnection(theirs, 2.0)
    got: list[FrameHeader] = []
    failed: list[BaseException] = []

    def receive() -> None:
        try:
            while True:
                header = conn.recv_header()
                assert header is not None
                got.append(header)
        except BaseException as exc:
            failed.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    try:
        clock.jump(1.75)  # silent, but not for long enough
        _ticks_pass(conn)
        assert not failed and receiver.is_alive()
        peer.send(Kind.KEEPALIVE)  # heard: the silence starts again
        assert wait_until(lambda: len(got) == 1, DEADLINE_S)
        assert conn.heard_at == 1.75
        clock.jump(1.75)  # 3.5 s since the start, 1.75 s since the keepalive
        _ticks_pass(conn)
        assert not failed and receiver.is_alive()
        clock.jump(0.25)  # 2.0 s of silence
        receiver.join(DEADLINE_S)
        assert not receiver.is_alive()
        [error] = failed
        assert isinstance(error, PeerLostError) and "no data for 2.0s" in str(error)
        assert isinstance(error.__cause__, TimeoutError | BlockingIOError)  # mapped from the socket's
    finally:
        conn.close()
        peer.close()
        receiver.join(DEADLINE_S)


def test_hung_producer_is_lost_after_peer_timeout_on_the_gate_clock(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """The unit-level counterpart of the SIGSTOPped producer: the socket stays open, the producer
    authenticates and then sends nothing, not even keepalives. A peer timeout of a minute, far
    beyond the test's deadline: only the clock's jump can make the consumer give up."""
    clock = ManualClock()
    cfg = config.replace(peer_timeout_s=60.0)
    fake = FakeServer(SECRET.encode(), lambda conn, credit: None)
    partition = PartitionId(APP, 50, 0)
    gate = InputGate([RemoteChannelSpec(fake.address, partition, 0)], SCHEMA, pool, cfg, SECRET, clock=clock)
    try:
        conn = _connected(gate)
        channel = gate.channels[0]
        clock.jump(59.75)
        _ticks_pass(conn)
        assert not channel.terminated.is_set()  # silent, but not yet for peer_timeout_s
        clock.jump(0.25)
        assert channel.terminated.wait(DEADLINE_S)
        with pytest.raises(PeerLostError, match=r"no data for 60\.0s") as info:
            list(gate)
        assert f"{partition}#0" in str(info.value)  # names the partition
        assert f"{fake.address[0]}:{fake.address[1]}" in str(info.value)  # and the peer
    finally:
        gate.close()
        fake.close()
    assert pool.num_available == pool.num_segments


def _connected(gate: InputGate) -> TcpConnection:
    """Start ``gate`` and wait for its one channel's connection (handshake and request done)."""
    gate.start()
    channel = gate.channels[0]
    assert isinstance(channel, RemoteInputChannel)
    assert wait_until(lambda: channel._conn is not None, DEADLINE_S), "never connected"
    conn = channel._conn
    assert isinstance(conn, TcpConnection)
    return conn


def test_keepalives_keep_an_idle_stream_alive_far_past_peer_timeout(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """Producer and consumer share one clock. Each jump is shorter than the peer timeout but
    makes a keepalive due, and the next jump waits until the consumer heard it; after five of
    them the clock is far past the timeout, and the stream, idle all along, is alive and delivers
    once the producer writes."""
    clock = ManualClock()
    cfg = config.replace(keepalive_interval_s=0.1, peer_timeout_s=1.0)
    server = PartitionServer(SECRET, APP, config=cfg, clock=clock)
    part = ResultPartition(PartitionId(APP, 51, 0), 1, SCHEMA, pool, config=cfg)
    server.register(part)
    spec = RemoteChannelSpec(server.address, part.partition_id, 0)
    gate = InputGate([spec], SCHEMA, pool, cfg, SECRET, clock=clock)
    try:
        gate.start()
        assert wait_until(lambda: server.senders(), DEADLINE_S), "the stream never opened"
        [sender] = server.senders()
        channel = gate.channels[0]
        assert isinstance(channel, RemoteInputChannel)
        assert wait_until(lambda: channel._conn is not None, DEADLINE_S), "never connected"
        conn = channel._conn
        assert isinstance(conn, TcpConnection)
        for _ in range(5):
            clock.jump(0.5)
            assert wait_until(lambda: conn.heard_at == clock.monotonic(), DEADLINE_S), "no keepalive heard"
        assert clock.monotonic() == 2.5 > 2 * cfg.peer_timeout_s
        assert sender.keepalives_sent == 5  # one per jump: none while the clock stood still
        assert not channel.terminated.is_set()
        writer = RecordWriter(part)
        writer.write(make_batch(0, 100))
        writer.finish()
        assert gate.read_all().column("seq").to_pylist() == list(range(100))
    finally:
        gate.close()
        server.close()
    assert pool.num_available == pool.num_segments


class _HeldKeepalive:
    """A server connection whose first KEEPALIVE send returns only once ``release`` is set: the
    sender thread descheduled right after its keepalive went out, as a loaded machine does."""

    def __init__(self, inner: Connection, release: threading.Event) -> None:
        self._inner = inner
        self._release = release
        self._held = False

    def send(
        self,
        kind: Kind,
        payload: bytes | memoryview = b"",
        seq: int = 0,
        value: int = 0,
        *,
        checksum: bool = False,
    ) -> None:
        self._inner.send(kind, payload, seq, value, checksum=checksum)
        if kind is Kind.KEEPALIVE and not self._held:
            self._held = True
            assert self._release.wait(10)

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _HeldListener:
    def __init__(self, inner: Listener, release: threading.Event) -> None:
        self._inner = inner
        self._release = release
        self.address = inner.address

    def accept(self) -> Connection | None:
        conn = self._inner.accept()
        return None if conn is None else cast(Connection, _HeldKeepalive(conn, self._release))

    def close(self) -> None:
        self._inner.close()


class _HeldKeepalives(TcpTransport):
    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock = SYSTEM_CLOCK) -> Listener:
        return _HeldListener(super().listen(host, port, read_timeout_s, clock), self.release)


def test_a_keepalive_whose_send_returns_after_a_clock_jump_leaves_the_next_one_due(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """The reader hears a keepalive and the clock jumps before the sender's send returns (CI
    caught it once: the keepalive test above waited 30 s for a keepalive that never came). The
    next keepalive is due from when the last fell due, not from a clock read after the send."""
    clock = ManualClock()
    cfg = config.replace(keepalive_interval_s=0.1, peer_timeout_s=1.0)
    transport = _HeldKeepalives()
    server = PartitionServer(SECRET, APP, config=cfg, clock=clock, transport=transport)
    part = ResultPartition(PartitionId(APP, 53, 0), 1, SCHEMA, pool, config=cfg)
    server.register(part)
    gate = InputGate(
        [RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, cfg, SECRET, clock=clock
    )
    try:
        conn = _connected(gate)
        # The stream accepted (its keepalives count from then) before the clock moves: the
        # consumer's connection is up once its request is sent, which can be before the server read
        # it (CI caught that: a jump made first left the first keepalive due only after it).
        assert wait_until(lambda: server.senders(), DEADLINE_S), "the stream never opened"
        clock.jump(0.5)
        assert wait_until(lambda: conn.heard_at == 0.5, DEADLINE_S), "no keepalive heard"
        clock.jump(0.5)  # the sender is still inside the send of the first keepalive
        transport.release.set()
        assert wait_until(lambda: conn.heard_at == 1.0, DEADLINE_S), "the next keepalive never came"
    finally:
        transport.release.set()
        gate.close()
        server.close()
    assert pool.num_available == pool.num_segments


def test_time_blocked_on_credit_is_read_from_the_server_clock(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """The consumer starts its stream but reads nothing, so the sender runs out of credit with
    data queued. The five seconds the server's clock jumps meanwhile are exactly the time it
    records as blocked on credit once the consumer reads and credit flows again."""
    clock = ManualClock()
    server = PartitionServer(SECRET, APP, config=config, clock=clock)
    part = ResultPartition(PartitionId(APP, 52, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    rows = 20_000  # ~ 0.6 MB through 16 KiB buffers: far more than the consumer's credit
    writer = RecordWriter(part)

    def produce() -> None:
        for start in range(0, rows, 500):
            writer.write(make_batch(start, 500))
        writer.finish()

    producer = threading.Thread(target=produce)
    producer.start()
    gate = InputGate([RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, config, SECRET)
    try:
        gate.start()  # receives up to its credit, consumes nothing
        assert wait_until(lambda: server.senders(), DEADLINE_S), "the stream never opened"
        [sender] = server.senders()
        assert wait_until(lambda: sender.blocked_on_credit_since is not None, DEADLINE_S), "never blocked"
        assert part.stats().blocked_on_credit_s == 0.0
        clock.jump(5.0)
        assert gate.read_all().column("seq").to_pylist() == list(range(rows))
    finally:
        gate.close()
        producer.join(DEADLINE_S)
    assert sender.blocked_on_credit_since is None
    assert part.stats().blocked_on_credit_s == pytest.approx(5.0)  # the clock moved only once
    server.close()
    assert pool.num_available == pool.num_segments


ENGINE = Path(__file__).resolve().parents[2] / "arrow_shuffle"


@pytest.mark.parametrize("path", sorted(ENGINE.glob("*.py")), ids=lambda p: p.name)
def test_engine_reads_time_only_from_its_clock(path: Path) -> None:
    """No engine module calls ``time.monotonic``/``time.time``/``time.perf_counter`` itself."""
    tree = ast.parse(path.read_text(), str(path))
    calls = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "time"
        and node.attr in ("monotonic", "time", "perf_counter", "monotonic_ns", "time_ns")
    ]
    imported = [
        f"{path.name}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
    ]
    assert not calls and not imported, calls + imported
