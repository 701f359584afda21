"""TLS for arrowbeat (``spark.arrowbeat.ssl.*``): the certificate, its key and what clients trust,
and the SSL contexts and gRPC credentials built from them.

Two sources, as in Spark (``spark.ssl.rpc.*``) and Flink (``security.ssl.internal.*``):

- **configured PEM files** (``ssl.certChain``, ``ssl.privateKey``, optionally ``ssl.trustStore``),
  present on the driver and on every executor host;
- by default a **self-signed certificate generated per application** by the driver-side process
  (:func:`generate_self_signed`) and **pinned**: it reaches the executors the way the secret does
  (the JVM's settings on stdin, as the internal keys ``ssl.generatedCert`` and
  ``ssl.generatedKeySecret``, see :func:`internal_settings`), and clients trust that one
  certificate and nothing else, so a port squatter without the key fails the TLS handshake before
  it sees a byte of the authentication that follows.

Clients check the server's certificate against a fixed *server name* (:attr:`TlsMaterial.server_name`,
``arrowbeat`` for the generated certificate, see ``spark.arrowbeat.ssl.serverName``), not against
the host they dial: agents are reached by IP address as often as by name, and the pinned trust
(not the host name) is what identifies the application's servers. Servers ask no client
certificate: the secret's HMAC handshake, run inside TLS, authenticates clients.

Nothing here logs, formats or raises with key bytes. Python's ``ssl`` loads a key only from a path,
so :func:`server_context` hands it over through an anonymous in-memory file (Linux ``memfd``),
else through a 0600 file created with ``O_EXCL | O_NOFOLLOW`` in a fresh 0700 directory and
removed right after loading.

Layer 1 (plugin foundation): imports only the config, the errors and the clock. The heartbeat
library and the engine take the plain values built here (an ``ssl.SSLContext`` and the server
name, gRPC credentials and channel options) as parameters. ``cryptography`` and ``grpc`` are
imported when first needed, so a process without TLS loads neither.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime
import hashlib
import logging
import os
import re
import ssl
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.errors import ConfigError
from spark_plugin.settings.config import ArrowBeatConfig, key_of

if TYPE_CHECKING:
    import grpc
    from cryptography import x509

log = logging.getLogger("arrowbeat.tls")

SERVER_NAME = "arrowbeat"
"""The DNS subjectAltName of the generated certificate, and the name clients require of it."""
GENERATED_NOT_AFTER = datetime.datetime(9999, 12, 31, 23, 59, 59, tzinfo=datetime.UTC)
"""End of a generated certificate's validity: RFC 5280's "no well-defined expiration date"
(section 4.1.2.5), so it lives as long as its application, however many months that runs (a
streaming query): an expiry would refuse every reconnect, new agent, restarted RM and new shuffle
connection from then on. Nothing is lost by it: the certificate and its key are made per
application, reach other hosts only the way the secret does, and clients trust them pinned, only
for that application's life; when it ends, nobody trusts them any more, expired or not."""
EXPIRY_WARNING_S = 30 * 86400.0
"""A configured certificate that expires within this long is named in a warning at start-up (an
application that runs past that date cannot connect any more); an expired one is refused."""
BACKDATE_S = 3600.0
"""A generated certificate is valid from this long before its creation: executor clocks may lag."""
MAX_PEM_FILE_BYTES = 1 << 20
"""A configured PEM file larger than this is refused (a trust bundle is some hundred KiB)."""

CERT_LABEL = "CERTIFICATE"
KEY_LABEL = "PRIVATE KEY"
# The ``spark.arrowbeat.ssl.*`` keys, as the key table declares them (named here for messages).
ENABLED_KEY = key_of("ssl_enabled")
PRIVATE_KEY_KEY = key_of("ssl_private_key")
CERT_CHAIN_KEY = key_of("ssl_cert_chain")
TRUST_STORE_KEY = key_of("ssl_trust_store")
SERVER_NAME_KEY = key_of("ssl_server_name")
GENERATED_CERT_KEY = key_of("ssl_generated_cert")
GENERATED_KEY_KEY = key_of("ssl_generated_key")
GRPC_TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"
READY_FIELDS = {"ssl_cert": GENERATED_CERT_KEY, "ssl_key_secret": GENERATED_KEY_KEY}
"""Ready-line field of the driver-side process -> the internal key the JVM files its value under.
The key's field name says ``secret`` so a name-based redactor on the JVM side can match it."""


