"""Where the heartbeat's gRPC channels and server port are made: the one place TLS goes.

Without credentials every channel is plaintext (``insecure_*``): the secret never travels
(``_auth``), but what follows an authenticated handshake is neither private nor protected against
an active man-in-the-middle. With credentials (``grpc.ssl_server_credentials`` for the RM,
``grpc.ssl_channel_credentials`` plus options such as ``grpc.ssl_target_name_override`` for its
clients, built by the caller: this library does not know where certificates come from) the port
is ``add_secure_port`` and the channels ``secure_channel``.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from heartbeat.wire.codec import message_size_options

ChannelOptions = Sequence[tuple[str, str | int]]

# A connection that has not finished its HTTP/2 (later: TLS) handshake by then is dropped, so
# silent connections do not pile up in the server (gRPC's default is 120 s).
SERVER_HANDSHAKE_TIMEOUT_MS = 10_000


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        *message_size_options(max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.server_handshake_timeout_ms", SERVER_HANDSHAKE_TIMEOUT_MS),
    ]


def bind_server(
    server: grpc.aio.Server, host: str, port: int, credentials: grpc.ServerCredentials | None = None
) -> int:
    """Bind the RM's listening port (TLS with ``credentials``); returns the port (0 if binding
    failed)."""
    if credentials is not None:
        return server.add_secure_port(f"{host}:{port}", credentials)
    return server.add_insecure_port(f"{host}:{port}")


def aio_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: ChannelOptions = (),
) -> grpc.aio.Channel:
    """An agent's channel to the RM: its own connection (not shared with other agents in-process);
    TLS with ``credentials`` (``options`` added, e.g. the server name to check)."""
    opts = [*message_size_options(), ("grpc.use_local_subchannel_pool", 1), *options]
    if credentials is not None:
        return grpc.aio.secure_channel(address, credentials, options=opts)
    return grpc.aio.insecure_channel(address, options=opts)


def sync_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None = None,
    options: ChannelOptions = (),
) -> grpc.Channel:
    """A blocking client's channel to the RM (``admin``); TLS with ``credentials``."""
    opts = [*message_size_options(), *options]
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=opts)
    return grpc.insecure_channel(address, options=opts)
