"""A hostile or broken client against the real ``PartitionServer``: garbage, oversized control
frames, non-positive credit. The server must fail only that stream with a typed error naming the
partition and the peer (sent back, logged, kept in ``stream_errors()``), return the stream's
buffers, and keep serving a good stream that is in flight at the same time.
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from arrow_shuffle import (
    ControlMessageError,
    CorruptFrameError,
    InputGate,
    NetworkBufferPool,
    OversizedFrameError,
    PartitionId,
    PartitionServer,
    PeerLostError,
    RecordWriter,
    RemoteChannelSpec,
    ResultPartition,
    ShuffleConfig,
    ShuffleError,
    ShuffleProtocolError,
)
from arrow_shuffle.auth import client_handshake
from arrow_shuffle.frames import HEADER, MAGIC, MAX_CONTROL_PAYLOAD, ErrorCode, Kind
from arrow_shuffle.transport import TcpConnection

from .conftest import APP, SCHEMA, SECRET, make_batch
from .test_remote import produce

BAD = PartitionId(APP, 40, 0)
"""The partition the broken client asks for (written and finished, so buffers are queued)."""


class RawClient:
    """A client built from a plain socket: frames are written by hand, the engine's only help is
    the real HMAC handshake (a fault after authentication must get past it first)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=5)
        host, port = self.sock.getsockname()[:2]
        self.peer = f"{host}:{port}"  # what the server calls us
        self.conn = TcpConnection(self.sock, 5.0)

    def authenticate(self) -> None:
        self.session = client_handshake(self.conn, SECRET.encode(), APP)

    def send_request(self, body: bytes, credit: int) -> None:
        """A PARTITION_REQUEST sealed with the session key, as a real client sends it."""
        sealed = self.session.seal(Kind.PARTITION_REQUEST, 0, credit, body)
        self.conn.send(Kind.PARTITION_REQUEST, sealed, value=credit)

    def request(self, partition: PartitionId, credit: int = 1) -> None:
        self.send_request(json.dumps({"partition": partition.to_wire(), "subpartition": 0}).encode(), credit)

    def header_only(self, kind: Kind, length: int, value: int = 0) -> None:
        """A frame header announcing ``length`` payload bytes that never follow."""
        self.sock.sendall(HEADER.pack(MAGIC, kind, 0, length, 0, value))

    def garbage(self) -> None:
        self.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    def error_frame(self) -> tuple[int, str]:
        """Skip HELLO/BUFFER/KEEPALIVE frames until the server's ERROR frame."""
        while True:
            header = self.conn.recv_header()
            assert header is not None
            payload = bytearray(header.length)
            self.conn.recv_into(memoryview(payload))
            if header.kind is Kind.ERROR:
                return header.value, payload.decode()

    def expect_closed(self) -> None:
        """The server ends the stream after the error frame (it may still flush frames)."""
        with pytest.raises(PeerLostError, match=r"EOF|receive failed"):
            while True:
                header = self.conn.recv_header()
                assert header is not None
                self.conn.recv_into(memoryview(bytearray(header.length)))

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class Fault:
    run: Callable[[RawClient], None]
    error: type[ShuffleError]
    match: str
    names_partition: bool
    opens_stream: bool  # the request was accepted, so the server had a sender (and buffers) for it


def _garbage_instead_of_auth(c: RawClient) -> None:
    c.garbage()


def _oversized_request(c: RawClient) -> None:
    c.authenticate()
    c.header_only(Kind.PARTITION_REQUEST, 1 << 30, value=2)


def _malformed_request(c: RawClient) -> None:
    c.authenticate()
    c.send_request(b"{not json", credit=2)


def _zero_initial_credit(c: RawClient) -> None:
    c.authenticate()
    c.request(BAD, credit=0)


def _garbage_after_request(c: RawClient) -> None:
    c.authenticate()
    c.request(BAD)
    c.garbage()


