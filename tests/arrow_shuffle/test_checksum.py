"""Checksummed data frames on real loopback sockets: a bit flipped between the server and the reader
is a ``FrameChecksumError``, never a decoded batch; the good path still delivers every row; with
``checksum`` off the frames carry no CRC (and the same flipped bit then decodes into a wrong row,
which is what the check is for)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle import (
    InputGate,
    NetworkBufferPool,
    PartitionId,
    PartitionServer,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleConfigError,
    ShuffleError,
)
from arrow_shuffle.checksum import digest
from arrow_shuffle.errors import CorruptFrameError, FrameChecksumError
from arrow_shuffle.frames import (
    CHECKSUM_SIZE,
    FLAG_CHECKSUM,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    Kind,
    pack_header,
    unpack_header,
    with_checksum,
)
from arrow_shuffle.transport import TcpConnection
from harness.procs import wait_until

from .conftest import APP, SCHEMA, SECRET, make_batch
from .fake_peer import FakeServer
from .frame_proxy import FrameProxy

GOOD = "x" * 8
"""Every row's ``payload`` value (``make_batch``): a flipped bit in it shows up as another string."""


def _flip_in_strings(frame: int) -> Callable[[int, bytearray], None]:
    """Damage for ``FrameProxy``: one bit of the string data of BUFFER frame ``frame``."""

    def damage(index: int, payload: bytearray) -> None:
        if index == frame:
            at = payload.find(b"x" * 64)
            assert at >= 0, "no string data in the frame to damage"
            payload[at] ^= 0x01

    return damage


def _produce(partition: ResultPartition, rows: int) -> threading.Thread:
    writer = RecordWriter(partition, key_columns=["key"])

    def run() -> None:
        try:
            for start in range(0, rows, 300):
                writer.write(make_batch(start, min(300, rows - start)))
            writer.finish()
        except ShuffleError:
            writer.abort()  # the reader failed: the stream ends

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _read(gate: InputGate) -> tuple[list[int], list[str], BaseException | None]:
    """Every row the gate hands out (seq and payload) until it ends or fails."""
    seqs: list[int] = []
    strings: list[str] = []
    try:
        for batch in gate:
            seqs += batch.column("seq").to_pylist()
            strings += batch.column("payload").to_pylist()
    except ShuffleError as exc:
        return seqs, strings, exc
    return seqs, strings, None


@pytest.fixture
def proxied(
    config: ShuffleConfig, pool: NetworkBufferPool
) -> Iterator[Callable[..., tuple[FrameProxy, RemoteChannelSpec, threading.Thread]]]:
    """A server with one partition of ``rows`` rows being written, reached through a ``FrameProxy``."""
    made: list[tuple[PartitionServer, FrameProxy, ResultPartition, threading.Thread]] = []

    def make(
        rows: int, damage: Callable[[int, bytearray], None] | None = None, cfg: ShuffleConfig | None = None
    ) -> tuple[FrameProxy, RemoteChannelSpec, threading.Thread]:
        cfg = cfg or config
        server = PartitionServer(SECRET, APP, config=cfg)
        part = ResultPartition(PartitionId(APP, 40 + len(made), 0), 1, SCHEMA, pool, config=cfg)
        server.register(part)
        producer = _produce(part, rows)
        proxy = FrameProxy(server.address, damage)
        made.append((server, proxy, part, producer))
        return proxy, RemoteChannelSpec(proxy.address, part.partition_id, 0), producer

    yield make
    for server, proxy, part, producer in made:
        producer.join(30)
        assert not producer.is_alive()
        server.release(part.partition_id)
        server.close()
        proxy.close()
        assert not proxy.errors
    # The server's sender hands its last buffer back once it sees the stream closed: soon.
    assert wait_until(lambda: pool.num_available == pool.num_segments, 30, 0.01), pool.num_available


# -- through a proxy that flips a bit -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("rows", "frame"),
    [(10, 0), (20_000, 3)],
    ids=["small-frame-into-its-segment", "full-frame-into-arrow-memory"],
)
def test_a_flipped_bit_is_a_typed_error_and_no_damaged_row(
    config: ShuffleConfig, pool: NetworkBufferPool, proxied: Callable[..., Any], rows: int, frame: int
) -> None:
    proxy, spec, _producer = proxied(rows, _flip_in_strings(frame))
    with InputGate([spec], SCHEMA, pool, config, SECRET) as gate:
        seqs, strings, error = _read(gate)
    assert isinstance(error, FrameChecksumError), error
    message = str(error)
    assert f"buffer {frame} " in message and "checksum: 0x" in message and "sender's 0x" in message
    assert f"{spec.partition_id}#0" in message and f"{proxy.address[0]}:{proxy.address[1]}" in message
    assert set(strings) <= {GOOD}  # no damaged row reached the reader
    assert seqs == list(range(len(seqs))) and len(seqs) < rows  # the rows before it, nothing after
    damaged = proxy.buffers()[frame]
    if frame:  # the case that covers the receive into Arrow memory really used it
        assert len(damaged.payload) >= config.buffer_size // 2
    else:
        assert len(damaged.payload) < config.buffer_size // 2


