"""Where pipelined map tasks are: a tiny directory in the driver process, for the length of a query.

A pipelined map task serves its output from its own Python worker, at an address known only once
it runs; its reducers run at the same time on other executors. Each map task registers
``map index -> address`` here and reducers look the addresses up (waiting, with a deadline on an
injected ``heartbeat.clock.Clock``, until all maps registered). The channel is the engine's typed
control protocol (``arrow_shuffle.control_schema``): ``RENDEZVOUS`` operations register / locate / forget,
schema-checked JSON sealed with the connection's session key after the mutual HMAC handshake;
nothing is unpickled. Every call has a deadline; a driver that stops answering is a
``PeerLostError``. Used by ``pipelined`` only; materialized shuffles need no rendezvous, their map
outputs are tracked by Spark (``tasks``).
"""

from __future__ import annotations

import threading
from typing import Any

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.control_schema import I32, I64, Float, Int, List, Null, Operation, Record, Service, Str
from arrow_shuffle.control_server import ControlServer
from arrow_shuffle.errors import ControlRequestError, ShuffleError
from arrow_shuffle.transport import Transport
from heartbeat.clock import SYSTEM_CLOCK, Clock

MAX_MAPS = 100_000
"""Most map tasks one pipelined shuffle may have (and a ``locate`` answer list)."""
MAX_SHUFFLES = 4096
"""Most shuffles the table holds at once; a query forgets its shuffle when it is done."""
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
    ),
)
"""The rendezvous' operations, served by ``Rendezvous`` and called by ``register``/``locate``/``forget``."""


class Rendezvous:
    """The driver side: a control server and the table of registered map outputs."""

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        clock: Clock = SYSTEM_CLOCK,
        config: ShuffleConfig | None = None,
        transport: Transport | None = None,
    ) -> None:
        self._clock = clock
        self._lock = threading.Condition()
        self._maps: dict[int, dict[int, dict[str, Any]]] = {}
        self.waiting = 0
        """``locate`` calls waiting for maps to register right now."""
        self._closed = False
        self._server = ControlServer(
            secret,
            RENDEZVOUS,
            {"register": self._register, "locate": self._locate, "forget": self._forget},
            host,
            0,
            config=config,
            clock=clock,
            transport=transport,
        )

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    @property
    def server(self) -> ControlServer:
        return self._server

    def _register(self, args: dict[str, Any]) -> None:
        shuffle = args.pop("shuffle")
        with self._lock:
            if shuffle not in self._maps and len(self._maps) >= MAX_SHUFFLES:
                raise ControlRequestError(f"the rendezvous holds {MAX_SHUFFLES} shuffles already")
            self._maps.setdefault(shuffle, {})[args["map"]] = args
            self._lock.notify_all()

    def _locate(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return self.locate(args["shuffle"], args["count"], args["wait_s"])

    def _forget(self, args: dict[str, Any]) -> None:
        self.forget(args["shuffle"])

    def locate(self, shuffle: int, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The maps of ``shuffle`` registered so far, once ``count`` did or ``timeout_s`` passed."""
        with self._lock:
            deadline = self._clock.monotonic() + timeout_s
            self.waiting += 1
            try:
                while len(self._maps.get(shuffle, {})) < count and not self._closed:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(min(left, 0.5))
            finally:
                self.waiting -= 1
            return sorted(self._maps.get(shuffle, {}).values(), key=lambda m: int(m["map"]))

    def forget(self, shuffle: int) -> None:
        with self._lock:
            self._maps.pop(shuffle, None)

    def close(self) -> None:
        with self._lock:  # waiting look-ups answer with what they have
            self._closed = True
            self._lock.notify_all()
        self._server.close()


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
