"""Remote channels over the real TCP transport, in one process: exchange, auth and faults."""

from __future__ import annotations

import socket
import threading
from typing import cast

import pyarrow as pa
import pytest

from arrow_shuffle import (
    ChannelClosedError,
    CorruptFrameError,
    CreditViolationError,
    InputGate,
    NetworkBufferPool,
    OversizedFrameError,
    PartitionId,
    PartitionNotFoundError,
    PartitionServer,
    PeerLostError,
    ProducerFailedError,
    RecordWriter,
    RemoteChannelSpec,
    RemoteFailureError,
    ResultPartition,
    SchemaMismatchError,
    SequenceGapError,
    ShuffleAuthenticationError,
    ShuffleConfig,
    ShuffleConfigError,
    ShuffleError,
)
from arrow_shuffle.codec import BufferBuilder
from arrow_shuffle.frames import FrameHeader, Kind
from arrow_shuffle.remote_channel import RemoteInputChannel
from arrow_shuffle.transport import Connection, Listener, TcpConnection, TcpTransport
from arrowbeat_base.clock import Clock
from harness.procs import wait_until

from .conftest import APP, SCHEMA, SECRET, make_batch
from .fake_peer import FakeServer


def produce(partition: ResultPartition, rows: int, batch_rows: int = 300) -> threading.Thread:
    writer = RecordWriter(partition, key_columns=["key"])

    def run() -> None:
        try:
            for start in range(0, rows, batch_rows):
                writer.write(make_batch(start, min(batch_rows, rows - start)))
            writer.finish()
        except ShuffleError:
            writer.abort()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_channels_from_several_partitions_deliver_every_row(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    parts = [ResultPartition(PartitionId(APP, 1, m), 2, SCHEMA, pool, config=config) for m in range(3)]
    for p in parts:
        server.register(p)
    producers = [produce(p, 5000) for p in parts]
    seen: list[int] = []
    for sub in range(2):
        specs = [RemoteChannelSpec(server.address, p.partition_id, sub) for p in parts]
        with InputGate(specs, SCHEMA, pool, config, secret=SECRET) as gate:
            table = gate.read_all()
            stats = gate.stats()
        assert stats.rows_received == table.num_rows
        assert stats.channels_finished == 3
        assert "gate.bytes_received" in stats.as_dict()
        seen += table.column("seq").to_pylist()
    for t in producers:
        t.join(10)
    assert sorted(seen) == sorted(list(range(5000)) * 3)
    # A sender marks itself completed on its own thread, after END went out: maybe after the
    # reader already has every row.
    assert wait_until(lambda: all(sender.completed for sender in server.senders()), 30)
    for sender in server.senders():
        assert sender.max_overdraft <= 0
    sent = sum(p.stats().bytes_sent for p in parts)
    assert sent > 0
    for p in parts:
        server.release(p.partition_id)
    assert pool.num_available == pool.num_segments


def _expect_failure(
    config: ShuffleConfig, pool: NetworkBufferPool, spec: RemoteChannelSpec, secret: str
) -> ShuffleError:
    with pytest.raises(ShuffleError) as info, InputGate([spec], SCHEMA, pool, config, secret=secret) as gate:
        gate.read_all()
    return info.value


def test_wrong_secret_fails_only_that_stream(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId(APP, 2, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    producer = produce(part, 2000)
    spec = RemoteChannelSpec(server.address, part.partition_id, 0)
    error = _expect_failure(config, pool, spec, "wrong-secret")
    assert isinstance(error, ShuffleAuthenticationError)
    assert str(part.partition_id) in str(error) and str(server.address[1]) in str(error)
    with InputGate([spec], SCHEMA, pool, config, secret=SECRET) as gate:  # the right secret still works
        assert gate.read_all().num_rows == 2000
    producer.join(10)
    server.release(part.partition_id)
    assert pool.num_available == pool.num_segments


def test_unknown_and_foreign_partitions_are_refused(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    missing = RemoteChannelSpec(server.address, PartitionId(APP, 9, 9), 0)
    error = _expect_failure(config, pool, missing, SECRET)
    assert isinstance(error, PartitionNotFoundError) and "app-1/s9/m9a0" in str(error)
    foreign = RemoteChannelSpec(server.address, PartitionId("other-app", 9, 9), 0)
    error = _expect_failure(config, pool, foreign, SECRET)
    assert isinstance(error, PartitionNotFoundError) and "other-app" in str(error)
    assert pool.num_available == pool.num_segments


def test_consumer_schema_mismatch_is_typed(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId(APP, 3, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    producer = produce(part, 500)
    other = pa.schema([("key", pa.int32())])
    spec = RemoteChannelSpec(server.address, part.partition_id, 0)
    with (
        pytest.raises(SchemaMismatchError, match="app-1/s3/m0a0"),
        InputGate([spec], other, pool, config, SECRET) as g,
    ):
        list(g)
    producer.join(60)  # the producer fails (its consumer is gone) instead of hanging
    assert not producer.is_alive()
    server.release(part.partition_id)
    # The server's sender hands its last buffer back when it sees the closed stream: soon, not at once.
    assert wait_until(lambda: pool.num_available == pool.num_segments, 30, 0.01), pool.num_available


def test_cancelling_the_gate_returns_buffers_and_unblocks_the_producer(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId(APP, 4, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    producer = produce(part, 200_000)
    gate = InputGate([RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, config, SECRET)
    it = iter(gate)
    next(it)
    gate.close()
    with pytest.raises(ChannelClosedError):
        next(it)
    producer.join(10)
    assert not producer.is_alive()
    server.release(part.partition_id)
    assert pool.num_available == pool.num_segments


def test_producer_abort_mid_stream_fails_every_reader_with_a_typed_error(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId(APP, 17, 0), 3, SCHEMA, pool, config=config)
    server.register(part)
    writer = RecordWriter(part, key_columns=["key"])
    writer.write(make_batch(0, 3000))
    writer.flush()  # every subpartition has data queued; the partition is not finished
    specs = [RemoteChannelSpec(server.address, part.partition_id, sub) for sub in (0, 1)]
    gate = InputGate(specs, SCHEMA, pool, config, SECRET)
    batches = iter(gate)
    next(batches)  # mid-stream
    writer.abort("map task 17 was cancelled")
    with pytest.raises(ProducerFailedError, match="map task 17 was cancelled") as info:
        for _ in batches:
            pass
    assert f"{part.partition_id}#" in str(info.value)
    assert gate.stats().channels_finished == 0  # nothing reported complete
    late = RemoteChannelSpec(server.address, part.partition_id, 2)  # a reader arriving after the abort
    error = _expect_failure(config, pool, late, SECRET)
    assert isinstance(error, ProducerFailedError) and f"{part.partition_id}#2" in str(error)
    assert wait_until(lambda: part.pool.in_use == 0, 30, 0.005), "the aborted partition's buffers returned"
    server.release(part.partition_id)
    assert pool.num_available == pool.num_segments


def test_slow_remote_consumer_makes_the_producer_wait_for_credit(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    """The consumer blocks on an event after its first batch. The receiver then ends up holding
    every buffer it announced credit for, with every floating buffer lent: the sender has no
    credit and data queued, and the writer blocks on its pool. Resuming the consumer lets credit,
    then data, flow again; the producer's wait for credit is in its statistics."""
    part = ResultPartition(PartitionId(APP, 16, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    rows = 50_000  # ~ 1.5 MB through 16 KiB buffers: many times what the pools hold
    producer = produce(part, rows)
    gate = InputGate([RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, config, SECRET)
    channel = gate.channels[0]
    assert isinstance(channel, RemoteInputChannel)
    first, resume = threading.Event(), threading.Event()
    seen: list[int] = []

    def consume() -> None:
        for batch in gate:
            seen.extend(batch.column("seq").to_pylist())
            if not first.is_set():
                first.set()
                assert resume.wait(30), "the test never resumed the consumer"

    consumer = threading.Thread(target=consume)
    consumer.start()
    try:
        assert first.wait(10)

        def starved() -> bool:
            stats = channel.stats()
            return (
                stats.buffers_received == stats.credits_announced  # all announced credit spent
                and gate.floating.in_use == config.floating_buffers_per_gate  # no credit left to gain
                and part.subpartitions[0].backlog > 0  # and data waiting for it
                and part.pool.exhausted.is_set()  # so the writer blocked on its pool
            )

        assert wait_until(starved, 10, 0.005), "the sender out of credit with data queued"
        assert producer.is_alive()
        assert part.pool.owned <= part.pool.max_segments  # memory stays within the partition's share
    finally:
        resume.set()
    consumer.join(30)
    assert not consumer.is_alive()
    assert seen == list(range(rows))
    producer.join(10)
    assert part.stats().blocked_on_credit_s > 0
    assert part.pool.peak_in_use <= part.pool.max_segments
    stats = channel.stats()
    assert stats.buffers_without_credit == 0 and stats.max_in_flight_over_credit == 0
    assert stats.max_in_flight == config.exclusive_buffers_per_channel + config.floating_buffers_per_gate
    server.release(part.partition_id)
    assert pool.num_available == pool.num_segments


def _payload(config: ShuffleConfig, pool: NetworkBufferPool) -> bytes:
    network = NetworkBufferPool(1, config.buffer_size)
    from arrow_shuffle.buffer_pool import LocalBufferPool

    local = LocalBufferPool(network, 1, 1, "fake")
    buffer = local.try_request()
    assert buffer is not None
    builder = BufferBuilder(buffer, SCHEMA)
    builder.append(make_batch(0, 10))
    done = builder.finish()
    data = bytes(done.segment.view[: done.size])
    done.recycle()
    return data


def _gap(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn.send(Kind.BUFFER, payload, seq=0, value=0, checksum=True)
    conn.send(Kind.BUFFER, payload, seq=2, value=0, checksum=True)


def _duplicate(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn.send(Kind.BUFFER, payload, seq=0, value=0, checksum=True)
    conn.send(Kind.BUFFER, payload, seq=0, value=0, checksum=True)


def _no_credit(conn: TcpConnection, credit: int, payload: bytes) -> None:
    # The consumer holds at most exclusive + floating buffers (10); never reading a credit,
    # the 11th buffer is one the receiver never announced.
    for seq in range(64):
        conn.send(Kind.BUFFER, payload, seq=seq, value=0, checksum=True)


def _oversized(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn.send(Kind.BUFFER, b"x" * (64 * 1024), seq=0, value=0, checksum=True)


def _corrupt_payload(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn.send(Kind.BUFFER, b"\xff" * 100, seq=0, value=0, checksum=True)


def _corrupt_large_payload(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn.send(
        Kind.BUFFER, b"\xff" * 12_000, seq=0, value=0, checksum=True
    )  # received into a block, not a segment


def _corrupt_header(conn: TcpConnection, credit: int, payload: bytes) -> None:
    conn._sock.sendall(b"\x00" * 20)


@pytest.mark.parametrize(
    ("script", "error", "match"),
    [
        (_gap, SequenceGapError, "gap"),
        (_duplicate, SequenceGapError, "duplicate"),
        (_no_credit, CreditViolationError, "without credit"),
        (_oversized, OversizedFrameError, "exceeds"),
        (_corrupt_payload, CorruptFrameError, "Arrow IPC"),
        (_corrupt_large_payload, CorruptFrameError, "Arrow IPC"),
        (_corrupt_header, CorruptFrameError, "magic"),
    ],
)
def test_protocol_violations_fail_the_stream_with_typed_errors(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer, script, error, match
) -> None:
    """Only the broken stream fails: a good stream from a real server, open at the same time
    in another gate on the same buffer pool, is read to the end afterwards."""
    good_part = ResultPartition(PartitionId(APP, 15, 0), 1, SCHEMA, pool, config=config)
    server.register(good_part)
    rows = 50_000  # ~ 1.5 MB: far more than the partition's and the gate's buffers hold
    producer = produce(good_part, rows)
    good = InputGate(
        [RemoteChannelSpec(server.address, good_part.partition_id, 0)], SCHEMA, pool, config, SECRET
    )
    good_batches = iter(good)
    seen = next(good_batches).column("seq").to_pylist()  # the good stream is now mid-flight

    payload = _payload(config, pool)
    fake = FakeServer(SECRET.encode(), lambda conn, credit: script(conn, credit, payload))
    bad_id = PartitionId(APP, 5, 0)
    spec = RemoteChannelSpec(fake.address, bad_id, 0)
    try:
        with (
            pytest.raises(error, match=match) as info,
            InputGate([spec], SCHEMA, pool, config, SECRET) as gate,
        ):
            gate.start()  # receive without consuming: no credit comes back while the fake sends
            channel = gate.channels[0]
            assert isinstance(channel, RemoteInputChannel)
            assert channel.terminated.wait(5)
            list(gate)
        assert f"{fake.address[0]}:{fake.address[1]}" in str(info.value)  # the peer
        assert f"{bad_id}#0" in str(info.value)  # and the partition
        assert isinstance(channel, RemoteInputChannel)
        witnessed = channel.stats().buffers_without_credit
        assert witnessed == (1 if script is _no_credit else 0)
    finally:
        fake.close()

    for batch in good_batches:  # the other stream was not disturbed
        seen += batch.column("seq").to_pylist()
    assert seen == list(range(rows))
    assert good.stats().channels_finished == 1
    producer.join(10)
    assert not producer.is_alive()
    server.release(good_part.partition_id)
    assert pool.num_available == pool.num_segments


class _LateReceiver:
    """A client connection whose receiver reads nothing after ``hold_after`` buffers until
    ``release`` is set (a receiver thread late to read END), and that records failed sends.

    Once ``peer_gone`` is set, a credit announcement the kernel still accepts (any one before the
    peer hangs up, or the first one after its FIN: the peer answers that with a reset) is sent
    again until the kernel refuses it, within a deadline: the refusal the test needs, whenever the
    reader's credit batching sends its announcements."""

    def __init__(self, inner: Connection, hold_after: int, peer_gone: threading.Event) -> None:
        self._inner = inner
        self._hold_after = hold_after
        self.buffers = 0
        self.holding = threading.Event()
        self.release = threading.Event()
        self.peer_gone = peer_gone
        self.failed_sends: list[ShuffleError] = []

    def recv_header(self, idle_ok: bool = False) -> FrameHeader | None:
        if self.buffers == self._hold_after:
            self.holding.set()
            assert self.release.wait(10)
        header = self._inner.recv_header(idle_ok)
        if header is not None and header.kind is Kind.BUFFER:
            self.buffers += 1
        return header

    def send(
        self,
        kind: Kind,
        payload: bytes | memoryview = b"",
        seq: int = 0,
        value: int = 0,
        *,
        checksum: bool = False,
    ) -> None:
        try:
            self._inner.send(kind, payload, seq, value, checksum=checksum)
            if kind is Kind.ADD_CREDIT and self.peer_gone.is_set():
                # Sent again until it raises (the peer's reset, on loopback, within milliseconds).
                wait_until(lambda: self._inner.send(kind, payload, seq, value), 5, interval_s=0.01)
        except ShuffleError as exc:
            self.failed_sends.append(exc)
            raise

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


class _LateTransport:
    def __init__(self, hold_after: int) -> None:
        self._hold_after = hold_after
        self.conns: list[_LateReceiver] = []
        self.peer_gone = threading.Event()

    def connect(
        self, address: tuple[str, int], connect_timeout_s: float, read_timeout_s: float, clock: Clock
    ) -> Connection:
        conn = _LateReceiver(
            TcpTransport().connect(address, connect_timeout_s, read_timeout_s, clock),
            self._hold_after,
            self.peer_gone,
        )
        self.conns.append(conn)
        return cast(Connection, conn)

    def listen(self, host: str, port: int, read_timeout_s: float, clock: Clock) -> Listener:
        raise NotImplementedError("client side only")


def test_end_wins_over_a_credit_announcement_that_hit_the_closed_connection(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """A server sends its last buffers and END and hangs up at once; the reader consumes those
    buffers (each one a credit announcement, refused by the closed socket) before its receiver
    reads END. The stream still ends normally with every row: the failed announcements do not
    decide, END does (hole (a) of issue 24: the pipelined shuffle failed after all its rows)."""
    sent = config.exclusive_buffers_per_channel
    payload = _payload(config, pool)

    def all_then_end(conn: TcpConnection, credit: int) -> None:
        for seq in range(sent):
            conn.send(Kind.BUFFER, payload, seq=seq, value=0, checksum=True)
        conn.send(Kind.END_OF_PARTITION, seq=sent)

    fake = FakeServer(SECRET.encode(), all_then_end, hang_up=True)
    transport = _LateTransport(hold_after=sent)
    spec = RemoteChannelSpec(fake.address, PartitionId(APP, 7, 0), 0)
    try:
        with InputGate([spec], SCHEMA, pool, config, SECRET, transport) as gate:
            transport.peer_gone.set()  # every credit announcement sent until the kernel refuses it
            batches = iter(gate)
            rows = [next(batches).num_rows for _ in range(sent)]  # all received before END is read
            (conn,) = transport.conns
            assert conn.holding.wait(30) and fake.hung_up.wait(30)
            assert wait_until(lambda: bool(conn.failed_sends), 30)  # the announcement hit the reset
            conn.release.set()
            rows += [b.num_rows for b in batches]
            assert gate.stats().channels_finished == 1
        assert rows == [10] * sent
        assert isinstance(conn.failed_sends[0], PeerLostError)
    finally:
        fake.close()
    assert pool.num_available == pool.num_segments


def test_a_reader_hangs_up_as_soon_as_it_reads_end(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    """The server learns a stream is over from the reader's hang-up, before the reader's gate is
    closed: a pipelined map task waits for that (bounded) before it closes its server."""
    part = ResultPartition(PartitionId(APP, 8, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    producer = produce(part, 3000)
    gate = InputGate([RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, config, SECRET)
    try:
        assert gate.read_all().num_rows == 3000
        (sender,) = server.senders()
        assert sender.completed
        assert sender.hung_up.wait(5)  # the gate is still open
    finally:
        gate.close()
    producer.join(10)
    server.release(part.partition_id)


def test_releasing_a_partition_mid_stream_fails_its_readers_clearly(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId(APP, 6, 0), 1, SCHEMA, pool, config=config)
    server.register(part)
    producer = produce(part, 200_000)
    gate = InputGate([RemoteChannelSpec(server.address, part.partition_id, 0)], SCHEMA, pool, config, SECRET)
    it = iter(gate)
    next(it)
    server.release(part.partition_id)
    with pytest.raises(RemoteFailureError, match="released"):
        for _ in it:
            pass
    producer.join(10)
    assert not producer.is_alive()
    assert pool.num_available == pool.num_segments


def test_unreachable_server_is_a_lost_peer(config: ShuffleConfig, pool: NetworkBufferPool) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = RemoteChannelSpec(("127.0.0.1", port), PartitionId(APP, 7, 0), 0)
    error = _expect_failure(config, pool, spec, SECRET)
    assert isinstance(error, PeerLostError) and "cannot connect" in str(error)
    assert pool.num_available == pool.num_segments


def test_server_refuses_partitions_of_other_applications(
    config: ShuffleConfig, pool: NetworkBufferPool, server: PartitionServer
) -> None:
    part = ResultPartition(PartitionId("other-app", 1, 0), 1, SCHEMA, pool, config=config)
    with pytest.raises(ShuffleConfigError, match="other-app"):
        server.register(part)
    part.release()
    assert pool.num_available == pool.num_segments


def test_a_frame_larger_than_a_buffer_within_max_frame_bytes_arrives_whole(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """``max_frame_bytes`` may exceed ``buffer_size``: such a frame is received whole into memory
    of its own (not cut at the segment's end), and the buffers still all come back."""
    big = make_batch(0, 1200, payload_len=16)  # ~ 3 x the 16 KiB buffer, in one IPC stream
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(big)
    payload = sink.getvalue().to_pybytes()
    assert len(payload) > config.buffer_size

    def script(conn: TcpConnection, credit: int) -> None:
        conn.send(Kind.BUFFER, payload, seq=0, value=0, checksum=True)
        conn.send(Kind.END_OF_PARTITION, seq=1)

    fake = FakeServer(SECRET.encode(), script)
    roomy = config.replace(max_frame_bytes=4 * config.buffer_size)
    try:
        spec = RemoteChannelSpec(fake.address, PartitionId(APP, 40, 0), 0)
        with InputGate([spec], SCHEMA, pool, roomy, SECRET) as gate:
            table = gate.read_all()
    finally:
        fake.close()
    assert table.column("seq").to_pylist() == list(range(1200))
    assert pool.num_available == pool.num_segments


def test_credit_goes_out_in_batches_and_a_keepalive_hands_over_what_came(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> None:
    """A sender with a backlog gets the floating buffers' credit in one ADD_CREDIT; the credit of
    the buffers consumed afterwards is held back until it is as large as what the sender still
    holds unspent, then goes in one message (one per few buffers, not one per buffer: each costs
    both processes a wake-up). The receiver wakes its consumer once a few buffers are in; the last
    two wait for more, and the sender's keepalive (it went idle despite its backlog) hands them
    over."""
    sent = 5
    payload = _payload(config, pool)
    consumed = threading.Event()
    credits: list[int] = []

    def script(conn: TcpConnection, credit: int) -> None:
        assert credit == config.exclusive_buffers_per_channel
        for seq in range(sent):
            conn.send(Kind.BUFFER, payload, seq=seq, value=10, checksum=True)  # "10 more queued behind it"
        conn.send(Kind.KEEPALIVE)
        assert consumed.wait(10), "the consumer never got every buffer"
        while (header := conn.recv_header(idle_ok=True)) is not None:  # all it sent, until silence
            if header.kind is Kind.ADD_CREDIT:
                credits.append(header.value)
        conn.send(Kind.END_OF_PARTITION, seq=sent)

    fake = FakeServer(SECRET.encode(), script)
    spec = RemoteChannelSpec(fake.address, PartitionId(APP, 41, 0), 0)
    try:
        with InputGate([spec], SCHEMA, pool, config, SECRET) as gate:
            batches = iter(gate)
            rows = [next(batches).num_rows for _ in range(sent)]
            consumed.set()
            rows += [b.num_rows for b in batches]
            (channel,) = gate.channels
            stats = channel.stats()
    finally:
        fake.close()
    assert rows == [10] * sent
    floating = config.floating_buffers_per_gate
    # The floating buffers' credit at once. The consumed buffers' credit (each floating one only
    # if the channel was listening for it when it came back: timing) is held back until it
    # matches the sender's unspent credit, 2 + 8 - 5 = 5, so it goes out in one message of all
    # five or not at all (the stream ended first); never one by one.
    assert credits[0] == floating
    assert credits[1:] in ([], [sent])
    assert stats.credit_announcements == len(credits)
    assert stats.credits_announced == config.exclusive_buffers_per_channel + sum(credits)
    assert stats.buffers_without_credit == 0 and stats.max_in_flight_over_credit == 0
    assert pool.num_available == pool.num_segments