def test_checked_frames_carry_the_crc_of_their_payload_and_every_row_arrives(
    config: ShuffleConfig, pool: NetworkBufferPool, proxied: Callable[..., Any]
) -> None:
    rows = 20_000
    proxy, spec, _producer = proxied(rows)
    with InputGate([spec], SCHEMA, pool, config, SECRET) as gate:
        seqs, strings, error = _read(gate)
    assert error is None
    assert seqs == list(range(rows)) and set(strings) == {GOOD}
    buffers = proxy.buffers()
    assert len(buffers) > 10
    for seen in buffers:
        assert seen.flags == FLAG_CHECKSUM
        assert seen.sent_crc == digest(seen.payload)
    others = [f for f in proxy.frames if f.kind != Kind.BUFFER]
    assert others and all(f.flags == 0 and f.crc is None for f in others)


def test_without_checksum_the_frames_carry_none_and_a_flipped_bit_goes_unseen(
    config: ShuffleConfig, pool: NetworkBufferPool, proxied: Callable[..., Any]
) -> None:
    """The control for the test above: the same damage with ``checksum`` off on both ends decodes
    into a wrong row and no error (issue 36's silent wrong answer), so it is the CRC that stops it."""
    off = config.replace(checksum=False)
    rows = 20_000
    proxy, spec, _producer = proxied(rows, _flip_in_strings(3), off)
    with InputGate([spec], SCHEMA, pool, off, SECRET) as gate:
        seqs, strings, error = _read(gate)
    assert error is None and seqs == list(range(rows))
    assert sorted(set(strings)) == [GOOD, "y" + "x" * 7]
    assert all(f.flags == 0 and f.crc is None for f in proxy.frames)


