"""The pipelined-shuffle rendezvous' control schema and its calls, for the map and reduce tasks
that register and look up map outputs and for the driver that forgets a released shuffle.

The service itself (``Rendezvous``) runs in the driver process (``spark_plugin.shuffle.driver.
rendezvous``); this module is what the other side needs, so worker-side code never imports
driver-side code. Every call is the engine's typed control protocol (schema-checked JSON sealed
with the connection's session key after the mutual HMAC handshake; nothing is unpickled) with a
deadline: a driver that stops answering is a ``PeerLostError``.
"""

from __future__ import annotations

from typing import Any

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.control_schema import I32, I64, Float, Int, List, Null, Operation, Record, Service, Str
from arrow_shuffle.errors import ShuffleError
from arrow_shuffle.transport import Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

MAX_MAPS = 100_000
"""Most map tasks one pipelined shuffle may have (and a ``locate`` answer list)."""
MAX_WAIT_S = 600.0
_MAP = Record({"map": Int(0, I32), "host": Str(255, 1), "port": Int(1, 65535), "token": Int(0, I64)})
RENDEZVOUS = Service(
    "arrowbeat-rendezvous",
    (
        Operation(
            "register",
            Record(
                {
                    "shuffle": Int(0, I32),
                    "map": Int(0, MAX_MAPS - 1),
                    "host": Str(255, 1),
                    "port": Int(1, 65535),
                    "token": Int(0, I64),
                }
            ),
            Null(),
        ),
        Operation(
            "locate",
            Record({"shuffle": Int(0, I32), "count": Int(0, MAX_MAPS), "wait_s": Float(0.0, MAX_WAIT_S)}),
            List(_MAP, MAX_MAPS),
            max_response_bytes=16 << 20,
        ),
        Operation("forget", Record({"shuffle": Int(0, I32)}), Null()),
        Operation(
            "unregister",
            Record({"shuffle": Int(0, I32), "map": Int(0, MAX_MAPS - 1), "token": Int(0, I64)}),
            Null(),
        ),
    ),
)
"""The rendezvous' operations, served by ``Rendezvous`` and called by ``register``/``locate``/
``forget``/``unregister``."""


def _client(
    address: tuple[str, int],
    secret: str,
    config: ShuffleConfig | None,
    clock: Clock,
    transport: Transport | None = None,
) -> ControlClient:
    config = config or ShuffleConfig()
    return ControlClient(
        address,
        secret,
        RENDEZVOUS,
        who="the pipelined-shuffle rendezvous on the driver",
        connect_timeout_s=config.connect_timeout_s,
        peer_timeout_s=config.peer_timeout_s,
        clock=clock,
        transport=transport,
    )


def register(
    address: tuple[str, int],
    secret: str,
    shuffle: int,
    map_index: int,
    host: str,
    port: int,
    token: int,
    *,
    config: ShuffleConfig | None = None,
    clock: Clock = SYSTEM_CLOCK,
    transport: Transport | None = None,
) -> None:
    """A map task tells the driver where it serves its output."""
    with _client(address, secret, config, clock, transport) as client:
        client.call("register", shuffle=shuffle, map=map_index, host=host, port=port, token=token)


def locate(
    address: tuple[str, int],
    secret: str,
    shuffle: int,
    count: int,
    wait_s: float = 60.0,
    *,
    config: ShuffleConfig | None = None,
    clock: Clock = SYSTEM_CLOCK,
    transport: Transport | None = None,
) -> list[dict[str, Any]]:
    """A reducer's look-up: every map task's address, or ``ShuffleError`` if some never registered.

    The driver waits up to ``wait_s`` for them, sending keepalives; the call's own deadline is a
    little longer, so a driver that stops answering is a ``PeerLostError``, never a hang."""
    config = config or ShuffleConfig()
    with _client(address, secret, config, clock, transport) as client:
        found: list[dict[str, Any]] = client.call(
            "locate", timeout_s=wait_s + config.peer_timeout_s, shuffle=shuffle, count=count, wait_s=wait_s
        )
    if len(found) < count:
        raise ShuffleError(
            f"pipelined shuffle {shuffle}: only {len(found)} of {count} map tasks registered in time"
        )
    return found


def forget(
    address: tuple[str, int],
    secret: str,
    shuffle: int,
    *,
    config: ShuffleConfig | None = None,
    clock: Clock = SYSTEM_CLOCK,
    transport: Transport | None = None,
) -> None:
    """Drop a finished shuffle's entries."""
    with _client(address, secret, config, clock, transport) as client:
        client.call("forget", shuffle=shuffle)


def unregister(
    address: tuple[str, int],
    secret: str,
    shuffle: int,
    map_index: int,
    token: int,
    *,
    config: ShuffleConfig | None = None,
    clock: Clock = SYSTEM_CLOCK,
    transport: Transport | None = None,
) -> None:
    """A map task's entry is not needed any more (its readers drained it, or it failed)."""
    with _client(address, secret, config, clock, transport) as client:
        client.call("unregister", shuffle=shuffle, map=map_index, token=token)
