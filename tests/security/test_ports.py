"""Attacks on every port of a real agent process: data (``PartitionServer``), control
(``MapOutputService``'s ``ControlServer``) and the pipelined rendezvous (a ``ControlServer``).

Each attack - a pickle (before the handshake, unsealed after it, and sealed by a peer holding
the secret), garbage, oversized frames, a slow drip, a wrong or missing secret, a relayed
handshake followed by injected frames, 20 silent + 20 dripping connections - must be refused with
a typed error or status, counted by cause, logged once, execute and write nothing, and leave the
port serving real clients.
"""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arrow_shuffle import InputGate, NetworkBufferPool, RemoteChannelSpec, ShuffleConfig
from arrow_shuffle.auth import SEAL_SIZE
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.errors import ControlMessageError, ShuffleAuthenticationError
from arrow_shuffle.frames import ErrorCode, FrameHeader, Kind
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.transport import TcpConnection
from harness.procs import wait_until
from spark_plugin.shuffle import rendezvous_client
from spark_plugin.shuffle.agent_protocol import AGENT_CONTROL
from spark_plugin.shuffle.map_output import read_segments
from spark_plugin.shuffle.rendezvous_client import RENDEZVOUS
from spark_plugin.shuffle.worker.agent_client import MapOutputClient
from tests.security.agent_proc import ROWS, SCHEMA
from tests.security.attack import (
    APP,
    SECRET,
    RawPeer,
    Relay,
    Siege,
    auth_frame_bytes,
    drip,
    pickle_payload,
)
from tests.security.conftest import AgentProcess

PORTS = ("data", "control", "rendezvous")
CLAIM = {"data": APP, "control": AGENT_CONTROL.name, "rendezvous": RENDEZVOUS.name}
REQUEST = {
    "data": Kind.PARTITION_REQUEST,
    "control": Kind.CONTROL_REQUEST,
    "rendezvous": Kind.CONTROL_REQUEST,
}
LOGGER = {
    "data": "shuffle data server",
    "control": f"{AGENT_CONTROL.name} control server",
    "rendezvous": f"{RENDEZVOUS.name} control server",
}


# -- what a real client does on each port: it must keep working --------------------------------
def read_stream(agent: AgentProcess, pid: PartitionId) -> int:
    """Rows of a staged stream, read through the data port by the engine's real channel."""
    config = ShuffleConfig(buffer_size=64 * 1024, network_memory_bytes=4 << 20, peer_timeout_s=5.0)
    pool = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    spec = RemoteChannelSpec(agent.address["data"], pid, 0)
    with InputGate([spec], SCHEMA, pool, config, SECRET) as gate:
        return sum(b.num_rows for b in gate)


def stage(agent: AgentProcess) -> tuple[MapOutputClient, PartitionId]:
    client = MapOutputClient(agent.address["control"], SECRET, "executor 1")
    return client, client.stage(3, 0, SCHEMA, [(agent.info["path"], agent.info["segments"])])


def real_client_served(agent: AgentProcess, port: str) -> None:
    if port in ("data", "control"):
        client, pid = stage(agent)
        with client:
            assert client.metrics()["shuffle_streams_open"] >= 1
            assert read_stream(agent, pid) == ROWS
            client.unstage(pid)
    else:
        shuffle = 100 + threading.get_ident() % 1000
        rendezvous_client.register(agent.address["rendezvous"], SECRET, shuffle, 0, "h", 7, 9)
        found = rendezvous_client.locate(agent.address["rendezvous"], SECRET, shuffle, 1, 5.0)
        assert found == [{"map": 0, "host": "h", "port": 7, "token": 9}]
        rendezvous_client.forget(agent.address["rendezvous"], SECRET, shuffle)


def refusal_text(peer: RawPeer, header: FrameHeader, payload: bytes) -> tuple[str, str]:
    """``(code, message)`` of a refusal: an ERROR frame's, or a sealed error response's."""
    if header.kind is Kind.ERROR:
        return ErrorCode(header.value).name, payload.decode()
    assert header.kind is Kind.CONTROL_RESPONSE and peer.session is not None
    error = json.loads(peer.session.unseal(header, payload, "server"))["error"]
    return error["code"], error["message"]