@dataclass(frozen=True, repr=False)
class TlsMaterial:
    """What a process needs for TLS: its certificate chain and key (to serve) and the certificates
    it trusts (to connect), all PEM; ``repr``/``str`` show the certificate's fingerprint, never the
    key."""

    cert_chain_pem: bytes
    """The server's certificate first, then any intermediates."""
    private_key_pem: bytes
    """Unencrypted PKCS#8 PEM; never logged, formatted or written to a lasting file."""
    trusted_pem: bytes
    """Every certificate a client accepts as an anchor (the pinned certificate by default)."""
    server_name: str = SERVER_NAME
    """The DNS name clients require in the server's certificate, whatever host they dial."""
    generated: bool = False
    """Generated by the driver-side process; then :func:`internal_settings` hands it over."""

    def fingerprint(self) -> str:
        """SHA-256 of the server certificate (DER), hex: safe to log, and what ``openssl x509
        -fingerprint -sha256`` prints (without colons)."""
        return hashlib.sha256(ssl.PEM_cert_to_DER_cert(_first_block(self.cert_chain_pem))).hexdigest()

    def __repr__(self) -> str:
        try:
            shown = f"{self.fingerprint()[:16]}..."
        except ValueError:  # a repr must not raise, whatever a caller built
            shown = "?"
        return (
            f"TlsMaterial(server_name={self.server_name!r}, generated={self.generated}, "
            f"cert_sha256={shown}, private_key=<redacted>)"
        )

    __str__ = __repr__


# --- generation ----------------------------------------------------------------------------------


def generate_self_signed(clock: Clock = SYSTEM_CLOCK) -> TlsMaterial:
    """A fresh EC P-256 key and a self-signed certificate for it, named ``DNS:arrowbeat``, valid
    from an hour before ``clock.time()`` with no end (:data:`GENERATED_NOT_AFTER`). It is no CA
    (it can sign nothing) and trusts only itself: the returned material pins it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.fromtimestamp(clock.time(), tz=datetime.UTC).replace(microsecond=0)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(seconds=BACKDATE_S))
        .not_valid_after(GENERATED_NOT_AFTER)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return TlsMaterial(cert_pem, key_pem, cert_pem, SERVER_NAME, generated=True)


# --- the single-line form of the internal keys ---------------------------------------------------


def _pem_blocks(pem: bytes, label: str) -> list[str]:
    text = pem.decode("ascii", "strict")
    pattern = rf"-----BEGIN {label}-----\r?\n([A-Za-z0-9+/=\r\n]+?)-----END {label}-----"
    return [re.sub(r"\s+", "", body) for body in re.findall(pattern, text)]


def _first_block(pem: bytes) -> str:
    blocks = _pem_blocks(pem, CERT_LABEL)
    if not blocks:
        raise ValueError("no PEM certificate")
    return f"-----BEGIN {CERT_LABEL}-----\n{blocks[0]}\n-----END {CERT_LABEL}-----\n"


def encode_line(pem: bytes, label: str) -> str:
    """One PEM block (``label`` is ``CERTIFICATE`` or ``PRIVATE KEY``) as one line: the base64 of
    its DER, the form of the internal keys and of the settings line the JVM writes. Raises
    ``ValueError`` (without the content) unless ``pem`` is exactly one such block."""
    try:
        blocks = _pem_blocks(pem, label)
    except UnicodeDecodeError:
        blocks = []
    if len(blocks) != 1:
        raise ValueError(f"expected exactly one PEM {label} block")
    return base64.b64encode(base64.b64decode(blocks[0], validate=True)).decode("ascii")


def decode_line(line: str, label: str) -> bytes:
    """The PEM block :func:`encode_line` made ``line`` of. Raises ``ValueError`` (without the
    content) for anything but strict base64."""
    try:
        der = base64.b64decode(line.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        der = b""
    if not der or base64.b64encode(der).decode("ascii") != line:  # one canonical form only
        raise ValueError(f"not one line of canonical base64 (a DER {label})")
    body = "".join(f"{line[i : i + 64]}\n" for i in range(0, len(line), 64))  # PEM's 64 columns
    return f"-----BEGIN {label}-----\n{body}-----END {label}-----\n".encode("ascii")


def internal_settings(material: TlsMaterial) -> dict[str, str]:
    """The internal keys that carry generated material to the executors (``{}`` for configured
    files, which every host reads itself). The key's value is as secret as the application secret."""
    if not material.generated:
        return {}
    return {
        GENERATED_CERT_KEY: encode_line(material.cert_chain_pem, CERT_LABEL),
        GENERATED_KEY_KEY: encode_line(material.private_key_pem, KEY_LABEL),
    }


