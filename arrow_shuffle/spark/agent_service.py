"""``MapOutputService``: the executor agent's side of the DataFrame shuffle (materialized mode).

One per executor agent, living exactly as long as the agent (and so the executor JVM). It owns

- the directory map tasks of this executor write their map-output files into (``map_output``),
  deleted on ``release_shuffle``, on TTL expiry (``sweep``) and on ``close`` (the agent exits on
  its JVM's death, so an application's shuffle data dies with its executors);
- an engine ``PartitionServer`` (credit-based, HMAC-authenticated) serving *staged* streams: a
  reduce task on another executor asks, over the control channel, for "reduce partition r of
  these map outputs"; the service opens a PIPELINED one-subpartition ``ResultPartition`` and a
  thread fills it from the files, so the file -> network path is bounded by the partition's
  buffers and paced by the reader's credits (a slow reducer stalls the filler, never memory);
- the control channel: an engine ``control.ControlServer`` of ``AGENT_CONTROL`` (stage / unstage /
  release / metrics, each a typed, size-capped JSON message checked against its schema, sealed
  with the connection's session key after the mutual HMAC handshake; nothing is unpickled),
  spoken by ``agent_client.MapOutputClient``;
- a discovery file ``<root>/<app>/agents/<jvm pid>.json`` so Python workers, children of the
  same executor JVM, find it by walking their parent chain (``agent_client.find_agent``).

Files are private (``arrow_shuffle.private_files``): the root (``shuffle_root``: the setting, else
``arrowbeat-<uid>`` in the temp dir) is ours and writable by nobody else, every directory below it
0700, every file 0600 created without following links; ids become path components only through
``check_id``; ``stage`` serves only files whose real path is inside this agent's directory.

Time comes from an injected ``heartbeat.clock.Clock``: ``monotonic()`` ages staged streams (both
ends measured in this process), ``time()`` only ages files, whose modification times are wall
clock; a test moves a ``ManualClock`` past the TTL instead of waiting an hour.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control import (
    I32,
    I64,
    PARTITION_ID,
    Bytes,
    ControlServer,
    Float,
    Int,
    List,
    Map,
    Null,
    Operation,
    Record,
    Service,
    Str,
    Tuple,
)
from arrow_shuffle.errors import (
    ControlMessageError,
    ShuffleConfigError,
    ShuffleError,
    UnsafeIdError,
    UnsafePathError,
)
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import PartitionKind, ResultPartition
from arrow_shuffle.partition_server import PartitionServer
from arrow_shuffle.private_files import (
    LogLimiter,
    check_id,
    make_private_dir,
    private_root,
    resolve_inside,
    write_private_atomic,
)
from arrow_shuffle.spark.map_output import Segment, read_segments
from arrow_shuffle.transport import Transport
from arrow_shuffle.writer import RecordWriter
from heartbeat.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

MAX_SCHEMA_BYTES = 1 << 20
"""Largest Arrow IPC schema a ``stage`` request may carry (thousands of columns fit)."""
MAX_STAGE_BYTES = 8 << 20
"""Largest ``stage`` request: the schema plus every map output file and segment of one reducer."""
_SEGMENT = Tuple((Int(0, I64), Int(0, I64)))
_FILE = Tuple((Str(4096, 1), List(_SEGMENT, 1 << 20)))
AGENT_CONTROL = Service(
    "arrowbeat-agent-control",
    (
        Operation(
            "stage",
            Record(
                {
                    "shuffle": Int(0, I32),
                    "reducer": Int(0, I32),
                    "schema": Bytes(MAX_SCHEMA_BYTES),
                    "files": List(_FILE, 1 << 16),
                }
            ),
            PARTITION_ID,
            max_request_bytes=MAX_STAGE_BYTES,
        ),
        Operation("unstage", Record({"partition": PARTITION_ID}), Null()),
        Operation("release", Record({"shuffle": Int(0, I32)}), Int(0, I64), timeout_s=120.0),
        Operation("metrics", Record({}), Map(Float(), 256)),
    ),
)
"""The agent's control operations: what ``MapOutputService`` serves and ``MapOutputClient`` calls."""


_refused = LogLimiter(log)
"""Paths a peer asked for and did not get: logged, but not once per request."""
AGENTS = "agents"
"""The discovery folder of an application (an executor id can never be this name)."""


def default_root() -> str:
    """The per-user default root, ``arrowbeat-<uid>`` in the system temp dir: one user's root is
    never another's, and a root another user created first is refused, not shared."""
    return os.path.join(tempfile.gettempdir(), f"arrowbeat-{os.geteuid()}")


def shuffle_root(configured: str = "") -> str:
    """The shuffle root: ``spark.arrowbeat.shuffle.dir`` if set, else ``default_root()``.

    The one place the root is resolved, called where it is used (agent, its Python workers, the
    driver for its own host), so each process resolves it as the user it runs as."""
    return os.path.abspath(configured) if configured else default_root()


def app_dir(root: str, app_id: str) -> str:
    return os.path.join(root, check_id(app_id, "application id"))