def valid_request(port: str, agent: AgentProcess) -> bytes:
    if port == "data":
        pid = PartitionId(APP, 3, 0, 1)
        return json.dumps({"partition": pid.to_wire(), "subpartition": 0}).encode()
    if port == "control":
        return json.dumps({"op": "release", "args": {"shuffle": 3}}).encode()
    return json.dumps(
        {"op": "register", "args": {"shuffle": 5, "map": 0, "host": "evil", "port": 1, "token": 1}}
    ).encode()


# -- pickles -------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("how", ["before-handshake", "unsealed", "sealed-by-a-secret-holder"])
def test_a_pickle_executes_nothing(agent: AgentProcess, tmp_path: Path, port: str, how: str) -> None:
    marker = tmp_path / "pwned"
    payload = pickle_payload(marker)
    cause = {
        "before-handshake": "protocol",
        "unsealed": "authentication",
        "sealed-by-a-secret-holder": "protocol",
    }
    before = agent.refused(port, cause[how])
    peer = RawPeer(agent.address[port])
    try:
        if how == "before-handshake":
            peer.conn.send(REQUEST[port], payload, value=2)
        else:
            peer.authenticate(CLAIM[port])
            if how == "unsealed":
                peer.conn.send(REQUEST[port], os.urandom(SEAL_SIZE) + payload, value=2)
            else:
                peer.send_sealed(REQUEST[port], payload, value=2)
        code, message = refusal_text(peer, *peer.answer())
        assert peer.closed_by_server()
    finally:
        peer.close()
    expected = {
        "before-handshake": ("PROTOCOL", "expected AUTH"),
        "unsealed": ("AUTHENTICATION", "not sealed with this connection's session key"),
        "sealed-by-a-secret-holder": (
            "PROTOCOL" if port == "data" else "protocol",
            "not a JSON control message",
        ),
    }[how]
    assert (code, expected[1] in message, peer.name in message) == (expected[0], True, True), message
    assert agent.refused(port, cause[how]) == before + 1
    assert not marker.exists()
    real_client_served(agent, port)
    assert not marker.exists()


@pytest.mark.parametrize("port", ["control", "rendezvous"])
def test_the_old_pickle_client_gets_nowhere(agent: AgentProcess, tmp_path: Path, port: str) -> None:
    """``multiprocessing.connection`` with the right secret, as the old ports spoke it."""
    marker = tmp_path / "pwned"
    outcome: dict[str, BaseException] = {}

    def attack() -> None:
        try:
            with multiprocessing.connection.Client(agent.address[port], authkey=SECRET.encode()) as conn:
                conn.send(pickle_payload(marker))
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    thread.join(30)
    # It fails in its own challenge code (our HELLO is not its framing) or on our refusal.
    assert not thread.is_alive() and isinstance(outcome.get("error"), Exception), outcome
    assert not marker.exists()
    real_client_served(agent, port)


# -- garbage, oversized frames, a wrong or missing secret -------------------------------------------
@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("when", ["before-handshake", "after-handshake"])
def test_garbage_is_refused(agent: AgentProcess, port: str, when: str) -> None:
    before = agent.refused(port, "protocol")
    peer = RawPeer(agent.address[port])
    try:
        if when == "after-handshake":
            peer.authenticate(CLAIM[port])
        peer.sock.sendall(b"GET / HTTP/1.1\r\nHost: arrowbeat\r\n\r\n")
        code, message = refusal_text(peer, *peer.answer())
        assert peer.closed_by_server()
    finally:
        peer.close()
    assert code == "PROTOCOL" and "bad frame magic" in message and peer.name in message
    assert agent.refused(port, "protocol") == before + 1
    real_client_served(agent, port)


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("when", ["before-handshake", "after-handshake"])
def test_an_oversized_frame_is_refused_without_reading_it(agent: AgentProcess, port: str, when: str) -> None:
    """A 1 GiB announcement is refused at once: nothing is allocated or waited for."""
    peer = RawPeer(agent.address[port])
    try:
        if when == "before-handshake":
            peer.header_only(Kind.AUTH, 1 << 30)
        else:
            peer.authenticate(CLAIM[port])
            peer.header_only(REQUEST[port], 1 << 30, value=2)
        code, message = refusal_text(peer, *peer.answer())
        assert peer.closed_by_server()
    finally:
        peer.close()
    assert code == "PROTOCOL" and "exceeds" in message and peer.name in message
    real_client_served(agent, port)


