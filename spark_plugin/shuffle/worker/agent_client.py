"""A Python worker's way to its executor's agent: ``find_agent`` and ``MapOutputClient``.

A Spark Python worker is a child of ``pyspark.daemon``, itself a child of the executor JVM; the
agent is another child of that JVM and its ``agent_service.MapOutputService`` writes
``<root>/<app>/agents/<jvm pid>.json``. Walking the worker's parent chain (a few steps) finds the
file with no configuration and no guessing: the parent chain is the one fact that ties a worker
to its executor. The file also names the agent's secret desk (``secret_of``), for tasks whose
plan carries no secret. ``MapOutputClient`` then speaks the service's control channel (stage, unstage,
release, metrics: typed calls of ``agent_protocol.AGENT_CONTROL`` over an engine
``control_client.ControlClient``); the driver uses it too, to release a shuffle in every agent. A reducer
whose stream failed asks the agent ``report_lost`` (are these map outputs gone?), and tells the agent
of an executor that carries stale status rows of lost outputs ``carried_lost``.

Errors, all in the engine's tree (``arrow_shuffle.errors``): an agent that cannot be reached, goes
away, or is stopped or silent past ``peer_timeout_s`` (or a call past its deadline) is
``PeerLostError`` (``DeadlineExceededError``), never a hang; a peer without the application's
secret ``ShuffleAuthenticationError``; a refused request ``ControlRequestError`` (or
``UnsafePathError`` etc. as the agent reported it); a malformed one ``ControlMessageError``; no
agent at all ``ShuffleConfigError`` (the plugin is not on, or ``spark.arrowbeat.shuffle.dir`` differs).

Discovery files are trusted only when private (``arrow_shuffle.private_files``): root, application
and discovery folders ours and not writable by others, the file a regular file of ours (no
symlink) of at most 4 KiB, its fields of the right types, its ``dir`` this executor's folder in
the application's. Anything else is ignored with one warning a minute (``UnsafePathError`` from
``find_agent`` if the root itself is unsafe: no agent could have started there).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_client import ControlClient
from arrow_shuffle.errors import (
    ShuffleConfigError,
    UnsafePathError,
)
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.private_files import check_id, check_private_dir, check_root, read_private_file
from arrow_shuffle.transport import Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog
from spark_plugin.shuffle.agent_layout import AGENTS, agent_file, app_dir, names_live_agent
from spark_plugin.shuffle.agent_protocol import AGENT_CONTROL
from spark_plugin.shuffle.local_secret import NAME as DESK_NAME
from spark_plugin.shuffle.local_secret import ancestors as parent_chain
from spark_plugin.shuffle.local_secret import secret_from_agent

log = logging.getLogger(__name__)
MAX_AGENT_FILE_BYTES = 4096
"""An announcement is ~200 bytes; anything far larger is not one."""
_ignored = RateLog(log)


class StaleAgentFileError(FileNotFoundError):
    """A well-formed discovery file whose agent process is gone: as good as no file (a worker
    waits for the restarted agent's), never trusted."""


@dataclass(frozen=True)
class AgentInfo:
    """Where one executor's agent serves shuffle data and control requests."""

    executor_id: str
    host: str
    data_port: int
    control_port: int
    dir: str
    spread: tuple[str, ...] = ()
    """Its folders on Spark's other local dirs of the executor (map outputs are spread over all)."""
    secret_socket: str = ""
    """Its secret desk's name (``local_secret``): where a task whose plan carries no secret gets it."""

    @property
    def output_dirs(self) -> tuple[str, ...]:
        return (self.dir, *self.spread)

    @property
    def data_address(self) -> tuple[str, int]:
        return (self.host, self.data_port)

    @property
    def control_address(self) -> tuple[str, int]:
        return (self.host, self.control_port)


def _field(data: dict[str, object], name: str, kind: type, path: str) -> object:
    value = data.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UnsafePathError(f"discovery file {path}: {name} is not a {kind.__name__}: not trusted")
    return value


def _port(data: dict[str, object], name: str, path: str) -> int:
    value = _field(data, name, int, path)
    assert isinstance(value, int)
    if not 0 < value < 65536:
        raise UnsafePathError(f"discovery file {path}: {name} {value} is not a port: not trusted")
    return value


def read_agent_file(path: str, app: str) -> AgentInfo:
    """The announcement at ``path`` in the discovery folder of application folder ``app``.

    ``FileNotFoundError`` if it is gone (its agent is just exiting), ``StaleAgentFileError`` (one)
    if the agent it names is not running (``agent_layout.names_live_agent``); ``UnsafePathError`` if it is
    not a private file of ours, or not an announcement: wrong JSON, wrong field types, or a
    ``dir`` other than ``<app>/<executor id>`` (a worker writes its map outputs there)."""
    raw = read_private_file(path, MAX_AGENT_FILE_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UnsafePathError(f"discovery file {path} is not JSON: not trusted") from exc
    if not isinstance(data, dict):
        raise UnsafePathError(f"discovery file {path} is not a JSON object: not trusted")
    executor_id = str(_field(data, "executor_id", str, path))
    try:
        check_id(executor_id, "executor id")
    except UnsafePathError as exc:
        raise UnsafePathError(f"discovery file {path}: {exc}") from exc
    host = str(_field(data, "host", str, path))
    if not 0 < len(host) <= 255 or not host.isprintable() or " " in host:
        raise UnsafePathError(f"discovery file {path}: host is not a host name: not trusted")
    folder = str(_field(data, "dir", str, path))
    if os.path.realpath(folder) != os.path.join(os.path.realpath(app), executor_id):
        raise UnsafePathError(
            f"discovery file {path}: dir is not executor {executor_id}'s folder in {app}: not trusted"
        )
    data_port, control_port = _port(data, "data_port", path), _port(data, "control_port", path)
    spread = data.get("spread", [])
    if not isinstance(spread, list) or not all(
        isinstance(d, str)
        and os.path.isabs(d)
        and os.path.basename(d) == executor_id
        and os.path.basename(os.path.dirname(d)) == os.path.basename(app)
        for d in spread
    ):
        raise UnsafePathError(
            f"discovery file {path}: spread is not a list of executor {executor_id}'s folders: not trusted"
        )
    desk = data.get("secret_socket", "")
    if not isinstance(desk, str) or (desk and not DESK_NAME.fullmatch(desk)):
        raise UnsafePathError(f"discovery file {path}: secret_socket is not a desk's name: not trusted")
    if not names_live_agent(data):
        raise StaleAgentFileError(
            f"discovery file {path} names agent pid {data.get('pid')!r}, which is not running "
            "(its agent died; its JVM starts another): ignored"
        )
    return AgentInfo(executor_id, host, data_port, control_port, folder, tuple(spread), desk)


def _agents_folder(root: str, app_id: str) -> str | None:
    """The application's discovery folder if it exists, after checking the folders above it."""
    app = app_dir(root, app_id)
    try:
        check_root(root)
        check_private_dir(app)
        return check_private_dir(os.path.join(app, AGENTS))
    except (FileNotFoundError, NotADirectoryError):  # no agent there (a local dir the agent skipped)
        return None


def announced_agents(root: str | Sequence[str], app_id: str) -> list[AgentInfo]:
    """Every agent of the application that announced itself under ``root`` (or any of several
    roots), by executor id.

    Untrusted folders or files are left out, with a warning at most once a minute."""
    if not isinstance(root, str):
        by_id = {a.executor_id: a for r in root for a in announced_agents(r, app_id)}
        return [by_id[e] for e in sorted(by_id)]
    try:
        folder = _agents_folder(root, app_id)
    except UnsafePathError as exc:
        _ignored.warning(root, "ignoring arrowbeat discovery files under %s: %s", root, exc)
        return []
    if folder is None:
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        try:
            found.append(read_agent_file(os.path.join(folder, name), app_dir(root, app_id)))
        except StaleAgentFileError as exc:
            _ignored.log("stale " + folder, logging.INFO, "ignoring a stale discovery file: %s", exc)
        except FileNotFoundError:  # an agent that is just exiting
            continue
        except UnsafePathError as exc:
            _ignored.warning(folder, "ignoring an untrusted discovery file: %s", exc)
    return sorted(found, key=lambda a: a.executor_id)


def find_agent(
    root: str | Sequence[str], app_id: str, wait_s: float = 10.0, clock: Clock = SYSTEM_CLOCK
) -> AgentInfo:
    """The agent of the executor JVM this process descends from, announced under ``root`` (or
    any of this executor's roots, ``agent_layout.shuffle_roots``).

    Waits up to ``wait_s`` (on ``clock.monotonic()``) for its discovery file: the agent of the
    driver's own executor (local mode) starts its map-output service only once the driver has an
    application id."""
    ancestors = parent_chain(os.getpid())
    roots = [root] if isinstance(root, str) else list(root)
    deadline = clock.monotonic() + wait_s
    while True:
        for one in roots:
            found = _find_in(one, app_id, ancestors, only_root=len(roots) == 1)
            if found is not None:
                return found
        if clock.monotonic() >= deadline:
            break
        time.sleep(0.05)
    looked = ", ".join(agent_file(r, app_id, 0)[:-6] + "<pid>.json" for r in roots)
    raise ShuffleConfigError(
        f"no arrowbeat agent found for this executor (looked for {looked} for ancestors {ancestors}); "
        "run with spark.plugins=arrowbeat.ArrowBeatPlugin (its agent may have failed to start: see the "
        "executor's log); a spark.arrowbeat.shuffle.dir must be the same path on every host"
    )


def _find_in(root: str, app_id: str, ancestors: list[int], only_root: bool) -> AgentInfo | None:
    """The announcement of one of ``ancestors`` under ``root``. An unsafe root is
    ``UnsafePathError`` at once when it is the only one (no agent of ours can be there), else
    skipped with a warning."""
    try:
        folder = _agents_folder(root, app_id)
    except UnsafePathError as exc:
        if only_root:
            raise
        _ignored.warning(root, "ignoring arrowbeat discovery files under %s: %s", root, exc)
        return None
    if folder is None:
        return None
    app = app_dir(root, app_id)
    for pid in ancestors:
        path = agent_file(root, app_id, pid)
        try:
            return read_agent_file(path, app)
        except StaleAgentFileError as exc:  # wait for the restarted agent's own
            _ignored.log(
                "stale " + os.path.dirname(path), logging.INFO, "ignoring a stale discovery file: %s", exc
            )
        except FileNotFoundError:
            continue
        except UnsafePathError as exc:
            _ignored.warning(os.path.dirname(path), "ignoring an untrusted discovery file: %s", exc)
    return None


def secret_of(agent: AgentInfo) -> str:
    """The application secret, from this worker's own agent (``local_secret``): for a task whose
    plan carries none (made from a Spark Connect session)."""
    who = f"the shuffle agent of executor {agent.executor_id}"
    if not agent.secret_socket:
        raise ShuffleConfigError(
            f"{who} offers no secret desk (an older arrowbeat on the executors, or its desk failed to "
            "start: see the executor's log); shuffles from Spark Connect sessions need one"
        )
    return secret_from_agent(agent.secret_socket, who)


class MapOutputClient:
    """One authenticated control connection to an agent's ``MapOutputService``; failures name the agent.

    Connect + handshake within ``config.connect_timeout_s``; each call within its operation's
    deadline, a stopped or vanished agent detected after ``config.peer_timeout_s`` of silence."""

    def __init__(
        self,
        address: tuple[str, int],
        secret: str | bytes,
        who: str,
        *,
        config: ShuffleConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
        transport: Transport | None = None,
    ) -> None:
        self.who = who
        config = config or ShuffleConfig()
        self._client = ControlClient(
            address,
            secret,
            AGENT_CONTROL,
            who=f"the shuffle agent of {who}",
            connect_timeout_s=config.connect_timeout_s,
            peer_timeout_s=config.peer_timeout_s,
            clock=clock,
            transport=transport,
        )

    def stage(
        self,
        shuffle_id: int,
        reducer: int,
        schema: pa.Schema,
        files: Sequence[tuple[str, Sequence[Sequence[Any]]]],
    ) -> PartitionId:
        """Ask the agent to stream ``reducer``'s rows of ``files``; the partition to request."""
        wire = self._client.call(
            "stage",
            shuffle=shuffle_id,
            reducer=reducer,
            schema=schema.serialize().to_pybytes(),
            files=[(path, [_segment(s) for s in segments]) for path, segments in files],
        )
        return PartitionId.from_wire(wire)

    def unstage(self, partition: PartitionId) -> None:
        self._client.call("unstage", partition=partition.to_wire())

    def release(self, shuffle_id: int) -> int:
        """Drop the shuffle's streams and map outputs in that agent; the bytes it freed."""
        freed: int = self._client.call("release", shuffle=shuffle_id)
        return freed

    def report_lost(self, shuffle_id: int, paths: Sequence[str]) -> bool:
        """Whether the agent finds any of ``paths`` (its map outputs) missing; it then tells its
        JVM, which has Spark recompute them. A path not the agent's is refused (``ControlRequestError``)."""
        found: int = self._client.call("report_lost", shuffle=shuffle_id, paths=list(paths))
        return bool(found)

    def carried_lost(self, shuffle_id: int, owners: Sequence[str]) -> bool:
        """Tell the agent that status rows its executor carries (read from a cache off their
        owners) name map outputs of ``owners`` that are lost; whether it has its JVM ask Spark to
        replace the executor, so that those rows go and their map partitions are recomputed."""
        taken: int = self._client.call("carried_lost", shuffle=shuffle_id, owners=list(owners))
        return bool(taken)

    def report_corrupt(self, shuffle_id: int, path: str, detail: str) -> int:
        """Tell the agent its map output at ``path`` is damaged (``detail``: what the reader found).
        The answer is a ``corrupt_outputs.Outcome``: 1 Spark recomputes exactly that map partition,
        2 the executor is being replaced, 0 the shuffle was released there (nothing to recompute)."""
        outcome: int = self._client.call(
            "report_corrupt", shuffle=shuffle_id, path=path, detail=detail[:1000]
        )
        return outcome

    def corrupt_outputs(self, shuffle_id: int) -> list[tuple[int, str, str]]:
        """The agent's damaged outputs of the shuffle: ``(map partition, file, what was found)``."""
        found: list[tuple[int, str, str]] = self._client.call("corrupt_outputs", shuffle=shuffle_id)
        return found

    def metrics(self) -> dict[str, Any]:
        figures: dict[str, Any] = self._client.call("metrics")
        return figures

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> MapOutputClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _segment(segment: Sequence[Any]) -> tuple[int, int, list[int]]:
    """A status row's segment as the stage request carries it: a two-item one has no checksums."""
    return (int(segment[0]), int(segment[1]), list(segment[2]) if len(segment) > 2 else [])
