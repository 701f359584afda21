"""Where the heartbeat's gRPC channels and server port are made: the one place TLS will go.

Today every channel is plaintext (``insecure_*``): the secret never travels (``_auth``), but what
follows an authenticated handshake is neither private nor protected against an active
man-in-the-middle. The TLS wave swaps these three functions' bodies for ``grpc.ssl_*_credentials``
(``add_secure_port`` / ``secure_channel``); no caller changes.
"""

from __future__ import annotations

import grpc
import grpc.aio

from ._wire import message_size_options

# A connection that has not finished its HTTP/2 (later: TLS) handshake by then is dropped, so
# silent connections do not pile up in the server (gRPC's default is 120 s).
SERVER_HANDSHAKE_TIMEOUT_MS = 10_000


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        *message_size_options(max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.server_handshake_timeout_ms", SERVER_HANDSHAKE_TIMEOUT_MS),
    ]


def bind_server(server: grpc.aio.Server, host: str, port: int) -> int:
    """Bind the RM's listening port; returns the port (0 if binding failed)."""
    return server.add_insecure_port(f"{host}:{port}")


def aio_channel(address: str) -> grpc.aio.Channel:
    """An agent's channel to the RM: its own connection (not shared with other agents in-process)."""
    return grpc.aio.insecure_channel(
        address, options=[*message_size_options(), ("grpc.use_local_subchannel_pool", 1)]
    )


def sync_channel(address: str) -> grpc.Channel:
    """A blocking client's channel to the RM (``admin``)."""
    return grpc.insecure_channel(address, options=message_size_options())
