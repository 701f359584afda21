"""A Python worker's way to its executor's agent: ``find_agent`` and ``MapOutputClient``.

A Spark Python worker is a child of ``pyspark.daemon``, itself a child of the executor JVM; the
agent is another child of that JVM and its ``agent_service.MapOutputService`` writes
``<root>/<app>/agents/<jvm pid>.json``. Walking the worker's parent chain (a few steps) finds the
file with no configuration and no guessing: the parent chain is the one fact that ties a worker
to its executor. ``MapOutputClient`` then speaks the service's control channel (stage, unstage,
release, metrics); the driver uses it too, to release a shuffle in every agent.

Errors, all in the engine's tree (``arrow_shuffle.errors``): an agent that cannot be reached or
goes away is ``PeerLostError``, a peer without the application's secret
``ShuffleAuthenticationError``, a refused request ``ShuffleError``, no agent at all
``ShuffleConfigError`` (the plugin is not on, or ``spark.arrowbeat.shuffle.dir`` differs).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from typing import Any

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.errors import PeerLostError, ShuffleAuthenticationError, ShuffleConfigError, ShuffleError
from arrow_shuffle.spark.agent_service import agent_file, app_dir
from heartbeat.clock import SYSTEM_CLOCK, Clock

_MAX_DEPTH = 6


@dataclass(frozen=True)
class AgentInfo:
    """Where one executor's agent serves shuffle data and control requests."""

    executor_id: str
    host: str
    data_port: int
    control_port: int
    dir: str

    @property
    def data_address(self) -> tuple[str, int]:
        return (self.host, self.data_port)

    @property
    def control_address(self) -> tuple[str, int]:
        return (self.host, self.control_port)


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may contain spaces: the ppid follows the last ')'.
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def read_agent_file(path: str) -> AgentInfo:
    """One agent's discovery file (written atomically by ``MapOutputService``)."""
    with open(path) as f:
        data = json.load(f)
    return AgentInfo(
        str(data["executor_id"]),
        str(data["host"]),
        int(data["data_port"]),
        int(data["control_port"]),
        str(data["dir"]),
    )


def announced_agents(root: str, app_id: str) -> list[AgentInfo]:
    """Every agent of the application that announced itself on this host, by executor id."""
    folder = os.path.join(app_dir(root, app_id), "agents")
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        try:
            found.append(read_agent_file(os.path.join(folder, name)))
        except (OSError, ValueError, KeyError):  # an agent that is just exiting
            continue
    return sorted(found, key=lambda a: a.executor_id)


def find_agent(root: str, app_id: str, wait_s: float = 10.0, clock: Clock = SYSTEM_CLOCK) -> AgentInfo:
    """The agent of the executor JVM this process descends from.

    Waits up to ``wait_s`` (on ``clock.monotonic()``) for its discovery file: the agent of the
    driver's own executor (local mode) starts its map-output service only once the driver has an
    application id."""
    ancestors = []
    pid = os.getpid()
    for _ in range(_MAX_DEPTH):
        pid = _parent(pid)
        if pid <= 1:
            break
        ancestors.append(pid)
    deadline = clock.monotonic() + wait_s
    while True:
        for pid in ancestors:
            try:
                return read_agent_file(agent_file(root, app_id, pid))
            except FileNotFoundError:
                continue
        if clock.monotonic() >= deadline:
            break
        time.sleep(0.05)
    raise ShuffleConfigError(
        f"no arrowbeat agent found for this executor (looked for {agent_file(root, app_id, 0)[:-6]}"
        f"<pid>.json for ancestors {ancestors}); run with spark.plugins=arrowbeat.ArrowBeatPlugin and the "
        "same spark.arrowbeat.shuffle.dir on driver and executors"
    )


class MapOutputClient:
    """One authenticated control connection to an agent's ``MapOutputService``; failures name the agent."""

    def __init__(self, address: tuple[str, int], secret: str | bytes, who: str) -> None:
        self.who = who
        try:
            self._conn = Client(address, authkey=as_bytes(secret))
        except AuthenticationError as exc:
            raise ShuffleAuthenticationError(
                f"the shuffle agent of {who} at {address} refused our secret, or could not prove it "
                f"holds it: {exc}"
            ) from exc
        except (OSError, EOFError) as exc:
            raise PeerLostError(f"cannot reach the shuffle agent of {who} at {address}: {exc}") from exc

    def call(self, *request: Any) -> Any:
        try:
            self._conn.send(request)
            status, value = self._conn.recv()
        except (OSError, EOFError) as exc:
            raise PeerLostError(f"the shuffle agent of {self.who} went away: {exc}") from exc
        if status != "ok":
            raise ShuffleError(f"the shuffle agent of {self.who} refused {request[0]!r}: {value}")
        return value

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MapOutputClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