def ready_fields(material: TlsMaterial) -> dict[str, str]:
    """:func:`internal_settings` under the ready line's field names (:data:`READY_FIELDS`): what the
    driver-side process announces to the JVM after generating (``{}`` for configured files)."""
    handed = internal_settings(material)
    return {field: handed[key] for field, key in READY_FIELDS.items() if key in handed}


# --- loading -------------------------------------------------------------------------------------


def from_config(
    config: ArrowBeatConfig, *, may_generate: bool = False, clock: Clock = SYSTEM_CLOCK
) -> TlsMaterial | None:
    """This process's TLS material, or None when ``spark.arrowbeat.ssl.enabled`` is false.

    Configured files win; else the generated material handed over in the internal keys; else,
    only if ``may_generate`` (the driver-side process at its first start), a new certificate,
    which the caller must hand to the JVM (:func:`internal_settings`) so executors and a
    restarted driver-side process get the same one. The material is then tried in a TLS
    handshake in memory, so a key that does not match, a trust store that does not trust the
    certificate or a server name it does not carry is a :class:`ConfigError` naming the keys
    at start-up, not a refused connection later."""
    if not config.ssl_enabled:
        return None
    if config.ssl_cert_chain or config.ssl_private_key:
        material = _from_files(config, clock)
        keys = [CERT_CHAIN_KEY, PRIVATE_KEY_KEY, TRUST_STORE_KEY if config.ssl_trust_store else ""]
        if config.ssl_server_name:
            keys.append(SERVER_NAME_KEY)
    elif config.ssl_generated_cert or config.ssl_generated_key:
        material = _from_internal(config)
        keys = [GENERATED_CERT_KEY, GENERATED_KEY_KEY]
    elif may_generate:
        material = generate_self_signed(clock)
        log.info("generated this application's TLS certificate (sha256 %s)", material.fingerprint())
        keys = ["the generated certificate"]
    else:
        raise ConfigError(
            [
                f"{ENABLED_KEY}=true but this process has no certificate: neither {CERT_CHAIN_KEY} and "
                f"{PRIVATE_KEY_KEY} nor the generated one the driver hands over ({GENERATED_CERT_KEY})"
            ]
        )
    check(material, " / ".join(k for k in keys if k))
    return material


def _from_internal(config: ArrowBeatConfig) -> TlsMaterial:
    problems: list[str] = []
    decoded: list[bytes] = []
    for key, line, label in (
        (GENERATED_CERT_KEY, config.ssl_generated_cert, CERT_LABEL),
        (GENERATED_KEY_KEY, config.ssl_generated_key, KEY_LABEL),
    ):
        try:
            decoded.append(decode_line(line, label))
        except ValueError as exc:
            problems.append(f"{key}=<redacted>: {exc}")
    if problems:
        raise ConfigError(problems)
    cert_pem, key_pem = decoded
    return TlsMaterial(cert_pem, key_pem, cert_pem, SERVER_NAME, generated=True)


