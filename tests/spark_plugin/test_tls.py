"""TLS material and settings (issue 13, item 3, first part): the generated, pinned certificate and
configured PEM files, the SSL contexts and gRPC credentials built from them, tried over real
sockets and a real gRPC server on 127.0.0.1; the ``spark.arrowbeat.ssl.*`` checks name their keys
and no message or ``repr`` shows a key."""

from __future__ import annotations

import datetime
import os
import re
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from arrowbeat_base.clock import ManualClock
from spark_plugin.jvm.sidecar import secret_values
from spark_plugin.settings import tls
from spark_plugin.settings.config import ArrowBeatConfig, ConfigError, load
from spark_plugin.settings.tls import TlsMaterial

IO_TIMEOUT_S = 10.0
ON = {"spark.arrowbeat.ssl.enabled": "true"}


@pytest.fixture(scope="module")
def material() -> TlsMaterial:
    return tls.generate_self_signed()


@pytest.fixture(scope="module")
def other() -> TlsMaterial:
    return tls.generate_self_signed()


def _key_body(m: TlsMaterial) -> str:
    """The base64 inside the key's PEM, as one string: what must never show anywhere."""
    return tls.encode_line(m.private_key_pem, tls.KEY_LABEL)


# --- generation ----------------------------------------------------------------------------------