@pytest.mark.parametrize("port", PORTS)
def test_a_wrong_secret_is_refused(agent: AgentProcess, port: str) -> None:
    before = agent.refused(port, "authentication")
    peer = RawPeer(agent.address[port])
    try:
        with pytest.raises(ShuffleAuthenticationError, match=r"refused the handshake.*wrong secret"):
            peer.authenticate(CLAIM[port], secret="not-the-secret-at-all")
        assert peer.closed_by_server()
    finally:
        peer.close()
    assert agent.refused(port, "authentication") == before + 1
    real_client_served(agent, port)


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("how", ["no-proof", "no-handshake"])
def test_a_missing_secret_is_refused(agent: AgentProcess, port: str, how: str) -> None:
    """No proof at all (an AUTH frame of just a nonce), or a request without any handshake."""
    peer = RawPeer(agent.address[port])
    try:
        if how == "no-proof":
            peer.conn.send(Kind.AUTH, os.urandom(32))
        else:
            peer.conn.send(REQUEST[port], valid_request(port, agent), value=2)
        code, message = refusal_text(peer, *peer.answer())
        assert peer.closed_by_server()
    finally:
        peer.close()
    assert code == "PROTOCOL" and ("short AUTH" if how == "no-proof" else "expected AUTH") in message
    assert Path(agent.info["path"]).exists()  # the request never ran (release would delete it)
    real_client_served(agent, port)


# -- slow drip -------------------------------------------------------------------------------------
@pytest.mark.parametrize("port", PORTS)
def test_a_slow_drip_is_cut_off_at_the_handshake_deadline(agent: AgentProcess, port: str) -> None:
    """One byte every 0.5 s: the server closes the connection at its 2 s handshake deadline,
    long before the AUTH frame could be complete; every byte used to reset the peer timeout."""
    before = agent.refused(port, "handshake-deadline")
    sent, seconds = drip(agent.address[port], interval_s=0.5, max_bytes=len(auth_frame_bytes()))
    assert sent < 20  # not even the AUTH frame's header got through (40+ s of dripping)
    assert agent.refused(port, "handshake-deadline") == before + 1
    print(f"{port}: drip cut off after {sent} bytes, {seconds:.1f}s")
    real_client_served(agent, port)


# -- a man in the middle -----------------------------------------------------------------------------
def _refusal(up: TcpConnection) -> tuple[int, str]:
    for _ in range(10):
        header = up.recv_header()
        assert header is not None
        payload = bytearray(header.length)
        up.recv_into(memoryview(payload))
        if header.kind is Kind.ERROR:
            return header.value, payload.decode()
    raise AssertionError("no refusal")


def _forge(kind: Kind, body: bytes, seq: int = 0, value: int = 0) -> Callable[[TcpConnection, Any], object]:
    def inject(up: TcpConnection, seen: object) -> object:
        up.send(kind, os.urandom(SEAL_SIZE) + body, seq=seq, value=value)
        return _refusal(up)

    return inject


def _victim(port: str, address: tuple[str, int]) -> Any:
    if port == "data":
        from arrow_shuffle.auth import client_handshake
        from arrow_shuffle.transport import TcpTransport

        conn = TcpTransport().connect(address, 5.0, 10.0)
        client_handshake(conn, SECRET.encode(), APP)
        return conn
    return ControlClient(address, SECRET, AGENT_CONTROL if port == "control" else RENDEZVOUS)


@pytest.mark.parametrize("port", PORTS)
def test_a_relayed_handshake_then_an_injected_request_executes_nothing(
    agent: AgentProcess, port: str
) -> None:
    """The relay holds a connection the server authenticated, but not its session key: its
    request (release the map outputs / read a stream / register a map) is refused unsealed."""
    client, pid = stage(agent)
    try:
        body = valid_request(port, agent)
        if port == "data":
            body = json.dumps({"partition": pid.to_wire(), "subpartition": 0}).encode()
        relay = Relay(agent.address[port], _forge(REQUEST[port], body, value=2))
        victim = _victim(port, relay.address)
        code, message = relay.wait()
        victim.close()
        assert (code, "not sealed" in message) == (ErrorCode.AUTHENTICATION, True), message
        assert Path(agent.info["path"]).exists()  # no release ran
        assert read_stream(agent, pid) == ROWS  # no stream was taken
        found = rendezvous_client.locate(agent.address["rendezvous"], SECRET, 5, 0, 0.0)
        assert all(m["host"] != "evil" for m in found)  # no map was registered
    finally:
        client.close()
    real_client_served(agent, port)


