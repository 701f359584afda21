"""The engine over TLS on real sockets: a data stream and a control call inside TLS, a plaintext
client refused with a typed error, a silent or dripping TLS peer cut at the handshake deadline,
and a client pinned to another certificate refusing the server."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator

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
)
from arrow_shuffle.acceptor import HANDSHAKE_DEADLINE
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.control_server import ControlServer
from arrow_shuffle.errors import PeerLostError, ShuffleAuthenticationError, ShuffleError
from arrow_shuffle.transport import TcpTransport
from harness.procs import wait_until
from spark_plugin.settings import tls
from tests.security.attack import ECHO, handlers

from .conftest import APP, SCHEMA, SECRET, make_batch

FAST = ShuffleConfig(connect_timeout_s=1.0, peer_timeout_s=1.0, keepalive_interval_s=0.2)


@pytest.fixture(scope="module")
def material() -> tls.TlsMaterial:
    return tls.generate_self_signed()


@pytest.fixture(scope="module")
def server_transport(material: tls.TlsMaterial) -> TcpTransport:
    return TcpTransport(server_context=tls.server_context(material))


@pytest.fixture(scope="module")
def client_transport(material: tls.TlsMaterial) -> TcpTransport:
    return TcpTransport(client_context=tls.client_context(material), server_name=material.server_name)


@pytest.fixture
def control(server_transport: TcpTransport) -> Iterator[ControlServer]:
    srv = ControlServer(SECRET, ECHO, handlers(), config=FAST, transport=server_transport)
    yield srv
    srv.close()


def test_a_stream_inside_tls(
    config: ShuffleConfig,
    pool: NetworkBufferPool,
    server_transport: TcpTransport,
    client_transport: TcpTransport,
) -> None:
    server = PartitionServer(SECRET, APP, config=config, transport=server_transport)
    try:
        roomy = config.replace(buffers_per_subpartition=128)  # room for all of it: written before it is read
        part = ResultPartition(PartitionId(APP, 1, 0), 2, SCHEMA, pool, config=roomy)
        server.register(part)
        writer = RecordWriter(part, key_columns=["key"])
        for start in range(0, 20_000, 1000):
            writer.write(make_batch(start, 1000, payload_len=64))
        writer.finish()
        specs = [RemoteChannelSpec(server.address, part.partition_id, s) for s in range(2)]
        with InputGate(specs, SCHEMA, pool, config, secret=SECRET, transport=client_transport) as gate:
            seqs = sorted(gate.read_all().column("seq").to_pylist())
        assert seqs == list(range(20_000))
    finally:
        server.close()
    assert pool.num_available == pool.num_segments


def test_large_batches_of_a_pipelined_stream_inside_tls(
    config: ShuffleConfig,
    pool: NetworkBufferPool,
    server_transport: TcpTransport,
    client_transport: TcpTransport,
) -> None:
    """Batches that fill a buffer go out of a PIPELINED partition uncopied on plain TCP; inside TLS
    (no ``sendmsg``) their pieces are joined first, and arrive the same."""
    server = PartitionServer(SECRET, APP, config=config, transport=server_transport)
    try:
        part = ResultPartition(PartitionId(APP, 2, 0), 1, SCHEMA, pool, config=config)
        server.register(part)
        writer = RecordWriter(part)

        def produce() -> None:
            for start in range(0, 30_000, 400):  # ~ 13 KiB each: one uncopied frame per batch
                writer.write(make_batch(start, 400), 0)
            writer.finish()

        producer = threading.Thread(target=produce)
        producer.start()
        spec = RemoteChannelSpec(server.address, part.partition_id, 0)
        with InputGate([spec], SCHEMA, pool, config, secret=SECRET, transport=client_transport) as gate:
            seqs = gate.read_all().column("seq").to_pylist()
            stats = gate.stats()
        producer.join(10)
        assert not producer.is_alive()
        assert seqs == list(range(30_000))
        assert stats.buffers_received == 75
    finally:
        server.close()
    assert pool.num_available == pool.num_segments


def test_a_control_call_inside_tls(control: ControlServer, client_transport: TcpTransport) -> None:
    with ControlClient(control.address, SECRET, ECHO, transport=client_transport) as c:
        assert c.call("echo", text="hi", times=3, tags=[]) == "hihihi"
        assert c._conn.tls  # type: ignore[attr-defined]


@pytest.mark.parametrize("days", [31, 90])
def test_a_control_call_inside_tls_on_simulated_day(days: int) -> None:
    """Issue 24: the certificate an application generated ``days`` ago (the clock moved back for
    its generation), handed over as to a new executor, still serves new shuffle connections."""
    from arrowbeat_base.clock import ManualClock
    from spark_plugin.settings.config import load

    made = tls.generate_self_signed(ManualClock(wall_start=time.time() - days * 86400.0))
    m = tls.from_config(load({"spark.arrowbeat.ssl.enabled": "true", **tls.internal_settings(made)}))
    assert m is not None
    server = TcpTransport(server_context=tls.server_context(m))
    srv = ControlServer(SECRET, ECHO, handlers(), config=FAST, transport=server)
    try:
        client = TcpTransport(client_context=tls.client_context(m), server_name=m.server_name)
        with ControlClient(srv.address, SECRET, ECHO, transport=client) as c:
            assert c.call("echo", text="day", times=2, tags=[]) == "dayday"
    finally:
        srv.close()


def test_a_plaintext_client_is_refused(control: ControlServer, client_transport: TcpTransport) -> None:
    with pytest.raises(PeerLostError):  # the server never answers in plaintext, then hangs up
        ControlClient(control.address, SECRET, ECHO, connect_timeout_s=1.0, peer_timeout_s=1.0)
    assert wait_until(lambda: sum(control._acceptor.refusals().values()) >= 1, 10.0)
    with ControlClient(control.address, SECRET, ECHO, transport=client_transport) as c:  # others served
        assert c.call("echo", text="a", times=1, tags=[]) == "a"


def test_a_tls_client_of_a_plain_server_is_refused(client_transport: TcpTransport) -> None:
    plain = ControlServer(SECRET, ECHO, handlers(), config=FAST)
    try:
        with pytest.raises(ShuffleError):
            ControlClient(plain.address, SECRET, ECHO, connect_timeout_s=1.0, transport=client_transport)
    finally:
        plain.close()


def test_a_client_pinned_to_another_certificate_refuses_the_server(control: ControlServer) -> None:
    other = tls.generate_self_signed()
    pinned = TcpTransport(client_context=tls.client_context(other), server_name=other.server_name)
    with pytest.raises(ShuffleAuthenticationError, match="TLS handshake"):
        ControlClient(control.address, SECRET, ECHO, connect_timeout_s=1.0, transport=pinned)


@pytest.mark.parametrize("drip", [False, True])
def test_a_silent_or_dripping_tls_peer_is_cut_at_the_deadline(
    control: ControlServer, client_transport: TcpTransport, drip: bool
) -> None:
    """A peer that opens TCP and then sends nothing (or a byte of a ClientHello at a time) holds
    its own thread until the handshake deadline (1 s), never longer; others are served meanwhile."""
    started = time.monotonic()
    with socket.create_connection(control.address, timeout=5.0) as peer:
        if drip:
            hello = _client_hello()
            for i in range(min(len(hello), 40)):
                try:
                    peer.sendall(hello[i : i + 1])
                except OSError:
                    break
                if control._acceptor.refusals().get(HANDSHAKE_DEADLINE, 0):
                    break
                time.sleep(0.1)
        with ControlClient(control.address, SECRET, ECHO, transport=client_transport) as c:
            assert c.call("echo", text="b", times=1, tags=[]) == "b"
        assert wait_until(lambda: control._acceptor.refusals().get(HANDSHAKE_DEADLINE, 0) >= 1, 10.0)
        elapsed = time.monotonic() - started
        peer.settimeout(5.0)
        assert peer.recv(1) == b""  # closed by the server
    assert elapsed < 1.0 + 3.0  # the deadline (1 s) and scheduling slack, not the 5 s socket timeout


def _client_hello() -> bytes:
    """The first bytes a real TLS client sends (so the server waits for the rest)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = context.wrap_bio(incoming, outgoing, server_hostname="arrowbeat")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_the_pipelined_rendezvous_inside_tls(
    server_transport: TcpTransport, client_transport: TcpTransport
) -> None:
    from spark_plugin.shuffle.driver.rendezvous import Rendezvous
    from spark_plugin.shuffle.rendezvous_client import locate, register

    rendezvous = Rendezvous(SECRET, config=FAST, transport=server_transport)
    try:
        register(rendezvous.address, SECRET, 7, 0, "127.0.0.1", 4242, 9, transport=client_transport)
        [found] = locate(rendezvous.address, SECRET, 7, 1, wait_s=1.0, transport=client_transport)
        assert (found["host"], int(found["port"]), int(found["token"])) == ("127.0.0.1", 4242, 9)
        with pytest.raises(PeerLostError):  # the same call in plaintext gets nothing
            locate(rendezvous.address, SECRET, 7, 1, wait_s=1.0, config=FAST)
    finally:
        rendezvous.close()


def test_a_peer_silent_inside_tls_is_cut_at_the_handshake_deadline(
    control: ControlServer, material: tls.TlsMaterial
) -> None:
    """TLS completes, then nothing: the server's reads inside TLS still wake on its silence tick
    (a kernel receive timeout would be retried by Python's ssl forever) and the HMAC handshake
    deadline (1 s) ends the connection."""
    context = tls.client_context(material)
    started = time.monotonic()
    with (
        socket.create_connection(control.address, timeout=5.0) as raw,
        context.wrap_socket(raw, server_hostname=material.server_name) as peer,
    ):
        assert wait_until(lambda: control._acceptor.refusals().get(HANDSHAKE_DEADLINE, 0) >= 1, 10.0)
        elapsed = time.monotonic() - started
        peer.settimeout(5.0)
        with contextlib.suppress(OSError):
            while peer.recv(4096):  # whatever the server sent (its challenge), then its close
                pass
    assert elapsed < 1.0 + 3.0