def _oversized_control_frame(c: RawClient) -> None:
    c.authenticate()
    c.request(BAD)
    c.header_only(Kind.ADD_CREDIT, MAX_CONTROL_PAYLOAD + 1, value=1)


def _zero_credit(c: RawClient) -> None:
    c.authenticate()
    c.request(BAD)
    c.conn.send(Kind.ADD_CREDIT, value=0)


def _negative_credit(c: RawClient) -> None:
    c.authenticate()
    c.request(BAD)
    c.conn.send(Kind.ADD_CREDIT, value=-5)


FAULTS = {
    "garbage-instead-of-auth": Fault(_garbage_instead_of_auth, CorruptFrameError, "magic", False, False),
    "oversized-request": Fault(_oversized_request, OversizedFrameError, "exceeds", False, False),
    "malformed-request": Fault(_malformed_request, ControlMessageError, "malformed", False, False),
    "zero-initial-credit": Fault(_zero_initial_credit, ShuffleProtocolError, "initial credit", True, False),
    "garbage-after-request": Fault(_garbage_after_request, CorruptFrameError, "magic", True, True),
    "oversized-control-frame": Fault(_oversized_control_frame, OversizedFrameError, "exceeds", True, True),
    "zero-credit": Fault(_zero_credit, ShuffleProtocolError, "non-positive credit 0", True, True),
    "negative-credit": Fault(_negative_credit, ShuffleProtocolError, "non-positive credit -5", True, True),
}


@pytest.mark.parametrize("name", list(FAULTS))
def test_broken_client_fails_only_its_stream(
    name: str,
    config: ShuffleConfig,
    pool: NetworkBufferPool,
    server: PartitionServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fault = FAULTS[name]
    roomy = config.replace(buffers_per_subpartition=16)  # room for all of it: written before it is read
    bad = ResultPartition(BAD, 1, SCHEMA, pool, roomy)
    writer = RecordWriter(bad)
    for start in range(0, 3000, 300):
        writer.write(make_batch(start, 300))
    writer.finish()
    server.register(bad)
    assert bad.pool.in_use > 0  # queued buffers the failed stream must give back

    good_part = ResultPartition(PartitionId(APP, 41, 0), 1, SCHEMA, pool, config=config)
    server.register(good_part)
    rows = 50_000  # far more than the partition's and the gate's buffers: mid-flight below
    producer = produce(good_part, rows)
    spec = RemoteChannelSpec(server.address, good_part.partition_id, 0)
    with InputGate([spec], SCHEMA, pool, config, SECRET) as good:
        batches = iter(good)
        seen = next(batches).column("seq").to_pylist()

        client = RawClient(server.address)
        try:
            with caplog.at_level(logging.WARNING, logger="arrow_shuffle.partition_server"):
                fault.run(client)
                code, message = client.error_frame()
                client.expect_closed()
        finally:
            client.close()

        for batch in batches:  # the good stream, in flight all along, completes
            seen += batch.column("seq").to_pylist()
        assert seen == list(range(rows))
        assert good.stats().channels_finished == 1

    # The broken client was told why, with a typed code, naming the partition and itself.
    assert code == ErrorCode.PROTOCOL
    assert fault.match in message and client.peer in message
    # The server kept a typed error and logged it, both naming the partition and the peer.
    [error] = server.stream_errors()
    assert type(error) is fault.error, repr(error)
    assert fault.match in str(error) and client.peer in str(error)
    logged = [r.getMessage() for r in caplog.records if r.name == "arrow_shuffle.partition_server"]
    assert any(client.peer in line and fault.match in line for line in logged), logged
    if fault.names_partition:
        for text in (message, str(error), *logged):
            assert f"{BAD}#0" in text
    if fault.opens_stream:  # the stream's queued buffers came back before it was closed
        assert bad.pool.in_use == 0

    producer.join(10)
    assert not producer.is_alive()
    server.release(good_part.partition_id)
    server.release(BAD)
    assert pool.num_available == pool.num_segments
