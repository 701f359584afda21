"""Where pipelined map tasks are: a tiny directory in the driver process, for the length of a query.

A pipelined map task serves its output from its own Python worker, at an address known only once
it runs; its reducers run at the same time on other executors. Each map task announces
``map index -> address`` here and reducers look the addresses up (waiting, with a deadline on an
injected ``heartbeat.clock.Clock``, until all maps announced). The channel is
``multiprocessing.connection`` with the application secret as authkey (HMAC challenge both ways
before any message is read). Used by ``pipelined`` only; materialized shuffles need no rendezvous,
their map outputs are tracked by Spark (``tasks``).
"""

from __future__ import annotations

import contextlib
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.errors import PeerLostError, ShuffleAuthenticationError, ShuffleError
from heartbeat.clock import SYSTEM_CLOCK, Clock


class Rendezvous:
    """The driver side: a listener thread and the table of announced map outputs."""

    def __init__(self, secret: str, host: str = "127.0.0.1", clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._listener = Listener((host, 0), authkey=as_bytes(secret))
        self._lock = threading.Condition()
        self._maps: dict[int, dict[int, dict[str, Any]]] = {}
        self._closed = False
        threading.Thread(target=self._accept, name="arrowbeat-rendezvous", daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        address: tuple[str, int] = self._listener.address
        return address

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:
                return
            except Exception:  # a client without the secret
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                op, shuffle, payload = conn.recv()
                if op == "announce":
                    with self._lock:
                        self._maps.setdefault(shuffle, {})[int(payload["map"])] = payload
                        self._lock.notify_all()
                    conn.send(None)
                elif op == "locate":
                    conn.send(self.locate(shuffle, int(payload)))
            except (EOFError, OSError):
                return

    def locate(self, shuffle: int, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The maps of ``shuffle`` announced so far, once ``count`` did or ``timeout_s`` passed."""
        deadline = self._clock.monotonic() + timeout_s
        with self._lock:
            while len(self._maps.get(shuffle, {})) < count:
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 0.5))
            return sorted(self._maps.get(shuffle, {}).values(), key=lambda m: int(m["map"]))

    def forget(self, shuffle: int) -> None:
        with self._lock:
            self._maps.pop(shuffle, None)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()


def call(address: tuple[str, int], secret: str, *request: Any) -> Any:
    """One request from a task to the driver's rendezvous."""
    try:
        with Client(address, authkey=as_bytes(secret)) as conn:
            conn.send(request)
            return conn.recv()
    except AuthenticationError as exc:
        raise ShuffleAuthenticationError(
            f"the pipelined-shuffle rendezvous on the driver {address} refused our secret: {exc}"
        ) from exc
    except (OSError, EOFError) as exc:
        raise PeerLostError(
            f"cannot reach the pipelined-shuffle rendezvous on the driver {address}: {exc}"
        ) from exc


def locate(address: tuple[str, int], secret: str, shuffle: int, count: int) -> list[dict[str, Any]]:
    """A reducer's look-up: every map task's address, or ``ShuffleError`` if some never announced."""
    found: list[dict[str, Any]] = call(address, secret, "locate", shuffle, count)
    if len(found) < count:
        raise ShuffleError(
            f"pipelined shuffle {shuffle}: only {len(found)} of {count} map tasks announced in time"
        )
    return found