def agent_file(root: str, app_id: str, jvm_pid: int) -> str:
    return os.path.join(app_dir(root, app_id), AGENTS, f"{check_id(jvm_pid, 'executor JVM pid')}.json")


def executor_dir(root: str, app_id: str, executor_id: str) -> str:
    """``<root>/<app>/<executor>``, created private with the discovery folder beside it (ids are
    checked before anything is created)."""
    if check_id(executor_id, "executor id") == AGENTS:
        raise UnsafeIdError(f"executor id {executor_id!r} is the name of the discovery folder")
    app = app_dir(os.path.abspath(root), app_id)
    private_root(root)
    make_private_dir(app)
    make_private_dir(os.path.join(app, AGENTS))
    return make_private_dir(os.path.join(app, executor_id))


@dataclass
class _Staged:
    partition: ResultPartition
    shuffle_id: int
    started: float
    """``clock.monotonic()`` when the stream was staged."""
    thread: threading.Thread
    error: BaseException | None = None


class MapOutputService:
    """Map-output directory, staged streams and control channel of one executor agent."""

    def __init__(
        self,
        app_id: str,
        executor_id: str,
        secret: str | bytes,
        root: str,
        jvm_pid: int,
        host: str = "127.0.0.1",
        config: ShuffleConfig | None = None,
        ttl_s: float = 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        transport: Transport | None = None,
    ) -> None:
        """``transport``: how the data and control servers accept (TLS when it carries a server
        context, see ``TcpTransport``); plain TCP by default."""
        if not as_bytes(secret):
            raise ShuffleConfigError("the map-output service needs the application secret")
        self.app_id = app_id
        self.executor_id = executor_id
        self.root = root
        self.jvm_pid = jvm_pid
        self.ttl_s = ttl_s
        self._clock = clock
        self.dir = executor_dir(root, app_id, executor_id)
        # Staged streams never wait on the reader for long stretches by design, but a reducer may
        # run a slow user function between batches: a generous bound, not a hang.
        self.config = (config or ShuffleConfig(network_memory_bytes=32 << 20)).replace(
            spill_dir=self.dir, buffer_request_timeout_s=900.0
        )
        self.pool = NetworkBufferPool.from_config(self.config.network_memory_bytes, self.config.buffer_size)
        self.server = PartitionServer(secret, app_id, host, 0, self.config, transport)
        self._lock = threading.Lock()
        self._staged: dict[PartitionId, _Staged] = {}
        self._next_token = 1
        self._closed = False
        self.closed = threading.Event()
        """Set by ``close()``; background loops wait on it."""
        self._counters = {"streams_staged": 0.0, "bytes_staged": 0.0, "shuffles_released": 0.0}
        self._threads: list[threading.Thread] = []
        self.control = ControlServer(
            secret,
            AGENT_CONTROL,
            {
                "stage": self._stage,
                "unstage": self._unstage,
                "release": self._release,
                "metrics": self._metrics,
            },
            host,
            0,
            config=self.config,
            max_connections=128,
            clock=clock,
            transport=transport,
            logger=log,
        )
        self._announce()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def data_address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def control_address(self) -> tuple[str, int]:
        return self.control.address

    def _announce(self) -> None:
        info = {
            "executor_id": self.executor_id,
            "host": self.data_address[0],
            "data_port": self.data_address[1],
            "control_port": self.control_address[1],
            "dir": self.dir,
            "pid": os.getpid(),
        }
        # Atomic (temp name, then rename): a worker never reads half a file.
        write_private_atomic(agent_file(self.root, self.app_id, self.jvm_pid), json.dumps(info).encode())

    # -- operations (also called directly by tests) ---------------------------------------------
    def stage(
        self, shuffle_id: int, reducer: int, schema: pa.Schema, files: Sequence[tuple[str, Sequence[Segment]]]
    ) -> PartitionId:
        """Open a stream of ``reducer``'s rows from ``files``; returns the id to request it by.

        A reducer names the files: only real paths inside this agent's directory are served
        (``UnsafePathError`` otherwise, logged at most once a minute), and the resolved path is
        what is read."""
        try:
            files = [(resolve_inside(self.dir, path), segments) for path, segments in files]
        except UnsafePathError as exc:
            _refused.warning(self.dir, "refused to stage map outputs: %s", exc)
            raise
        with self._lock:
            if self._closed:
                raise ShuffleError("the map-output service is closed")
            token = self._next_token
            self._next_token += 1
        pid = PartitionId(self.app_id, shuffle_id, reducer, token)
        partition = ResultPartition(pid, 1, schema, self.pool, PartitionKind.PIPELINED, self.config)
        self.server.register(partition)
        thread = threading.Thread(target=self._fill, args=(pid, partition, list(files)), daemon=True)
        with self._lock:
            self._staged[pid] = _Staged(partition, shuffle_id, self._clock.monotonic(), thread)
            self._counters["streams_staged"] += 1
        thread.start()
        return pid

    def _fill(
        self, pid: PartitionId, partition: ResultPartition, files: list[tuple[str, list[Segment]]]
    ) -> None:
        writer = RecordWriter(partition)
        try:
            for path, segments in files:
                for batch in read_segments(path, segments):
                    writer.write(batch, subpartition=0)
            writer.finish()
            with self._lock:
                self._counters["bytes_staged"] += partition.stats().bytes_written
        except BaseException as exc:  # the reader went away, a file was released, ...: end the stream
            writer.abort(f"staging the map outputs failed: {exc}")  # the reader is told why
            with self._lock:
                staged = self._staged.get(pid)
                if staged is not None:
                    staged.error = exc
            log.info("staged stream %s ended early: %s", pid, exc)
            self.server.release(pid)

    def unstage(self, pid: PartitionId) -> None:
        with self._lock:
            staged = self._staged.pop(pid, None)
        if staged is not None:
            self.server.release(pid)
            staged.thread.join(timeout=5)

    def release_shuffle(self, shuffle_id: int) -> int:
        """Drop every staged stream and map output of ``shuffle_id``; returns the bytes deleted."""
        with self._lock:
            pids = [p for p, s in self._staged.items() if s.shuffle_id == shuffle_id]
            self._counters["shuffles_released"] += 1
        for pid in pids:
            self.unstage(pid)
        return _remove_tree(os.path.join(self.dir, f"s{check_id(shuffle_id, 'shuffle id')}"))

    def sweep(self) -> int:
        """TTL: release shuffles whose directory and streams untouched for ``ttl_s``; returns bytes.

        A staged stream's age is monotonic (staged by this process); a map-output file's age is
        wall time against its modification time, the only clock the file system keeps."""
        now = self._clock.monotonic()
        with self._lock:
            old = [p for p, s in self._staged.items() if now - s.started > self.ttl_s]
        for pid in old:
            self.unstage(pid)
        freed = 0
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.dir):
                path = os.path.join(self.dir, name)
                if name.startswith("s") and self._clock.time() - _newest_mtime(path) > self.ttl_s:
                    with self._lock:
                        busy = any(s.shuffle_id == _shuffle_of(name) for s in self._staged.values())
                    if not busy:
                        freed += _remove_tree(path)
        return freed

    def disk_bytes(self) -> int:
        total = 0
        for folder, _, files in os.walk(self.dir):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    total += os.path.getsize(os.path.join(folder, name))
        return total

    def metrics(self) -> dict[str, float]:
        """Heartbeat payload figures: buffer pool, staged streams, map-output disk use."""
        with self._lock:
            staged = len(self._staged)
            counters = dict(self._counters)
        available = self.pool.num_available
        figures = {
            "shuffle_pool_segments": float(self.pool.num_segments),
            "shuffle_pool_available": float(available),
            "shuffle_pool_used_bytes": float((self.pool.num_segments - available) * self.pool.segment_size),
            "shuffle_streams_open": float(staged),
            "shuffle_disk_bytes": float(self.disk_bytes()),
        }
        figures.update({f"shuffle_{k}": v for k, v in counters.items()})
        return figures

    def close(self) -> None:
        """Stop serving and delete this executor's shuffle data and discovery file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pids = list(self._staged)
        self.closed.set()
        self.control.close()
        for pid in pids:
            self.unstage(pid)
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(agent_file(self.root, self.app_id, self.jvm_pid))
        _remove_tree(self.dir)
        # The application's folders go with its last agent (rmdir fails while others remain).
        for folder in (
            os.path.dirname(agent_file(self.root, self.app_id, 0)),
            app_dir(self.root, self.app_id),
        ):
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    # -- control channel: the handlers of AGENT_CONTROL (arguments already schema-checked) -------
    def _stage(self, args: dict[str, Any]) -> dict[str, Any]:
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(args["schema"]))
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise ControlMessageError(f"field schema of 'stage' is not an Arrow IPC schema: {exc}") from exc
        return self.stage(args["shuffle"], args["reducer"], schema, args["files"]).to_wire()

    def _unstage(self, args: dict[str, Any]) -> None:
        self.unstage(PartitionId.from_wire(args["partition"]))

    def _release(self, args: dict[str, Any]) -> int:
        return self.release_shuffle(args["shuffle"])

    def _metrics(self, args: dict[str, Any]) -> dict[str, float]:
        return self.metrics()


def _shuffle_of(name: str) -> int:
    try:
        return int(name[1:])
    except ValueError:
        return -1


def _newest_mtime(path: str) -> float:
    newest = os.lstat(path).st_mtime
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
    return newest


def _remove_tree(path: str) -> int:
    """Delete ``path`` and return the bytes its files held; links are removed, never followed
    (``lstat`` sizes; ``shutil.rmtree`` works on file descriptors and does not follow them)."""
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            os.unlink(path)
            return 0
    except FileNotFoundError:
        return 0
    freed = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                freed += os.lstat(os.path.join(folder, name)).st_size
    shutil.rmtree(path, ignore_errors=True)
    return freed
