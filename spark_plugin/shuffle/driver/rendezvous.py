"""Where pipelined map tasks are: a tiny directory in the driver process, for the length of a query.

A pipelined map task serves its output from its own Python worker, at an address known only once
it runs; its reducers run at the same time on other executors. Each map task registers
``map index -> address`` here and reducers look the addresses up (waiting, with a deadline on an
injected ``arrowbeat_base.clock.Clock``, until all maps registered). The channel is the engine's typed
control protocol (``arrow_shuffle.control_schema``): ``RENDEZVOUS`` operations register / locate / forget,
schema-checked JSON sealed with the connection's session key after the mutual HMAC handshake;
nothing is unpickled. Every call has a deadline; a driver that stops answering is a
``PeerLostError``. The schema and the calls map and reduce tasks make are in
``spark_plugin.shuffle.rendezvous_client``. Used by ``pipelined`` only; materialized shuffles need
no rendezvous, their map outputs are tracked by Spark (``tasks``).

Nothing stays after a shuffle (a streaming query runs one per micro-batch, for months): a map task
``unregister``s its own entry (by its token, so never a retry's) once its readers drained it or
it failed, and the shuffle's entry goes with its last map; ``ShuffleHandle.release`` forgets the
whole shuffle; and a shuffle nobody registered or looked up for ``ttl_s`` (on the monotonic
clock) is swept, for map tasks killed before they could unregister. A reader needs the entries
only until it located every map, which is before it can drain any, so a drained map's entry
is never needed again (pipelined outputs cannot be re-read).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_server import ControlServer
from arrow_shuffle.errors import ControlRequestError
from arrow_shuffle.transport import Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.rendezvous_client import RENDEZVOUS

MAX_SHUFFLES = 4096
"""Most shuffles the table holds at once (a safety bound: entries go when their shuffle ends)."""
DEFAULT_TTL_S = 3600.0
"""``spark.arrowbeat.shuffle.ttl``'s default: a shuffle untouched this long is swept."""


@dataclass
class _Shuffle:
    """One shuffle's registered maps, and when it was last registered to or looked up."""

    touched: float
    """``clock.monotonic()`` of its last register or locate (the TTL runs from it)."""
    maps: dict[int, dict[str, Any]] = field(default_factory=dict)


class Rendezvous:
    """The driver side: a control server and the table of registered map outputs."""

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        clock: Clock = SYSTEM_CLOCK,
        config: ShuffleConfig | None = None,
        transport: Transport | None = None,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        """``ttl_s``: a shuffle nobody registered to or looked up for this long is forgotten
        (``spark.arrowbeat.shuffle.ttl``; its map tasks were killed before they unregistered)."""
        self._clock = clock
        self.ttl_s = ttl_s
        self._lock = threading.Condition()
        self._shuffles: dict[int, _Shuffle] = {}
        self._swept_at = clock.monotonic()
        self.waiting = 0
        """``locate`` calls waiting for maps to register right now."""
        self._closed = False
        self._server = ControlServer(
            secret,
            RENDEZVOUS,
            {
                "register": self._register,
                "locate": self._locate,
                "forget": self._forget,
                "unregister": self._unregister,
            },
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
        self.register(args["shuffle"], args["map"], args["host"], args["port"], args["token"])

    def register(self, shuffle: int, map_index: int, host: str, port: int, token: int) -> None:
        """Map task ``map_index`` of ``shuffle`` serves at ``host:port`` (attempt ``token``)."""
        args: dict[str, Any] = {"map": map_index, "host": host, "port": port, "token": token}
        with self._lock:
            now = self._clock.monotonic()
            if shuffle not in self._shuffles and (
                now - self._swept_at >= self.ttl_s / 4 or len(self._shuffles) >= MAX_SHUFFLES
            ):
                self._sweep(now)
            if shuffle not in self._shuffles and len(self._shuffles) >= MAX_SHUFFLES:
                raise ControlRequestError(
                    f"the rendezvous holds {MAX_SHUFFLES} shuffles running at once already"
                )
            entry = self._shuffles.setdefault(shuffle, _Shuffle(now))
            entry.touched = now
            entry.maps[args["map"]] = args
            self._lock.notify_all()

    def _locate(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        return self.locate(args["shuffle"], args["count"], args["wait_s"])

    def _forget(self, args: dict[str, Any]) -> None:
        self.forget(args["shuffle"])

    def _unregister(self, args: dict[str, Any]) -> None:
        self.unregister(args["shuffle"], args["map"], args["token"])

    def locate(self, shuffle: int, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The maps of ``shuffle`` registered so far, once ``count`` did or ``timeout_s`` passed."""
        with self._lock:
            deadline = self._clock.monotonic() + timeout_s
            self.waiting += 1
            try:
                while len(self._maps_of(shuffle)) < count and not self._closed:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(min(left, 0.5))
            finally:
                self.waiting -= 1
            entry = self._shuffles.get(shuffle)
            if entry is not None:
                entry.touched = self._clock.monotonic()
            return sorted(self._maps_of(shuffle).values(), key=lambda m: int(m["map"]))

    def _maps_of(self, shuffle: int) -> dict[int, dict[str, Any]]:
        entry = self._shuffles.get(shuffle)
        return {} if entry is None else entry.maps

    def forget(self, shuffle: int) -> None:
        """Drop every entry of ``shuffle`` (released, or its query is over)."""
        with self._lock:
            self._shuffles.pop(shuffle, None)

    def unregister(self, shuffle: int, map_index: int, token: int) -> None:
        """A map task's entry goes (drained or failed); only its own attempt's (``token``), so a
        late call never removes a retry's. The shuffle goes with its last entry."""
        with self._lock:
            entry = self._shuffles.get(shuffle)
            if entry is None:
                return
            found = entry.maps.get(map_index)
            if found is not None and int(found["token"]) == token:
                del entry.maps[map_index]
            if not entry.maps:
                del self._shuffles[shuffle]

    def shuffles(self) -> int:
        """Shuffles with entries now."""
        with self._lock:
            return len(self._shuffles)

    def sweep(self) -> int:
        """Forget shuffles nobody registered to or looked up for ``ttl_s``; returns how many."""
        with self._lock:
            return self._sweep(self._clock.monotonic())

    def _sweep(self, now: float) -> int:
        self._swept_at = now
        stale = [s for s, entry in self._shuffles.items() if now - entry.touched >= self.ttl_s]
        for shuffle in stale:
            del self._shuffles[shuffle]
        return len(stale)

    def close(self) -> None:
        with self._lock:  # waiting look-ups answer with what they have
            self._closed = True
            self._lock.notify_all()
        self._server.close()