# -- a scripted server: each receive path, and a frame without a checksum -------------------------
def _ipc(rows: int) -> bytes:
    """A valid payload (an Arrow IPC stream, as the engine frames them) of ``rows`` rows."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SCHEMA) as writer:
        writer.write_batch(make_batch(0, rows))
    return bytes(sink.getvalue())


@pytest.mark.parametrize("right", [True, False], ids=["right-crc", "wrong-crc"])
@pytest.mark.parametrize(
    ("rows", "max_frame"),
    [(10, 0), (400, 0), (1200, 64 * 1024)],
    ids=["into-segment", "into-block", "into-own-memory"],
)
def test_each_receive_path_checks_before_decoding(
    config: ShuffleConfig, pool: NetworkBufferPool, rows: int, max_frame: int, right: bool
) -> None:
    """The same valid payload decodes with its right CRC and is refused with a wrong one, whichever
    memory it is received into (below half a buffer, up to a buffer, above one)."""
    cfg = config.replace(max_frame_bytes=max_frame)
    payload = _ipc(rows)
    half, whole = cfg.buffer_size // 2, cfg.buffer_size
    assert {10: len(payload) < half, 400: half <= len(payload) <= whole, 1200: len(payload) > whole}[rows]
    crc = digest(payload) ^ (0 if right else 0x80000000)

    def script(conn: TcpConnection, credit: int) -> None:
        conn._sock.sendall(pack_header(Kind.BUFFER, len(payload), 0, 0, crc) + payload)
        conn.send(Kind.END_OF_PARTITION, seq=1)

    fake = FakeServer(SECRET.encode(), script)
    try:
        spec = RemoteChannelSpec(fake.address, PartitionId(APP, 50, 0), 0)
        with InputGate([spec], SCHEMA, pool, cfg, SECRET) as gate:
            seqs, _strings, error = _read(gate)
    finally:
        fake.close()
    if right:
        assert error is None and seqs == list(range(rows))
    else:
        assert isinstance(error, FrameChecksumError) and seqs == []
        assert f"sender's 0x{crc:08x}" in str(error) and f"checksum: 0x{digest(payload):08x}" in str(error)
    assert pool.num_available == pool.num_segments


@pytest.mark.parametrize("required", [True, False])
def test_a_reader_with_checksums_on_refuses_a_frame_without_one(
    config: ShuffleConfig, pool: NetworkBufferPool, required: bool
) -> None:
    """A cleared flag must not switch the check off: refused before its payload is read. A reader
    with checksums off reads it."""
    cfg = config.replace(checksum=required)
    payload = _ipc(10)

    def script(conn: TcpConnection, credit: int) -> None:
        conn.send(Kind.BUFFER, payload, seq=0, value=0)  # no checksum
        conn.send(Kind.END_OF_PARTITION, seq=1)

    fake = FakeServer(SECRET.encode(), script)
    try:
        spec = RemoteChannelSpec(fake.address, PartitionId(APP, 51, 0), 0)
        with InputGate([spec], SCHEMA, pool, cfg, SECRET) as gate:
            seqs, _strings, error = _read(gate)
    finally:
        fake.close()
    if required:
        assert isinstance(error, FrameChecksumError) and "carries no checksum" in str(error)
        assert seqs == []
    else:
        assert error is None and seqs == list(range(10))
    assert pool.num_available == pool.num_segments


# -- the wire format, one frame at a time --------------------------------------------------------------
@pytest.fixture
def pair() -> Iterator[tuple[TcpConnection, socket.socket]]:
    mine, theirs = socket.socketpair()
    conn = TcpConnection(mine, 5.0)
    yield conn, theirs
    conn.close()
    theirs.close()


def _exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "EOF inside a frame"
        data += chunk
    return bytes(data)


@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("how", ["send", "send_parts"])
def test_the_crc_follows_the_header_only_when_asked(
    pair: tuple[TcpConnection, socket.socket], checksum: bool, how: str
) -> None:
    conn, theirs = pair
    parts: list[bytes | pa.Buffer] = [b"abc" * 3000, pa.py_buffer(b"defg" * 5000), b"h"]
    payload = b"".join(bytes(p) for p in parts)
    if how == "send":
        conn.send(Kind.BUFFER, payload, seq=7, value=3, checksum=checksum)
    else:
        conn.send_parts(Kind.BUFFER, parts, len(payload), seq=7, value=3, checksum=checksum)
    magic, kind, flags, length, seq, value = HEADER.unpack(_exact(theirs, HEADER_SIZE))
    assert (magic, kind, length, seq, value) == (MAGIC, Kind.BUFFER, len(payload), 7, 3)
    assert flags == (FLAG_CHECKSUM if checksum else 0)
    if checksum:
        assert int.from_bytes(_exact(theirs, CHECKSUM_SIZE), "big") == digest(payload)
    assert _exact(theirs, len(payload)) == payload  # nothing else between header and payload


def test_recv_header_reads_the_crc_with_the_header() -> None:
    a, b = socket.socketpair()
    sender, receiver = TcpConnection(a, 5.0), TcpConnection(b, 5.0)
    try:
        sender.send(Kind.BUFFER, b"payload", seq=1, checksum=True)
        sender.send(Kind.KEEPALIVE)
        header = receiver.recv_header()
        assert header is not None and header.crc == digest(b"payload") and header.checksummed
        got = bytearray(7)
        receiver.recv_into(memoryview(got))
        assert got == b"payload"
        keepalive = receiver.recv_header()
        assert keepalive is not None and keepalive.kind is Kind.KEEPALIVE and keepalive.crc is None
    finally:
        sender.close()
        receiver.close()


def test_header_flags_other_than_a_buffers_checksum_are_corrupt() -> None:
    header = unpack_header(pack_header(Kind.BUFFER, 5, 2, 1, 0xDEADBEEF))
    assert header.checksummed and header.crc is None  # read with the 4 bytes after it
    full = with_checksum(header, (0xDEADBEEF).to_bytes(4, "big"))
    assert (full.kind, full.length, full.seq, full.value, full.crc) == (Kind.BUFFER, 5, 2, 1, 0xDEADBEEF)
    assert full.pack() == pack_header(Kind.BUFFER, 5, 2, 1, 0xDEADBEEF)
    with pytest.raises(CorruptFrameError, match="unknown frame flags 0x02"):
        unpack_header(HEADER.pack(MAGIC, Kind.BUFFER, 0x02, 5, 0, 0))
    with pytest.raises(CorruptFrameError, match="checksum flag on a ADD_CREDIT"):
        unpack_header(HEADER.pack(MAGIC, Kind.ADD_CREDIT, FLAG_CHECKSUM, 0, 0, 1))
    assert unpack_header(pack_header(Kind.ADD_CREDIT, 0, 0, 4)).crc is None


def test_checksum_setting_is_on_by_default_and_a_bool() -> None:
    assert ShuffleConfig().checksum is True
    with pytest.raises(ShuffleConfigError, match="checksum"):
        ShuffleConfig(checksum="yes")  # type: ignore[arg-type]