@pytest.mark.parametrize("tamper", ["replay", "rewrite"])
def test_a_relayed_request_cannot_be_replayed_or_rewritten(agent: AgentProcess, tamper: str) -> None:
    """The relay passes the victim's sealed ``metrics`` call through, then replays it (same seal
    and number) or keeps the seal and rewrites the body into a ``release``: both refused."""

    def inject(up: TcpConnection, seen: list[tuple[FrameHeader, bytes]]) -> object:
        header, payload = seen[1]
        if tamper == "rewrite":
            body = json.dumps({"op": "release", "args": {"shuffle": 3}}).encode()
            payload = payload[:SEAL_SIZE] + body
            up.send(header.kind, payload, seq=header.seq, value=header.value)
        else:
            up.send(header.kind, payload, seq=header.seq, value=header.value)
        return _refusal(up)

    relay = Relay(agent.address["control"], inject, relay_after=1)
    with ControlClient(relay.address, SECRET, AGENT_CONTROL) as victim:
        assert "shuffle_streams_open" in victim.call("metrics")
        code, message = relay.wait()
    assert code == ErrorCode.AUTHENTICATION
    assert ("replayed or reordered" if tamper == "replay" else "not sealed") in message
    assert Path(agent.info["path"]).exists()
    real_client_served(agent, "control")


# -- 20 silent + 20 dripping connections held while real clients are served ------------------------
@pytest.mark.parametrize("port", PORTS)
def test_real_clients_are_served_while_40_connections_besiege_the_port(
    agent: AgentProcess, port: str
) -> None:
    before = agent.refused(port, "handshake-deadline")
    logged = len(agent.log_lines(f"{LOGGER[port]} refused (handshake-deadline)"))
    with Siege(agent.address[port], silent=20, dripping=20, interval_s=0.5) as siege:
        assert siege.wait_full()
        for _ in range(3):
            real_client_served(agent, port)
            assert siege.open_now() >= 30  # the siege is on while the real client is served
        # Every besieging connection is cut off at the deadline (and reopened by the siege).
        assert agent.wait_refused(port, "handshake-deadline", before + 40)
        # The siege sees a close on its next poll, which a loaded machine delays: wait for it
        # while the siege runs (leaving the block stops it, and it counts no more).
        assert wait_until(lambda: siege.stats.closed_by_server >= 40, 30), siege.stats
    assert siege.stats.refused_connect == 0
    assert agent.refusals(port).get("pending-limit", 0) == 0  # 40 < the cap of 64
    # 40+ refusals, at most one more log line (the rate limit: one line a minute per cause).
    assert len(agent.log_lines(f"{LOGGER[port]} refused (handshake-deadline)")) - logged <= 1
    assert len(agent.log_lines(f"{LOGGER[port]} refused (handshake-deadline)")) >= 1


def test_nothing_was_written_by_the_attacks(agent: AgentProcess) -> None:
    """The agent's folder holds the one map output it wrote itself, nothing else."""
    folder = Path(agent.info["path"]).parent.parent
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert written == ["s3/m0.arrows"]
    assert (
        sum(b.num_rows for b in read_segments(agent.info["path"], agent.info["segments"], schema=SCHEMA))
        == ROWS
    )


def test_a_stage_request_with_garbage_for_a_schema_is_refused(agent: AgentProcess) -> None:
    """Bytes that must be an Arrow IPC schema are parsed as one (size-capped), nothing else."""
    with ControlClient(agent.address["control"], SECRET, AGENT_CONTROL) as client:
        with pytest.raises(ControlMessageError, match=r"refused 'stage'.*not an Arrow IPC schema"):
            client.call("stage", shuffle=3, reducer=0, schema=pickle_payload(Path("x")), files=[])
        assert "shuffle_streams_open" in client.call("metrics")  # a refused request, not a broken link
