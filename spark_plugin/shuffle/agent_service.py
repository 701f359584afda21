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
- buffers under load: ``stage`` answers at once and takes no buffers; the stream's thread queues
  for its reserved buffers in the agent's pool, first come first served, for up to
  ``buffer_reserve_timeout_s`` (then the reader is told what it waited for), and holds at most
  ``STREAM_POOL_SHARE`` of the pool (``partition_pool_share``). A stage nobody connected to
  within ``peer_timeout_s`` (a reducer that died in between) is freed by the reaper thread; so is
  a stream whose reader was handed its end but never unstaged it;
- lost outputs: a ``stage`` naming a map-output file of ours that is gone fails at once, and a
  reducer whose stream failed asks ``report_lost``; either way ``on_outputs_lost`` (the JVM side,
  which has Spark drop this executor's map outputs so they are recomputed) is told, once;
- the control channel: an engine ``control.ControlServer`` of ``AGENT_CONTROL`` (stage / unstage /
  release / metrics / report_lost, each a typed, size-capped JSON message checked against its schema, sealed
  with the connection's session key after the mutual HMAC handshake; nothing is unpickled),
  spoken by ``agent_client.MapOutputClient``;
- a discovery file ``<root>/<app>/agents/<jvm pid>.json`` so Python workers, children of the
  same executor JVM, find it by walking their parent chain (``agent_client.find_agent``);
- a secret desk (``local_secret.SecretDesk``, named in the discovery file) that hands the
  application secret to those workers only, for plans made without it (Spark Connect sessions).

Where (``shuffle_roots``): on each executor's own local disks, found from the executor's side and
never from a path computed on the driver. By default Spark's local directories of that executor
(its block manager's folders, where Spark keeps its own shuffle files: ``spark.local.dir``,
``SPARK_LOCAL_DIRS``, YARN's ``LOCAL_DIRS``, a Worker's ``SPARK_EXECUTOR_DIRS`` as Spark resolved
them), ``arrowbeat/`` in each. The JVM plugin hands them to the agent; PySpark hands the same list
to every Python worker of the executor as ``SPARK_LOCAL_DIRS``. With several, map outputs are
spread over them (a hash of shuffle and map partition, as Spark spreads its files); one that is
missing or not writable is skipped with a warning. ``spark.arrowbeat.shuffle.dir`` overrides them.

Files are private (``arrow_shuffle.private_files``): a root is ours and writable by nobody else,
every directory below it 0700, every file 0600 created without following links; ids become path
components only through ``check_id``; ``stage`` serves only files whose real path is inside one of
this agent's directories.

Time comes from an injected ``heartbeat.clock.Clock``: ``monotonic()`` ages staged streams and
times a shuffle's last read (both ends measured in this process), ``time()`` only ages files,
whose modification times are wall clock; a test moves a ``ManualClock`` past the TTL instead of
waiting an hour. The TTL counts reads: a shuffle is forgotten after ``ttl_s`` with no stage, no
stream end, no host-local read (``note_read`` touches its folder) and no write, and never while
one of its streams is staged.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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
    InsufficientBuffersError,
    MapOutputLostError,
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
    check_private_dir,
    make_private_dir,
    private_root,
    resolve_inside,
    write_private_atomic,
)
from arrow_shuffle.transport import Transport
from arrow_shuffle.writer import RecordWriter
from heartbeat.clock import SYSTEM_CLOCK, Clock
from spark_plugin.shuffle.local_secret import SecretDesk
from spark_plugin.shuffle.map_output import Segment, read_segments

log = logging.getLogger(__name__)

STREAM_POOL_SHARE = 0.25
"""Most of the agent's pool one staged stream may hold (less if the config says so): with 32 MiB,
eight buffers, so a stream whose reader is slow leaves the rest to the others."""
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
        Operation(
            "report_lost",
            Record({"shuffle": Int(0, I32), "paths": List(Str(4096, 1), 1 << 12)}),
            Int(0, 1),
        ),
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


LOCAL_DIRS_ENV = "SPARK_LOCAL_DIRS"
"""What PySpark sets, in every Python worker's environment, to its executor's block manager
folders (comma-separated, the same list and order the JVM plugin hands the agent)."""
ROOT_FOLDER = "arrowbeat"
"""Our folder in each of Spark's local directories."""


def shuffle_roots(configured: str = "", local_dirs: str | None = None) -> list[str]:
    """The shuffle roots of this executor, the first one preferred.

    ``spark.arrowbeat.shuffle.dir`` if set (one root, the same path on every host); else
    ``arrowbeat/`` in each of Spark's local directories of this executor: ``local_dirs`` as the JVM
    handed them to the agent, or ``$SPARK_LOCAL_DIRS`` in a Python worker (PySpark's own setting);
    else (a process Spark did not start, e.g. a test) ``default_root()``. The one place roots are
    resolved, called where they are used, so each process resolves them as the user it runs as."""
    if configured:
        return [os.path.abspath(configured)]
    listed = os.environ.get(LOCAL_DIRS_ENV, "") if local_dirs is None else local_dirs
    roots = [os.path.join(os.path.abspath(d), ROOT_FOLDER) for d in listed.split(",") if d.strip()]
    return list(dict.fromkeys(roots)) or [default_root()]


def shuffle_root(configured: str = "") -> str:
    """The preferred root of ``shuffle_roots``."""
    return shuffle_roots(configured)[0]


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


def usable_executor_dirs(roots: Sequence[str], app_id: str, executor_id: str) -> list[tuple[str, str]]:
    """``(root, executor_dir)`` for every root that can hold this executor's outputs, in order.

    Of several, a root that is missing and cannot be created, not writable, or not safe is skipped
    with a warning naming it (Spark skips a bad local dir the same way); none usable is an error
    naming each and why. A single root's problem is raised as it is (``UnsafePathError``, ...)."""
    usable, problems = [], []
    for root in roots:
        if len(roots) == 1:
            return [(os.path.abspath(root), executor_dir(root, app_id, executor_id))]
        try:
            folder = executor_dir(root, app_id, executor_id)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(f"{folder} is not writable")
            usable.append((os.path.abspath(root), folder))
        except UnsafeIdError:
            raise
        except (OSError, UnsafePathError) as exc:
            problems.append(f"{root}: {exc}")
            log.warning("shuffle root %s not used on executor %s: %s", root, executor_id, exc)
    if not usable:
        raise ShuffleConfigError(
            f"no usable shuffle directory for executor {executor_id}: {'; '.join(problems)}; "
            "check Spark's local dirs (spark.local.dir, SPARK_LOCAL_DIRS) or spark.arrowbeat.shuffle.dir"
        )
    return usable


PORT_TRIES = 32
"""Ports ``bind_from`` tries from the configured one: two per agent, so 16 executors per host."""
_S = TypeVar("_S")


def bind_from(port: int, bind: Callable[[int], _S], last: int = 0) -> _S:
    """``bind(port)``, or with the next port while the port is taken, up to ``last`` (default
    ``port + PORT_TRIES - 1``, so an agent's two ports stay in the window a firewall opens); port
    0 (any free port) is bound once. The error names the range and the key that sets it."""
    if port == 0:
        return bind(0)
    end = min(last or port + PORT_TRIES - 1, 65535) + 1
    for candidate in range(port, end):
        try:
            return bind(candidate)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise ShuffleConfigError(
        f"no free port in {port}..{end - 1} for the shuffle agent (spark.arrowbeat.shuffle.port): "
        "too many executors on this host, or the ports are taken by others"
    )


def spread_dir(dirs: Sequence[str], shuffle_id: int, map_index: int) -> str:
    """The directory of ``dirs`` a map output of (shuffle, map partition) goes to: a stable hash,
    so a shuffle's files spread over every local disk the executor has."""
    return dirs[zlib.crc32(f"{shuffle_id}/{map_index}".encode()) % len(dirs)]


def owned_output(path: object, app_id: str, executor_id: str, shuffle_id: int) -> str:
    """The real path of a map-output file named by a status row, if, links resolved, it has our
    layout ``<root>/<app>/<executor>/s<shuffle>/<name>.arrows``, is a regular file, and its shuffle
    and executor folders are private to us. A host-local reader reads another executor's file only
    through this: a row naming anything else is refused (``UnsafePathError``), not read. (The root
    itself may sit behind a link, as a YARN or macOS local dir often does.)"""
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise UnsafePathError(f"{path!r} is not an absolute map-output path")
    real = os.path.realpath(path)
    shuffle_folder = os.path.dirname(real)
    owner = os.path.dirname(shuffle_folder)
    expected = (_folder(shuffle_id), check_id(executor_id, "executor id"), check_id(app_id, "application id"))
    found = (
        os.path.basename(shuffle_folder),
        os.path.basename(owner),
        os.path.basename(os.path.dirname(owner)),
    )
    refused = UnsafePathError(
        f"{path} is not a map output of shuffle {shuffle_id} of executor {executor_id}: refused"
    )
    if found != expected or not real.endswith(".arrows"):
        raise refused
    try:
        if not stat.S_ISREG(os.lstat(real).st_mode):
            raise refused
    except FileNotFoundError:
        pass  # gone: the read fails and reports it lost
    check_private_dir(shuffle_folder)
    check_private_dir(owner)
    return real


@dataclass
class _Staged:
    partition: ResultPartition
    shuffle_id: int
    started: float
    """``clock.monotonic()`` when the stream was staged."""
    thread: threading.Thread
    error: BaseException | None = None


def note_read(path: str, clock: Clock = SYSTEM_CLOCK) -> None:
    """A reducer read map-output file ``path`` straight from disk (host-local): its shuffle folder's
    times are set to ``clock.time()``, so the owning agent's TTL counts the read. Best effort."""
    now = clock.time()
    with contextlib.suppress(OSError):
        os.utime(os.path.dirname(path), (now, now), follow_symlinks=False)


class MapOutputService:
    """Map-output directory, staged streams and control channel of one executor agent."""

    def __init__(
        self,
        app_id: str,
        executor_id: str,
        secret: str | bytes,
        root: str | Sequence[str],
        jvm_pid: int,
        host: str = "127.0.0.1",
        config: ShuffleConfig | None = None,
        ttl_s: float = 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        transport: Transport | None = None,
        on_outputs_lost: Callable[[str], None] | None = None,
        port: int = 0,
    ) -> None:
        """``port``: 0 for free ports, else the first of the range the data and then the control
        server take the first free ports of (``bind_from``: pinned ports for firewalls).
        ``root``: the shuffle root, or this executor's roots (``shuffle_roots``; unusable ones
        skipped). ``transport``: how the data and control servers accept (TLS when it carries a server
        context, see ``TcpTransport``); plain TCP by default. ``on_outputs_lost(reason)`` is called
        (once per service, from a control thread) when map-output files of ours are found missing;
        ``reason`` is a token, ``"files-missing"``."""
        if not as_bytes(secret):
            raise ShuffleConfigError("the map-output service needs the application secret")
        self.app_id = app_id
        self.executor_id = executor_id
        usable = usable_executor_dirs([root] if isinstance(root, str) else root, app_id, executor_id)
        self.root = usable[0][0]
        """The root holding the discovery file and ``dir``."""
        self.jvm_pid = jvm_pid
        self.ttl_s = ttl_s
        self._on_outputs_lost = on_outputs_lost
        self._lost_reported = False
        self._deleted: set[int] = set()
        """Shuffles whose outputs this agent deleted on purpose (release, TTL): their files are
        gone, but not *lost*; a reader of one gets an error, and the executor is not replaced."""
        self._clock = clock
        self.dir = usable[0][1]
        self.dirs = tuple(folder for _, folder in usable)
        """Every directory map outputs of this executor may be in (``dir`` first)."""
        # Staged streams never wait on the reader for long stretches by design, but a reducer may
        # run a slow user function between batches: a generous bound, not a hang.
        config = config or ShuffleConfig(network_memory_bytes=32 << 20)
        self.config = config.replace(
            spill_dir=self.dir,
            buffer_request_timeout_s=900.0,
            partition_pool_share=min(config.partition_pool_share, STREAM_POOL_SHARE),
        )
        self.pool = NetworkBufferPool.from_config(self.config.network_memory_bytes, self.config.buffer_size)
        self.server = bind_from(
            port, lambda p: PartitionServer(secret, app_id, host, p, self.config, transport)
        )
        self._lock = threading.Lock()
        self._staged: dict[PartitionId, _Staged] = {}
        self._next_token = 1
        self._closed = False
        self.closed = threading.Event()
        """Set by ``close()``; background loops wait on it."""
        self._last_read: dict[str, float] = {}
        """Shuffle folder name -> ``clock.monotonic()`` of its last stage or stream end (the TTL
        counts reads)."""
        self._counters = {
            "streams_staged": 0.0,
            "bytes_staged": 0.0,
            "blocked_on_credit_s": 0.0,
            "spill_bytes": 0.0,
            "shuffles_released": 0.0,
            "streams_expired": 0.0,
            "streams_wait_timeouts": 0.0,
        }
        self._threads: list[threading.Thread] = []
        try:  # the control port: the next free one after the data port, inside the same window
            self.control = bind_from(
                port and self.server.address[1] + 1,
                lambda p: self._control_server(secret, host, p, clock, transport),
                last=port + PORT_TRIES - 1,
            )
        except BaseException:
            self.server.close()
            raise
        self._desk: SecretDesk | None = None
        if jvm_pid > 1:  # workers of plans without a secret (Spark Connect) ask for it here
            try:
                self._desk = SecretDesk(secret, jvm_pid)
            except OSError as exc:
                log.warning("no secret desk for this executor's workers (Connect shuffles fail): %s", exc)
        self._reaper = threading.Thread(target=self._reap_loop, name="shuffle-stage-reaper", daemon=True)
        self._reaper.start()
        self._announce()

    def _control_server(
        self, secret: str | bytes, host: str, port: int, clock: Clock, transport: Transport | None
    ) -> ControlServer:
        return ControlServer(
            secret,
            AGENT_CONTROL,
            {
                "stage": self._stage,
                "unstage": self._unstage,
                "release": self._release,
                "metrics": self._metrics,
                "report_lost": self._report_lost,
            },
            host,
            port,
            config=self.config,
            max_connections=128,
            clock=clock,
            transport=transport,
            logger=log,
        )

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
            "spread": list(self.dirs[1:]),
            "pid": os.getpid(),
        }
        if self._desk is not None:
            info["secret_socket"] = self._desk.name
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
            files = [(self._inside(path), segments) for path, segments in files]
        except UnsafePathError as exc:
            _refused.warning(self.dir, "refused to stage map outputs: %s", exc)
            raise
        missing = self._missing(path for path, _ in files)
        if missing:
            self._outputs_lost(shuffle_id, missing)
            raise MapOutputLostError(
                f"map outputs {missing[:3]}{' ...' if len(missing) > 3 else ''} of shuffle {shuffle_id} "
                f"are gone from executor {self.executor_id}"
            )
        with self._lock:
            if self._closed:
                raise ShuffleError("the map-output service is closed")
            token = self._next_token
            self._next_token += 1
        pid = PartitionId(self.app_id, shuffle_id, reducer, token)
        # No buffers yet: the stream's thread queues for them (stage never fails for lack of them).
        partition = ResultPartition(
            pid,
            1,
            schema,
            self.pool,
            PartitionKind.PIPELINED,
            self.config,
            clock=self._clock,
            reserve_now=False,
        )
        self.server.register(partition)
        thread = threading.Thread(target=self._fill, args=(pid, partition, list(files)), daemon=True)
        with self._lock:
            now = self._clock.monotonic()
            self._staged[pid] = _Staged(partition, shuffle_id, now, thread)
            self._last_read[_folder(shuffle_id)] = now
            self._counters["streams_staged"] += 1
        thread.start()
        return pid

    def _fill(
        self, pid: PartitionId, partition: ResultPartition, files: list[tuple[str, list[Segment]]]
    ) -> None:
        try:
            partition.reserve_buffers()
        except InsufficientBuffersError as exc:
            with self._lock:
                self._counters["streams_wait_timeouts"] += 1
            reason = (
                f"the shuffle agent of executor {self.executor_id} queued this stream for "
                f"{self.config.buffer_reserve_timeout_s:g}s and got no buffers from its "
                f"{self.pool.num_segments * self.pool.segment_size >> 20} MiB pool "
                f"(spark.arrowbeat.shuffle.agentMemory): {exc}"
            )
            self._end_early(pid, partition, exc, reason)
            return
        except ShuffleError as exc:  # released (unstaged, expired, closed) while queued
            self._end_early(pid, partition, exc, f"the stream was released while queued for buffers: {exc}")
            return
        writer = RecordWriter(partition)
        try:
            for path, segments in files:
                for batch in read_segments(path, segments):
                    writer.write(batch, subpartition=0)
            writer.finish()
            with self._lock:
                stats = partition.stats()
                self._counters["bytes_staged"] += stats.bytes_written
                self._counters["blocked_on_credit_s"] += stats.blocked_on_credit_s
                self._counters["spill_bytes"] += stats.spill_bytes
        except BaseException as exc:  # the reader went away, a file was released, ...: end the stream
            writer.abort(f"staging the map outputs failed: {exc}")  # the reader is told why
            self._end_early(pid, partition, exc, "")

    def _end_early(
        self, pid: PartitionId, partition: ResultPartition, exc: BaseException, reason: str
    ) -> None:
        """The stream ends without its data: the reader is told ``reason`` (if not told already)."""
        if reason:
            partition.fail(f"staging the map outputs failed: {reason}")
        with self._lock:
            staged = self._staged.get(pid)
            if staged is not None:
                staged.error = exc
        log.info("staged stream %s ended early: %s", pid, reason or exc)
        self.server.release(pid)

    def unstage(self, pid: PartitionId) -> None:
        with self._lock:
            staged = self._staged.pop(pid, None)
            if staged is not None:
                self._last_read[_folder(staged.shuffle_id)] = self._clock.monotonic()
        if staged is not None:
            self.server.release(pid)
            staged.thread.join(timeout=5)

    def expire_stages(self) -> int:
        """Free the stages nobody connected to within ``peer_timeout_s`` of staging (their reducer
        died or gave up in between), and forget streams that ended without an ``unstage``
        (reader handed its end, or the stream failed); returns how many stages expired."""
        now = self._clock.monotonic()
        expired, ended = [], []
        with self._lock:
            for pid, staged in self._staged.items():
                partition = staged.partition
                if partition.released or partition.consumed:
                    ended.append(pid)
                elif not partition.connected and now - staged.started >= self.config.peer_timeout_s:
                    expired.append(pid)
            self._counters["streams_expired"] += len(expired)
        for pid in expired:
            log.info(
                "staged stream %s expired: no reader connected within %gs", pid, self.config.peer_timeout_s
            )
            self.unstage(pid)
        for pid in ended:
            self.unstage(pid)
        return len(expired)

    def _next_expiry_s(self) -> float:
        """Real seconds until the next stage may expire, re-read at least every ``peer_timeout_s / 4``
        (a ``ManualClock`` moved by a test is noticed that soon)."""
        tick = self.config.peer_timeout_s / 4
        now = self._clock.monotonic()
        with self._lock:
            deadlines = [
                s.started + self.config.peer_timeout_s - now
                for s in self._staged.values()
                if not s.partition.connected
            ]
        return max(0.01, min([tick, *deadlines]))

    def _reap_loop(self) -> None:
        while not self.closed.wait(self._next_expiry_s()):
            try:
                self.expire_stages()
            except Exception:  # a bug must not end the reaper silently
                log.exception("expiring staged streams failed")

    def release_shuffle(self, shuffle_id: int) -> int:
        """Drop every staged stream and map output of ``shuffle_id``; returns the bytes deleted."""
        with self._lock:
            pids = [p for p, s in self._staged.items() if s.shuffle_id == shuffle_id]
            self._counters["shuffles_released"] += 1
        for pid in pids:
            self.unstage(pid)
        with self._lock:
            self._last_read.pop(_folder(shuffle_id), None)
            self._deleted.add(shuffle_id)
        return sum(_remove_tree(os.path.join(folder, _folder(shuffle_id))) for folder in self.dirs)

    def _inside(self, path: object) -> str:
        """The real path of ``path`` if it lies in one of this agent's directories."""
        for folder in self.dirs[1:]:
            with contextlib.suppress(UnsafePathError):
                return resolve_inside(folder, path)
        return resolve_inside(self.dir, path)

    def sweep(self) -> int:
        """TTL: delete the map outputs of shuffles idle for ``ttl_s``; returns the bytes freed.

        Idle means no stage and no stream end (monotonic, seen by this process), and no write or
        host-local read (``note_read``) since: wall time against the folder's and files' newest
        modification time, the only clock the file system keeps. A shuffle with a staged stream
        is in use and never swept, however old."""
        names: set[str] = set()
        for folder in self.dirs:
            with contextlib.suppress(FileNotFoundError):
                names.update(n for n in os.listdir(folder) if n.startswith("s"))
        freed = 0
        for name in sorted(names):
            paths = [os.path.join(folder, name) for folder in self.dirs]
            with self._lock:
                busy = any(_folder(s.shuffle_id) == name for s in self._staged.values())
                last_read = self._last_read.get(name)
            if busy:
                continue
            # One shuffle, one age: its folders on every local dir count together.
            idle = self._clock.time() - max(_newest_mtime(p) for p in paths)
            if last_read is not None:
                idle = min(idle, self._clock.monotonic() - last_read)
            if idle > self.ttl_s:
                with self._lock:
                    self._last_read.pop(name, None)
                    with contextlib.suppress(ValueError):
                        self._deleted.add(int(name[1:]))
                freed += sum(_remove_tree(p) for p in paths)
        return freed

    def report_lost(self, shuffle_id: int, paths: Sequence[str]) -> bool:
        """A reducer's stream from here failed: whether any of ``paths`` (inside this agent's
        directory, else ``UnsafePathError`` before any is looked at) is missing; if so
        ``on_outputs_lost`` is told."""
        try:
            real = [self._inside(path) for path in paths]
        except UnsafePathError as exc:
            _refused.warning(self.dir, "refused a report of lost map outputs: %s", exc)
            raise
        missing = self._missing(real)
        return bool(missing) and self._outputs_lost(shuffle_id, missing)

    @staticmethod
    def _missing(paths: Iterable[str]) -> list[str]:
        missing = []
        for path in paths:
            try:
                os.stat(path)
            except OSError:
                missing.append(path)
        return missing

    def _outputs_lost(self, shuffle_id: int, missing: list[str]) -> bool:
        """Whether ``missing`` are lost (and the JVM told), not deleted here on purpose."""
        with self._lock:
            deleted = shuffle_id in self._deleted
        if deleted:  # released or swept here: gone on purpose, nothing for Spark to recompute
            log.warning(
                "a reader asked for map outputs of shuffle %s, which this agent released or swept "
                "(spark.arrowbeat.shuffle.ttl): %s",
                shuffle_id,
                missing[:5],
            )
            return False
        log.warning(
            "map outputs of shuffle %s are gone from executor %s: %s",
            shuffle_id,
            self.executor_id,
            missing[:5],
        )
        with self._lock:
            first, self._lost_reported = not self._lost_reported, True
        if first and self._on_outputs_lost is not None:
            try:
                self._on_outputs_lost("files-missing")
            except Exception:  # the caller's hook must not turn a lost file into a hung stage
                log.exception("on_outputs_lost failed")
        return True

    def disk_bytes(self) -> int:
        total = 0
        for top in self.dirs:
            for folder, _, files in os.walk(top):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.path.getsize(os.path.join(folder, name))
        return total

    def metrics(self) -> dict[str, float]:
        """Heartbeat payload figures: buffer pool, staged streams, map-output disk use."""
        with self._lock:
            staged = len(self._staged)
            counters = dict(self._counters)
        pool = self.pool
        available = pool.num_available
        figures = {
            "shuffle_pool_segments": float(pool.num_segments),
            "shuffle_pool_available": float(available),
            "shuffle_pool_used_bytes": float((pool.num_segments - available) * pool.segment_size),
            "shuffle_streams_open": float(staged),
            "shuffle_streams_waiting": float(pool.queued),
            "shuffle_streams_queued": float(pool.reservations_queued),
            "shuffle_streams_waiting_max": float(pool.queue_peak),
            "shuffle_stream_wait_max_s": pool.reservation_wait_max_s,
            "shuffle_stream_wait_total_s": pool.reservation_wait_total_s,
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
        if self._desk is not None:
            self._desk.close()
        self.control.close()
        for pid in pids:
            self.unstage(pid)
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(agent_file(self.root, self.app_id, self.jvm_pid))
        for mine in self.dirs:
            _remove_tree(mine)
        # The application's folders go with its last agent (rmdir fails while others remain).
        for folder in (
            os.path.dirname(agent_file(self.root, self.app_id, 0)),
            *(os.path.dirname(mine) for mine in self.dirs),
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

    def _report_lost(self, args: dict[str, Any]) -> int:
        return int(self.report_lost(args["shuffle"], args["paths"]))


def _folder(shuffle_id: int) -> str:
    """A shuffle's folder in an executor's directory (the map tasks write into it)."""
    return f"s{check_id(shuffle_id, 'shuffle id')}"


def _newest_mtime(path: str) -> float:
    """Newest modification time in ``path``'s tree; ``-inf`` if it does not exist."""
    try:
        newest = os.lstat(path).st_mtime
    except FileNotFoundError:
        return float("-inf")
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