def test_the_generated_certificate_names_arrowbeat_and_lives_from_an_hour_ago_without_end() -> None:
    """Issue 24: valid to RFC 5280's "no expiration" date, not 30 days (then every new connection
    of an application running longer failed)."""
    clock = ManualClock(wall_start=1_800_000_000.0)
    m = tls.generate_self_signed(clock)
    cert = x509.load_pem_x509_certificate(m.cert_chain_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["arrowbeat"]
    assert cert.not_valid_before_utc.timestamp() == 1_800_000_000 - 3600
    assert cert.not_valid_after_utc == datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    assert m.generated and m.server_name == "arrowbeat" and m.trusted_pem == m.cert_chain_pem


def test_two_generated_certificates_differ(material: TlsMaterial, other: TlsMaterial) -> None:
    assert material.fingerprint() != other.fingerprint()
    assert material.private_key_pem != other.private_key_pem


def test_the_repr_shows_the_fingerprint_never_the_key(material: TlsMaterial) -> None:
    for text in (repr(material), str(material), f"{material}"):
        assert "<redacted>" in text and material.fingerprint()[:16] in text
        assert "PRIVATE KEY" not in text and _key_body(material)[30:60] not in text
    broken = TlsMaterial(b"not a certificate", material.private_key_pem, b"")
    assert "<redacted>" in repr(broken) and "PRIVATE KEY" not in repr(broken)


# --- over a real socket --------------------------------------------------------------------------


def _serve_once(context: ssl.SSLContext) -> tuple[int, threading.Thread, list[object]]:
    """A loopback listener that TLS-accepts one connection and echoes 5 bytes; what happened on
    the server side lands in the returned list (the echoed bytes, or the exception)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(IO_TIMEOUT_S)
    outcome: list[object] = []

    def run() -> None:
        try:
            raw, _ = listener.accept()
            raw.settimeout(IO_TIMEOUT_S)
            with context.wrap_socket(raw, server_side=True) as conn:
                data = conn.recv(5)
                conn.sendall(data)
                outcome.append(data)
        except (OSError, ssl.SSLError) as exc:
            outcome.append(exc)
        finally:
            listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread, outcome


def _call(port: int, context: ssl.SSLContext, server_name: str) -> bytes:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as conn,
    ):
        conn.sendall(b"hello")
        return conn.recv(5)


def test_a_round_trip_over_loopback_with_the_generated_material(material: TlsMaterial) -> None:
    port, thread, outcome = _serve_once(tls.server_context(material))
    assert _call(port, tls.client_context(material), material.server_name) == b"hello"
    thread.join(IO_TIMEOUT_S)
    assert outcome == [b"hello"]


def _generated_days_ago(days: int) -> TlsMaterial:
    """Material the driver-side process generated ``days`` ago, as a process of that application
    loads it now from the handed-over keys (a new executor's agent, a restarted RM): the clock is
    moved back for the generation, so the real handshakes below run at simulated day ``days``."""
    clock = ManualClock(wall_start=time.time() - days * 86400.0)
    handed = tls.internal_settings(tls.generate_self_signed(clock))
    loaded = tls.from_config(load({**ON, **handed}))  # checked by an in-memory handshake too
    assert loaded is not None and loaded.generated
    return loaded


@pytest.mark.parametrize("days", [31, 90])
def test_generated_material_still_connects_on_simulated_day(days: int) -> None:
    m = _generated_days_ago(days)
    port, thread, outcome = _serve_once(tls.server_context(m))
    assert _call(port, tls.client_context(m), m.server_name) == b"hello"
    thread.join(IO_TIMEOUT_S)
    assert outcome == [b"hello"]


def test_a_client_pinned_to_another_certificate_refuses_the_server(
    material: TlsMaterial, other: TlsMaterial
) -> None:
    port, thread, outcome = _serve_once(tls.server_context(material))
    with pytest.raises(ssl.SSLCertVerificationError, match="certificate verify failed"):
        _call(port, tls.client_context(other), "arrowbeat")
    thread.join(IO_TIMEOUT_S)
    assert len(outcome) == 1 and isinstance(outcome[0], ssl.SSLError)  # the server got no data


def test_a_client_checks_the_name_not_just_the_trust(material: TlsMaterial) -> None:
    port, thread, _ = _serve_once(tls.server_context(material))
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        _call(port, tls.client_context(material), "localhost")
    thread.join(IO_TIMEOUT_S)


def test_a_plaintext_client_gets_no_answer(material: TlsMaterial) -> None:
    """A client that skips TLS (an old agent, a port scanner) is refused by the handshake."""
    port, thread, outcome = _serve_once(tls.server_context(material))
    with socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S) as raw:
        raw.sendall(b"hello" * 20)
        try:
            reply = raw.recv(100)  # a TLS alert at most
        except ConnectionResetError:
            reply = b""
    thread.join(IO_TIMEOUT_S)
    assert b"hello" not in reply
    assert len(outcome) == 1 and isinstance(outcome[0], ssl.SSLError)


def test_the_contexts_refuse_anything_below_tls_1_2_and_ask_no_client_certificate(
    material: TlsMaterial,
) -> None:
    server, client = tls.server_context(material), tls.client_context(material)
    assert server.minimum_version == client.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server.verify_mode == ssl.CERT_NONE
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert client.cert_store_stats()["x509_ca"] + client.cert_store_stats()["x509"] == 1  # pinned: one cert


def test_an_old_protocol_client_is_refused(material: TlsMaterial) -> None:
    port, thread, outcome = _serve_once(tls.server_context(material))
    old = tls.client_context(material)
    old.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    with pytest.raises(ssl.SSLError):
        _call(port, old, "arrowbeat")
    thread.join(IO_TIMEOUT_S)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError)


def _server_first_flight(m: TlsMaterial) -> bytes:
    """What a real server answers to a client's hello, captured in memory."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = tls.client_context(m).wrap_bio(c_in, c_out, server_hostname=m.server_name)
    server = tls.server_context(m).wrap_bio(s_in, s_out, server_side=True)
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    s_in.write(c_out.read())
    with pytest.raises(ssl.SSLWantReadError):
        server.do_handshake()
    return s_out.read()


def test_a_slow_drip_server_cannot_stretch_a_handshake_past_its_deadline(material: TlsMaterial) -> None:
    """The contract the transports build on: ``settimeout(remaining)`` before ``do_handshake()``
    bounds the whole handshake, not each read (a valid server flight, one byte every 50 ms,
    would take ~40 s). Kernel-side SO_RCVTIMEO does not: Python's ssl retries a blocking read."""
    flight = _server_first_flight(material)
    ours, theirs = socket.socketpair()
    stop = threading.Event()

    def drip() -> None:
        theirs.recv(4096)
        for i in range(len(flight)):
            if stop.wait(0.05):
                return
            try:
                theirs.send(flight[i : i + 1])
            except OSError:
                return

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    conn = tls.client_context(material).wrap_socket(
        ours, server_hostname=material.server_name, do_handshake_on_connect=False
    )
    conn.settimeout(0.5)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            conn.do_handshake()
        assert time.monotonic() - started < 5.0
    finally:
        stop.set()
        conn.close()
        theirs.close()
        dripper.join(IO_TIMEOUT_S)


# --- gRPC ----------------------------------------------------------------------------------------


def _echo_server(m: TlsMaterial) -> tuple[grpc.Server, int]:
    """A real gRPC server on 127.0.0.1 with ``m``'s credentials; a unary method echoes bytes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    echo = grpc.unary_unary_rpc_method_handler(lambda request, _context: request)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {"Echo": echo}),))
    port = server.add_secure_port("127.0.0.1:0", tls.grpc_server_credentials(m))
    server.start()
    return server, port


@pytest.fixture
def grpc_server(material: TlsMaterial) -> Iterator[int]:
    server, port = _echo_server(material)
    try:
        yield port
    finally:
        server.stop(grace=None).wait(IO_TIMEOUT_S)


def _echo(channel: grpc.Channel) -> bytes:
    method: Callable[..., bytes] = channel.unary_unary("/test.Echo/Echo", None, None)
    return method(b"ping", timeout=IO_TIMEOUT_S)


def test_a_grpc_call_over_tls_completes(material: TlsMaterial, grpc_server: int) -> None:
    target = f"127.0.0.1:{grpc_server}"
    with grpc.secure_channel(
        target, tls.grpc_channel_credentials(material), options=tls.grpc_channel_options(material)
    ) as channel:
        assert _echo(channel) == b"ping"


@pytest.mark.parametrize("days", [31, 90])
def test_a_grpc_call_over_tls_completes_on_simulated_day(days: int) -> None:
    m = _generated_days_ago(days)
    server, port = _echo_server(m)
    try:
        with grpc.secure_channel(
            f"127.0.0.1:{port}", tls.grpc_channel_credentials(m), options=tls.grpc_channel_options(m)
        ) as channel:
            assert _echo(channel) == b"ping"
    finally:
        server.stop(grace=None).wait(IO_TIMEOUT_S)


def test_a_grpc_client_trusting_another_certificate_fails(
    material: TlsMaterial, other: TlsMaterial, grpc_server: int
) -> None:
    target = f"127.0.0.1:{grpc_server}"
    credentials, options = tls.grpc_channel_credentials(other), tls.grpc_channel_options(other)
    with (
        grpc.secure_channel(target, credentials, options=options) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        _echo(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_grpc_client_without_the_name_override_fails(material: TlsMaterial, grpc_server: int) -> None:
    target, credentials = f"127.0.0.1:{grpc_server}", tls.grpc_channel_credentials(material)
    with grpc.secure_channel(target, credentials) as channel, pytest.raises(grpc.RpcError) as info:
        _echo(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_plaintext_grpc_client_fails(grpc_server: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server}") as channel, pytest.raises(grpc.RpcError) as info:
        _echo(channel)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_grpc_name_override_is_the_servers_name(material: TlsMaterial) -> None:
    assert tls.grpc_channel_options(material) == [("grpc.ssl_target_name_override", "arrowbeat")]


# --- handing the generated material over ---------------------------------------------------------


def test_generated_material_travels_as_two_single_line_settings(material: TlsMaterial) -> None:
    handed = tls.internal_settings(material)
    assert set(handed) == {"spark.arrowbeat.ssl.generatedCert", "spark.arrowbeat.ssl.generatedKeySecret"}
    for value in handed.values():
        assert value.isascii() and value.isprintable() and " " not in value and "\n" not in value
        assert len(value) <= 600  # what the JVM must accept per value
    received = tls.from_config(load({**ON, **handed}))
    assert received is not None
    assert received.generated and received.fingerprint() == material.fingerprint()
    assert received.private_key_pem == material.private_key_pem
    assert received.trusted_pem == received.cert_chain_pem  # pinned


def test_the_ready_fields_carry_the_same_values_under_protocol_names(material: TlsMaterial) -> None:
    fields = tls.ready_fields(material)
    assert set(fields) == {"ssl_cert", "ssl_key_secret"}
    assert all(re.fullmatch(r"[a-z_]{1,32}", name) for name in fields)  # the JVM's ready-key form
    handed = tls.internal_settings(material)
    assert {tls.READY_FIELDS[name]: value for name, value in fields.items()} == handed
    assert len(fields["ssl_cert"]) < 700 and len(fields["ssl_key_secret"]) < 200  # sizes the JVM must take


def test_the_handed_key_is_redacted_by_its_name(material: TlsMaterial) -> None:
    """Spark's default spark.redaction.regex and the log filters of both sides match ``secret``."""
    handed = tls.internal_settings(material)
    assert handed["spark.arrowbeat.ssl.generatedKeySecret"] in secret_values(handed)


def test_configured_material_is_not_handed_over(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    m = tls.from_config(_config(chain, key))
    assert m is not None and not m.generated and tls.internal_settings(m) == {} and tls.ready_fields(m) == {}


def test_single_line_encoding_round_trips_and_refuses_garbage(material: TlsMaterial) -> None:
    line = tls.encode_line(material.cert_chain_pem, tls.CERT_LABEL)
    again = tls.decode_line(line, tls.CERT_LABEL)
    assert x509.load_pem_x509_certificate(again) == x509.load_pem_x509_certificate(material.cert_chain_pem)
    for bad in ("", "not base64!", "QUJD\nREVG", "QUJD=="):
        with pytest.raises(ValueError) as info:
            tls.decode_line(bad, tls.KEY_LABEL)
        assert bad not in str(info.value) or not bad
    with pytest.raises(ValueError):
        tls.encode_line(material.cert_chain_pem * 2, tls.CERT_LABEL)  # one block only
    with pytest.raises(ValueError):
        tls.encode_line(material.private_key_pem, tls.CERT_LABEL)


def test_off_means_no_material_and_executors_never_generate() -> None:
    assert tls.from_config(load({})) is None
    with pytest.raises(ConfigError) as info:
        tls.from_config(load(ON))
    assert "spark.arrowbeat.ssl.generatedCert" in str(info.value)
    made = tls.from_config(load(ON), may_generate=True)
    assert made is not None and made.generated


def test_a_corrupt_handed_key_is_named_and_not_shown(material: TlsMaterial, other: TlsMaterial) -> None:
    handed = tls.internal_settings(material)
    wrong = {
        **handed,
        "spark.arrowbeat.ssl.generatedKeySecret": tls.internal_settings(other)[
            "spark.arrowbeat.ssl.generatedKeySecret"
        ],
    }
    with pytest.raises(ConfigError) as info:
        tls.from_config(load({**ON, **wrong}))
    text = str(info.value)
    assert "generatedKeySecret" in text
    assert _key_body(other)[20:60] not in text and _key_body(material)[20:60] not in text


# --- configuration checks ------------------------------------------------------------------------


def _problems(settings: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as info:
        load({**ON, **settings})
    return "\n".join(info.value.problems)


def test_key_and_chain_go_together(tmp_path: Path) -> None:
    present = tmp_path / "chain.pem"
    present.write_text("x")
    text = _problems({"spark.arrowbeat.ssl.certChain": str(present)})
    assert "spark.arrowbeat.ssl.privateKey and spark.arrowbeat.ssl.certChain must be set together" in text


def test_unreadable_and_odd_files_are_named(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = _problems(
        {
            "spark.arrowbeat.ssl.certChain": str(tmp_path / "missing.pem"),
            "spark.arrowbeat.ssl.privateKey": str(fifo),
        }
    )
    assert f"spark.arrowbeat.ssl.certChain='{tmp_path / 'missing.pem'}': cannot read the file" in text
    assert f"spark.arrowbeat.ssl.privateKey='{fifo}': not a regular file" in text


def test_a_trust_store_or_server_name_without_a_chain_is_refused(tmp_path: Path) -> None:
    bundle = tmp_path / "trust.pem"
    bundle.write_text("x")
    text = _problems({"spark.arrowbeat.ssl.trustStore": str(bundle), "spark.arrowbeat.ssl.serverName": "a.b"})
    assert "spark.arrowbeat.ssl.trustStore is set without spark.arrowbeat.ssl.certChain" in text
    assert "spark.arrowbeat.ssl.serverName is set without spark.arrowbeat.ssl.certChain" in text


@pytest.mark.parametrize("name", ["*.example.com", "a b", "-x.org", "a..b", "x" * 254])
def test_a_server_name_must_be_a_plain_dns_name(name: str) -> None:
    assert "spark.arrowbeat.ssl.serverName=" in _problems({"spark.arrowbeat.ssl.serverName": name})


def test_the_handed_values_are_never_shown(material: TlsMaterial) -> None:
    key_line = tls.internal_settings(material)["spark.arrowbeat.ssl.generatedKeySecret"]
    text = _problems({"spark.arrowbeat.ssl.generatedKeySecret": key_line + "!"})
    assert "spark.arrowbeat.ssl.generatedKeySecret=<redacted>" in text
    assert key_line[:40] not in text
    assert "must be handed over together" in _problems({"spark.arrowbeat.ssl.generatedKeySecret": key_line})


def test_the_config_repr_hides_the_handed_material(material: TlsMaterial) -> None:
    config = load({**ON, **tls.internal_settings(material)})
    for value in tls.internal_settings(material).values():
        assert value[:40] not in repr(config)
    assert "ssl_enabled=True" in repr(config)


def test_ssl_keys_are_not_checked_while_tls_is_off(tmp_path: Path) -> None:
    config = load({"spark.arrowbeat.ssl.certChain": str(tmp_path / "missing.pem")})
    assert isinstance(config, ArrowBeatConfig) and tls.from_config(config) is None


# --- configured files ----------------------------------------------------------------------------

NOW = datetime.datetime.now(datetime.UTC)


def _leaf(
    dns: list[str],
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None = None,
    *,
    not_after: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node")])
    issuer_name, issuer_key = issuer or (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=2))
        .not_valid_after(not_after or NOW + datetime.timedelta(days=2))
    )
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test ca")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(days=2))
        .not_valid_after(NOW + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, encryption
    )


def _write_pair(
    directory: Path, pair: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], *extra: x509.Certificate
) -> tuple[Path, Path]:
    chain, key = directory / "chain.pem", directory / "key.pem"
    chain.write_bytes(b"# a comment line\n" + _pem(pair[0], *extra))
    key.write_bytes(_key_pem(pair[1]))
    key.chmod(0o600)
    return chain, key


def _config(chain: Path, key: Path, **extra: str) -> ArrowBeatConfig:
    settings = {**ON, "spark.arrowbeat.ssl.certChain": str(chain), "spark.arrowbeat.ssl.privateKey": str(key)}
    settings.update({f"spark.arrowbeat.ssl.{k}": v for k, v in extra.items()})
    return load(settings)


def _round_trip(m: TlsMaterial) -> None:
    port, thread, outcome = _serve_once(tls.server_context(m))
    assert _call(port, tls.client_context(m), m.server_name) == b"hello"
    thread.join(IO_TIMEOUT_S)
    assert outcome == [b"hello"]


def test_a_configured_self_signed_certificate_is_pinned(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["node1.example.com", "arrowbeat"]))
    m = tls.from_config(_config(chain, key))
    assert m is not None and m.server_name == "arrowbeat"
    assert b"comment" not in m.cert_chain_pem and m.trusted_pem == m.cert_chain_pem
    _round_trip(m)


def test_a_ca_issued_wildcard_certificate_with_a_trust_store(tmp_path: Path) -> None:
    ca = _ca()
    leaf = _leaf(["*.example.com"], (ca[0].subject, ca[1]))
    chain, key = _write_pair(tmp_path, leaf, ca[0])
    trust = tmp_path / "trust.pem"
    trust.write_bytes(_pem(ca[0]))
    m = tls.from_config(_config(chain, key, trustStore=str(trust)))
    assert m is not None and m.server_name == "arrowbeat.example.com"
    _round_trip(m)
    server = _echo_server(m)
    try:
        options = tls.grpc_channel_options(m)
        with grpc.secure_channel(
            f"127.0.0.1:{server[1]}", tls.grpc_channel_credentials(m), options=options
        ) as ch:
            assert _echo(ch) == b"ping"
    finally:
        server[0].stop(grace=None).wait(IO_TIMEOUT_S)


def test_a_ca_issued_leaf_alone_is_pinned_without_a_trust_store(tmp_path: Path) -> None:
    ca = _ca()
    chain, key = _write_pair(tmp_path, _leaf(["node.example.com"], (ca[0].subject, ca[1])), ca[0])
    m = tls.from_config(_config(chain, key, serverName="node.example.com"))
    assert m is not None and m.trusted_pem == _pem(x509.load_pem_x509_certificates(m.cert_chain_pem)[0])
    _round_trip(m)


def test_a_key_of_another_certificate_is_named(tmp_path: Path) -> None:
    chain, _ = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    stranger = tmp_path / "stranger.pem"
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger.write_bytes(_key_pem(stranger_key))
    with pytest.raises(ConfigError) as info:
        tls.from_config(_config(chain, stranger))
    assert "is not the key of the first certificate in spark.arrowbeat.ssl.certChain" in str(info.value)
    assert _key_pem(stranger_key).decode().splitlines()[1] not in str(info.value)


def test_a_trust_store_that_does_not_trust_the_certificate_is_named(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    trust = tmp_path / "trust.pem"
    trust.write_bytes(_pem(_ca()[0]))
    with pytest.raises(ConfigError) as info:
        tls.from_config(_config(chain, key, trustStore=str(trust)))
    assert "spark.arrowbeat.ssl.trustStore" in str(info.value) and "refuses" in str(info.value)


def test_a_server_name_the_certificate_does_not_carry_is_named(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    with pytest.raises(ConfigError) as info:
        tls.from_config(_config(chain, key, serverName="elsewhere.example.com"))
    assert "spark.arrowbeat.ssl.serverName" in str(info.value) and "mismatch" in str(info.value)


def test_a_certificate_without_dns_names_is_named(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf([]))
    with pytest.raises(ConfigError, match=r"ssl\.certChain=.*no DNS subjectAltName"):
        tls.from_config(_config(chain, key))


def test_an_expired_certificate_is_named(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"], not_after=NOW - datetime.timedelta(days=1)))
    with pytest.raises(ConfigError, match=r"ssl\.certChain=.*expired on"):
        tls.from_config(_config(chain, key))


def test_a_configured_certificate_close_to_its_expiry_is_named_in_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"], not_after=NOW + datetime.timedelta(days=10)))
    with caplog.at_level("WARNING", logger="arrowbeat.tls"):
        m = tls.from_config(_config(chain, key))
    assert m is not None  # still loads: it works until then
    [warning] = [r.getMessage() for r in caplog.records if "expires on" in r.getMessage()]
    assert "spark.arrowbeat.ssl.certChain=" in warning and "certificate 1 of 1" in warning
    assert re.search(r"in (9\.9|10\.0) days", warning), warning
    caplog.clear()
    later = tmp_path / "later"
    later.mkdir()
    chain, key = _write_pair(later, _leaf(["arrowbeat"], not_after=NOW + datetime.timedelta(days=60)))
    with caplog.at_level("WARNING", logger="arrowbeat.tls"):
        assert tls.from_config(_config(chain, key)) is not None
    assert not [r for r in caplog.records if "expire" in r.getMessage()]


def test_a_trust_anchor_close_to_its_expiry_is_named_too(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = _ca()  # valid two more days
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"], (ca[0].subject, ca[1])))
    trust = tmp_path / "trust.pem"
    trust.write_bytes(_pem(ca[0]))
    with caplog.at_level("WARNING", logger="arrowbeat.tls"):
        assert tls.from_config(_config(chain, key, trustStore=str(trust))) is not None
    warnings_seen = [r.getMessage() for r in caplog.records if "expires on" in r.getMessage()]
    assert any(w.startswith("spark.arrowbeat.ssl.trustStore=") for w in warnings_seen), warnings_seen


def test_an_encrypted_or_garbage_key_is_named_and_not_shown(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    real = _leaf(["arrowbeat"])[1]
    key.write_bytes(_key_pem(real, b"pass phrase"))
    with pytest.raises(ConfigError, match="the key is encrypted"):
        tls.from_config(_config(chain, key))
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nQUJDREVGR0hJSg==\n-----END PRIVATE KEY-----\n")
    with pytest.raises(ConfigError) as info:
        tls.from_config(_config(chain, key))
    assert "holds no readable PEM private key" in str(info.value) and "QUJDREVG" not in str(info.value)


def test_a_chain_file_without_certificates_is_named(tmp_path: Path) -> None:
    chain, key = _write_pair(tmp_path, _leaf(["arrowbeat"]))
    chain.write_text("nothing here\n")
    with pytest.raises(ConfigError, match=r"ssl\.certChain=.*holds no readable PEM certificate"):
        tls.from_config(_config(chain, key))


# --- the key's way into OpenSSL ------------------------------------------------------------------


def test_the_key_goes_through_memory_where_linux_allows(material: TlsMaterial) -> None:
    with tls._material_file(b"data") as path:
        assert path.startswith("/proc/self/fd/")
        assert Path(path).read_bytes() == b"data"


def test_without_memfd_the_key_file_is_private_and_removed(
    material: TlsMaterial, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    with tls._material_file(b"data") as path:
        seen = Path(path)
        assert stat.S_IMODE(seen.stat().st_mode) == 0o600
        assert stat.S_IMODE(seen.parent.stat().st_mode) == 0o700
        assert seen.read_bytes() == b"data"
    assert not seen.exists() and not seen.parent.exists()
    _round_trip(material)  # contexts still build on the fallback path


def test_importing_tls_loads_neither_grpc_nor_cryptography() -> None:
    """Shuffle tasks and agents without TLS import the module for nothing more than a None."""
    code = (
        "import sys, spark_plugin.settings.tls\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'cryptography'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