def _read_pem_file(key: str, path: str, problems: list[str]) -> bytes:
    """The file's bytes, or ``b""`` with a problem added. Opened non-blocking and checked to be a
    regular file after opening (a FIFO swapped in after the config check cannot stall us)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        problems.append(f"{key}={path!r}: cannot read the file ({exc.strerror or exc})")
        return b""
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{key}={path!r}: not a regular file")
            return b""
        if key == PRIVATE_KEY_KEY and info.st_mode & 0o077:
            log.warning("%s=%r is readable by group or others; keep it 0600", key, path)
        data = stream.read(MAX_PEM_FILE_BYTES + 1)
    if len(data) > MAX_PEM_FILE_BYTES:
        problems.append(f"{key}={path!r}: larger than {MAX_PEM_FILE_BYTES >> 10} KiB")
        return b""
    return data


def _load_certificates(key: str, path: str, data: bytes, problems: list[str]) -> list[x509.Certificate]:
    from cryptography import x509

    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        problems.append(f"{key}={path!r}: holds no readable PEM certificate")
    return certs


def _derived_server_name(leaf: x509.Certificate) -> str | None:
    """``arrowbeat`` if the certificate lists it, else its first DNS subjectAltName (a wildcard's
    ``*`` replaced by ``arrowbeat``, a name the wildcard covers); None without DNS names."""
    from cryptography import x509

    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    names = san.get_values_for_type(x509.DNSName)
    if not names:
        return None
    if SERVER_NAME in names:
        return SERVER_NAME
    first = names[0]
    return SERVER_NAME + first[1:] if first.startswith("*.") else first


def _from_files(config: ArrowBeatConfig, clock: Clock) -> TlsMaterial:
    """The configured files, parsed and normalised (PEM without comments; the key as PKCS#8)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    problems: list[str] = []
    if not (config.ssl_cert_chain and config.ssl_private_key):
        raise ConfigError([f"{PRIVATE_KEY_KEY} and {CERT_CHAIN_KEY} must be set together"])
    chain_path, key_path, trust_path = config.ssl_cert_chain, config.ssl_private_key, config.ssl_trust_store
    chain = _load_certificates(
        CERT_CHAIN_KEY, chain_path, _read_pem_file(CERT_CHAIN_KEY, chain_path, problems), problems
    )
    key_data = _read_pem_file(PRIVATE_KEY_KEY, key_path, problems)
    trusted = []
    if trust_path:
        trust_data = _read_pem_file(TRUST_STORE_KEY, trust_path, problems)
        trusted = _load_certificates(TRUST_STORE_KEY, trust_path, trust_data, problems)
    key = None
    if key_data:
        try:
            key = serialization.load_pem_private_key(key_data, password=None)
        except TypeError:
            problems.append(f"{PRIVATE_KEY_KEY}={key_path!r}: the key is encrypted; give an unencrypted one")
        except (ValueError, UnsupportedAlgorithm):
            problems.append(f"{PRIVATE_KEY_KEY}={key_path!r}: holds no readable PEM private key")
        del key_data
    if key is not None and not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        problems.append(f"{PRIVATE_KEY_KEY}={key_path!r}: an RSA or EC key is needed")
        key = None
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
        problems.append(f"{PRIVATE_KEY_KEY}={key_path!r}: an RSA key needs at least 2048 bits")
        key = None
    server_name = config.ssl_server_name
    if chain:
        leaf = chain[0]
        spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        if key is not None and key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
            problems.append(
                f"{PRIVATE_KEY_KEY}={key_path!r} is not the key of the first certificate in {CERT_CHAIN_KEY}"
            )
        now = datetime.datetime.fromtimestamp(clock.time(), tz=datetime.UTC)
        if leaf.not_valid_after_utc < now:
            problems.append(
                f"{CERT_CHAIN_KEY}={chain_path!r}: expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M}Z; "
                "renew it (every TLS handshake would fail)"
            )
        elif leaf.not_valid_before_utc > now:
            problems.append(
                f"{CERT_CHAIN_KEY}={chain_path!r}: "
                f"not valid before {leaf.not_valid_before_utc:%Y-%m-%d %H:%M}Z"
            )
        if not server_name:
            server_name = _derived_server_name(leaf) or ""
            if not server_name:
                problems.append(
                    f"{CERT_CHAIN_KEY}={chain_path!r}: its first certificate has no DNS subjectAltName; "
                    f"add one (e.g. DNS:{SERVER_NAME}) or set {SERVER_NAME_KEY} to a name it carries"
                )
    if problems or key is None:
        raise ConfigError(problems)
    _warn_of_expiry(CERT_CHAIN_KEY, chain_path, chain, clock)
    if trust_path:
        _warn_of_expiry(TRUST_STORE_KEY, trust_path, trusted, clock)
    pem = serialization.Encoding.PEM
    return TlsMaterial(
        cert_chain_pem=b"".join(c.public_bytes(pem) for c in chain),
        private_key_pem=key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        trusted_pem=b"".join(c.public_bytes(pem) for c in (trusted or chain[:1])),
        server_name=server_name,
    )


def _warn_of_expiry(key: str, path: str, certs: list[x509.Certificate], clock: Clock) -> None:
    """One warning per certificate of a configured file that has expired or expires within
    :data:`EXPIRY_WARNING_S` (the leaf's expiry is refused before; an intermediate's or a trust
    anchor's may not break every handshake at once, but will break some). Certificates are
    files the operator renews: arrowbeat loads them at start-up only."""
    now = clock.time()
    for index, cert in enumerate(certs):
        ends = cert.not_valid_after_utc
        left_s = ends.timestamp() - now
        if left_s >= EXPIRY_WARNING_S:
            continue
        which = f"certificate {index + 1} of {len(certs)} ({cert.subject.rfc4514_string()[:80]})"
        when = f"{ends:%Y-%m-%d %H:%M}Z"
        if left_s < 0:
            log.warning("%s=%r: %s expired on %s; renew it", key, path, which, when)
        else:
            log.warning(
                "%s=%r: %s expires on %s, in %.1f days; from then on TLS connections of an application "
                "still running fail: renew it and restart the application before",
                key,
                path,
                which,
                when,
                left_s / 86400.0,
            )


def check(material: TlsMaterial, names: str = "the TLS material") -> None:
    """Runs a TLS handshake in memory between :func:`server_context` and :func:`client_context`
    of ``material``; raises :class:`ConfigError` (naming ``names``, never the key) if a client
    of this application would refuse its server."""
    try:
        server, client = server_context(material), client_context(material)
        _handshake_in_memory(server, client, material.server_name)
    except ssl.SSLCertVerificationError as exc:
        raise ConfigError(
            [f"{names}: a client trusting it refuses the server certificate ({exc.verify_message})"]
        ) from None
    except ssl.SSLError as exc:
        raise ConfigError([f"{names}: unusable for TLS ({exc.reason or type(exc).__name__})"]) from None


def _handshake_in_memory(server: ssl.SSLContext, client: ssl.SSLContext, server_name: str) -> None:
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    c = client.wrap_bio(c_in, c_out, server_hostname=server_name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c_done = s_done = False
    for _ in range(8):  # TLS 1.2 needs two round trips, 1.3 one and a half
        if not c_done:
            with contextlib.suppress(ssl.SSLWantReadError):
                c.do_handshake()
                c_done = True
        s_in.write(c_out.read())
        if not s_done:
            with contextlib.suppress(ssl.SSLWantReadError):
                s.do_handshake()
                s_done = True
        c_in.write(s_out.read())
        if c_done and s_done:
            return
    raise ssl.SSLError("the TLS handshake did not complete")


# --- what the transports take --------------------------------------------------------------------


def server_context(material: TlsMaterial) -> ssl.SSLContext:
    """For the accepting side (RM, agents' data and control servers, rendezvous): TLS 1.2 or later,
    this material's certificate chain, no client certificate asked (the HMAC handshake inside TLS
    authenticates clients), no session tickets (nothing resumes; nothing left unread). Wrap each
    accepted socket with ``server_side=True`` before the HMAC handshake, under its deadline."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_NONE
    context.num_tickets = 0
    with _material_file(material.cert_chain_pem + material.private_key_pem) as path:
        context.load_cert_chain(path)
    return context


def client_context(material: TlsMaterial) -> ssl.SSLContext:
    """For the connecting side: TLS 1.2 or later, the server's certificate required and checked
    against :attr:`TlsMaterial.trusted_pem` only (no system CAs: pinned; any listed certificate
    is an anchor) and against the name ``material.server_name`` in its subjectAltName (never the
    common name). Wrap with ``server_hostname=material.server_name``, whatever host was dialled."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED, check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.hostname_checks_common_name = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.load_verify_locations(cadata=material.trusted_pem.decode("ascii"))
    return context


def grpc_server_credentials(material: TlsMaterial) -> grpc.ServerCredentials:
    """For ``server.add_secure_port``: this certificate chain and key, no client certificate."""
    import grpc

    return grpc.ssl_server_credentials(
        [(material.private_key_pem, material.cert_chain_pem)],
        root_certificates=None,
        require_client_auth=False,
    )


def grpc_channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    """For ``grpc.secure_channel`` / ``grpc.aio.secure_channel``: trusts the trusted PEM only."""
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=material.trusted_pem)


def grpc_channel_options(material: TlsMaterial) -> list[tuple[str, str]]:
    """Channel options to add to a secure channel: the server name the certificate must carry
    (``grpc.ssl_target_name_override``), in place of the dialled host."""
    return [(GRPC_TARGET_NAME_OVERRIDE, material.server_name)]


@contextlib.contextmanager
def _material_file(data: bytes) -> Iterator[str]:
    """A path to ``data`` for as long as the block runs: an anonymous in-memory file (never on a
    disk, gone when closed) where Linux has ``memfd``; else a 0600 file created with ``O_EXCL |
    O_NOFOLLOW`` in a fresh 0700 directory, removed with it on leaving."""
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd_create("arrowbeat-tls")  # close-on-exec by default
        try:
            _write_all(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="arrowbeat-tls-")  # 0700, a fresh name
    path = os.path.join(directory, "material.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.rmdir(directory)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


__all__ = [
    "EXPIRY_WARNING_S",
    "GENERATED_CERT_KEY",
    "GENERATED_KEY_KEY",
    "GENERATED_NOT_AFTER",
    "GRPC_TARGET_NAME_OVERRIDE",
    "READY_FIELDS",
    "SERVER_NAME",
    "TlsMaterial",
    "check",
    "client_context",
    "decode_line",
    "encode_line",
    "from_config",
    "generate_self_signed",
    "grpc_channel_credentials",
    "grpc_channel_options",
    "grpc_server_credentials",
    "internal_settings",
    "ready_fields",
    "server_context",
]
