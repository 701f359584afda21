"""``MapOutputService``: the executor agent's side of the DataFrame shuffle (materialized mode).

One per executor agent, living exactly as long as the agent (and so the executor JVM). It owns

- the directory map tasks of this executor write their map-output files into (``map_output``),
  deleted on ``release_shuffle``, on TTL expiry (``sweep``) and on ``close`` (the agent exits on
  its JVM's death, so an application's shuffle data dies with its executors);
- an engine ``PartitionServer`` (credit-based, HMAC-authenticated) serving *staged* streams to
  reduce tasks on other executors, filled from the files under the reader's credits, with their
  buffer queueing and their reaper (``staged_streams``; ``stage`` checks the files first);
- lost outputs: a ``stage`` naming a map-output file of ours that is gone fails at once, and a
  reducer whose stream failed asks ``report_lost``; either way ``on_outputs_lost`` (the JVM side,
  which has Spark drop this executor's map outputs so they are recomputed) is told, once. So is it
  for ``carried_lost``: this executor carries status rows of *another* executor's outputs (an
  adaptive shuffle's cached rows, read here when the locality wait ran out), and those outputs
  are lost: Spark drops the rows only with the executor that carries them (``map_task.carry_function``);
- the control channel: an engine ``control_server.ControlServer`` of ``agent_protocol.AGENT_CONTROL``
  (stage / unstage / release / metrics / report_lost / carried_lost, each a typed, size-capped JSON
  message checked against its schema, sealed with the connection's session key after the mutual
  HMAC handshake; nothing is unpickled), spoken by ``agent_client.MapOutputClient``;
- a discovery file ``<root>/<app>/agents/<jvm pid>.json`` so Python workers, children of the
  same executor JVM, find it by walking their parent chain (``agent_client.find_agent``);
- a secret desk (``local_secret.SecretDesk``, named in the discovery file) that hands the
  application secret to those workers only, for plans made without it (Spark Connect sessions).

Where its directories are (``shuffle_roots``: Spark's local directories of this executor, or
``spark.arrowbeat.shuffle.dir``) and how they are laid out and kept private: ``agent_layout``.
``stage`` serves only files whose real path is inside one of this agent's directories.

Time comes from an injected ``arrowbeat_base.clock.Clock``: ``monotonic()`` ages staged streams and
times a shuffle's last use; a test moves a ``ManualClock`` past the TTL instead of waiting an
hour. The TTL counts reads: a shuffle is forgotten after ``ttl_s`` with no stage, no stream end,
no host-local read (``note_read`` touches its folder) and no write, and never while one of its
streams is staged (which a dead reader's stream is not for long: ``expire_stages``). Writes and
host-local reads are seen as *changes* of the folder between two sweeps, dated on the monotonic
clock (``agent_ttl.FolderActivity``): a wall clock stepped forward deletes nothing early. What
outlives a shuffle is bounded: the ids deleted on purpose (``agent_ttl.DeletedShuffles``, the
newest exactly, older ones by a watermark) and nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.control_server import ControlServer
from arrow_shuffle.errors import (
    ControlMessageError,
    MapOutputLostError,
    ShuffleConfigError,
    UnsafePathError,
)
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition_server import PartitionServer
from arrow_shuffle.private_files import resolve_inside, write_private_atomic
from arrow_shuffle.transport import Transport
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog
from spark_plugin.shuffle.agent.corrupt_outputs import CorruptOutputs, Outcome, status_blocks_remover
from spark_plugin.shuffle.agent.staged_streams import STREAM_POOL_SHARE, StagedStreams
from spark_plugin.shuffle.agent.ttl import DeletedShuffles, FolderActivity
from spark_plugin.shuffle.agent_layout import agent_file, agent_identity, shuffle_folder, usable_executor_dirs
from spark_plugin.shuffle.agent_protocol import AGENT_CONTROL
from spark_plugin.shuffle.local_secret import SecretDesk

log = logging.getLogger(__name__)

_refused = RateLog(log)
"""Paths a peer asked for and did not get: logged, but not once per request."""


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
        spark_local_dirs: Sequence[str] = (),
        on_corrupt: Callable[[str], None] | None = None,
        spark_settings: Mapping[str, str] | None = None,
    ) -> None:
        """``port``: 0 for free ports, else the first of the range the data and then the control
        server take the first free ports of (``bind_from``: pinned ports for firewalls).
        ``root``: the shuffle root, or this executor's roots (``shuffle_roots``; unusable ones
        skipped). ``transport``: how the data and control servers accept (TLS when it carries a server
        context, see ``TcpTransport``); plain TCP by default. ``on_outputs_lost(reason)`` is called
        (once per service, from a control thread) when map-output files of ours are found missing;
        ``reason`` is a token, ``"files-missing"``. ``spark_local_dirs``: this executor's block
        manager folders, where the status rows of a damaged output are removed so that Spark
        recomputes it (``corrupt_outputs``), named as ``spark_settings`` say (the executor's Spark
        version and shuffle settings, ``compat.shuffle_blocks``); ``on_corrupt(detail)`` is told of
        each damaged output."""
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
        self.corrupt = CorruptOutputs(
            executor_id, spark_local_dirs, self._tell_jvm, on_corrupt, status_blocks_remover(spark_settings)
        )
        self._deleted = DeletedShuffles(self._on_disk)
        """Shuffles whose outputs this agent deleted on purpose (release, TTL): their files are
        gone, but not *lost*; a reader of one gets an error, and the executor is not replaced.
        Bounded: the newest ids exactly, older ones by a watermark (``agent_ttl``)."""
        self._activity = FolderActivity(clock)
        """When each shuffle folder last changed (writes, host-local reads), on the monotonic clock."""
        self._clock = clock
        self.dir = usable[0][1]
        self.dirs = tuple(folder for _, folder in usable)
        """Every directory map outputs of this executor may be in (``dir`` first)."""
        # Staged streams never wait on the reader for long stretches by design, but a reducer may
        # run a slow user function between batches: a generous bound, not a hang.
        config = config or ShuffleConfig(network_memory_bytes=32 << 20)
        self.config = config.replace(
            buffer_request_timeout_s=900.0,
            partition_pool_share=min(config.partition_pool_share, STREAM_POOL_SHARE),
        )
        self.pool = NetworkBufferPool.from_config(self.config.network_memory_bytes, self.config.buffer_size)
        self.server = bind_from(
            port, lambda p: PartitionServer(secret, app_id, host, p, self.config, transport)
        )
        self._lock = threading.Lock()
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
            "spill_bytes": 0.0,  # staged streams never spill; the JVM's shuffle.spillBytes reads 0
            "shuffles_released": 0.0,
            "streams_expired": 0.0,
            "streams_abandoned": 0.0,
            "streams_wait_timeouts": 0.0,
        }
        self.streams = StagedStreams(
            app_id,
            executor_id,
            self.server,
            self.pool,
            self.config,
            clock,
            self._lock,
            self._counters,
            self._last_read,
            self.report_corrupt,
        )
        """Streams staged for reducers on other executors (shares this service's lock and books)."""
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
        self._reaper = threading.Thread(
            target=self.streams.reap_until, args=(self.closed,), name="shuffle-stage-reaper", daemon=True
        )
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
                "carried_lost": self._carried_lost,
                "report_corrupt": self._report_corrupt,
                "corrupt_outputs": self._corrupt_outputs,
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
            **agent_identity(),  # trusted only while this very process runs
        }
        if self._desk is not None:
            info["secret_socket"] = self._desk.name
        # Atomic (temp name, then rename): a worker never reads half a file.
        write_private_atomic(agent_file(self.root, self.app_id, self.jvm_pid), json.dumps(info).encode())

    # -- operations (also called directly by tests) ---------------------------------------------
    def stage(
        self,
        shuffle_id: int,
        reducer: int,
        schema: pa.Schema,
        files: Sequence[tuple[str, Sequence[Sequence[Any]]]],
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
        return self.streams.open(shuffle_id, reducer, schema, files)

    def unstage(self, pid: PartitionId) -> None:
        self.streams.unstage(pid)

    def expire_stages(self) -> int:
        """Free stages nobody connected to or whose reader went away (``StagedStreams``)."""
        return self.streams.expire_stages()

    def release_shuffle(self, shuffle_id: int) -> int:
        """Drop every staged stream and map output of ``shuffle_id``; returns the bytes deleted."""
        pids = self.streams.of_shuffle(shuffle_id)
        with self._lock:
            self._counters["shuffles_released"] += 1
        for pid in pids:
            self.unstage(pid)
        with self._lock:
            self._last_read.pop(shuffle_folder(shuffle_id), None)
            self._deleted.add(shuffle_id)
        self._activity.forget(shuffle_folder(shuffle_id))
        return sum(_remove_tree(os.path.join(folder, shuffle_folder(shuffle_id))) for folder in self.dirs)

    def _inside(self, path: object) -> str:
        """The real path of ``path`` if it lies in one of this agent's directories."""
        for folder in self.dirs[1:]:
            with contextlib.suppress(UnsafePathError):
                return resolve_inside(folder, path)
        return resolve_inside(self.dir, path)

    def sweep(self) -> int:
        """TTL: delete the map outputs of shuffles idle for ``ttl_s``; returns the bytes freed.

        Idle means no stage and no stream end, and no write or host-local read (``note_read``)
        since: all on the monotonic clock of this process, the file system's part seen as a
        change of the shuffle's folders since the previous sweep (``agent_ttl.FolderActivity``;
        a sweep runs every ``min(60 s, ttl / 4)``). A shuffle with a staged stream is in use and
        never swept, however old."""
        names: set[str] = set()
        for folder in self.dirs:
            with contextlib.suppress(FileNotFoundError):
                names.update(n for n in os.listdir(folder) if n.startswith("s"))
        now, since = self._activity.look()
        self._activity.keep_only(names)
        freed = 0
        for name in sorted(names):
            paths = [os.path.join(folder, name) for folder in self.dirs]
            # One shuffle, one age: its folders on every local dir count together.
            changed = self._activity.last_change(name, paths, now, since)
            with self._lock:
                busy = name in self.streams.busy_folders()
                last_read = self._last_read.get(name, changed)
            if busy or now - max(changed, last_read) <= self.ttl_s:
                continue
            with self._lock:
                self._last_read.pop(name, None)
                with contextlib.suppress(ValueError):
                    self._deleted.add(int(name[1:]))
            self._activity.forget(name)
            freed += sum(_remove_tree(p) for p in paths)
        with self._lock:  # reads of shuffles whose folders went another way
            in_use = self.streams.busy_folders()
            for gone in [n for n in self._last_read if n not in names]:
                if gone not in in_use:
                    del self._last_read[gone]
        return freed

    def _on_disk(self, shuffle_id: int) -> bool:
        """Whether a folder of ``shuffle_id`` exists in one of this agent's directories."""
        name = shuffle_folder(shuffle_id)
        return any(os.path.lexists(os.path.join(folder, name)) for folder in self.dirs)

    def report_corrupt(self, shuffle_id: int, path: str, detail: str) -> Outcome:
        """A reader found the map output at ``path`` (inside this agent's directory, else
        ``UnsafePathError``) damaged: it is removed and its recompute arranged
        (``corrupt_outputs``); the answer says how. Idempotent per file."""
        try:
            real = self._inside(path)
        except UnsafePathError as exc:
            _refused.warning(self.dir, "refused a report of a damaged map output: %s", exc)
            raise
        with self._lock:
            released = shuffle_id in self._deleted
        return self.corrupt.handle(shuffle_id, real, detail, released=released)

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

    def carried_lost(self, shuffle_id: int, owners: Sequence[str]) -> bool:
        """Status rows this executor carries name map outputs of ``owners`` that are lost (a
        reducer found them gone or their agent unreachable): whether ``on_outputs_lost`` is told
        (``"rows-stale"``), so that Spark replaces this executor, drops the rows it carries and
        recomputes their map partitions. Not for a shuffle released or swept here (the query is
        over) nor for rows of this executor's own outputs (``report_lost`` checks those)."""
        with self._lock:
            deleted = shuffle_id in self._deleted
        if deleted or self.executor_id in owners:
            log.warning(
                "not taking stale status rows of shuffle %s (owners %s): %s",
                shuffle_id,
                list(owners)[:5],
                "released or swept here"
                if deleted
                else "this executor's own outputs are checked by report_lost",
            )
            return False
        log.warning(
            "executor %s carries status rows of shuffle %s naming lost map outputs of executors %s",
            self.executor_id,
            shuffle_id,
            list(owners)[:5],
        )
        self._tell_jvm("rows-stale")
        return True

    def _tell_jvm(self, reason: str) -> None:
        """``on_outputs_lost(reason)``, the first time only (one replacement is all it takes)."""
        with self._lock:
            first, self._lost_reported = not self._lost_reported, True
        if first and self._on_outputs_lost is not None:
            try:
                self._on_outputs_lost(reason)
            except Exception:  # the caller's hook must not turn a lost file into a hung stage
                log.exception("on_outputs_lost failed")

    def _outputs_lost(self, shuffle_id: int, missing: list[str]) -> bool:
        """Whether ``missing`` are lost (and the JVM told), not deleted here on purpose (released,
        swept, or found damaged: ``report_corrupt`` arranged those)."""
        missing = [path for path in missing if not self.corrupt.known(path)]
        if not missing:
            return False
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
        self._tell_jvm("files-missing")
        return True

    def disk_bytes(self) -> int:
        total = 0
        for top in self.dirs:
            for folder, _, files in os.walk(top):
                for name in files:
                    with contextlib.suppress(FileNotFoundError):
                        total += os.path.getsize(os.path.join(folder, name))
        return total

    def metrics(self, walk_disk: bool = True) -> dict[str, float]:
        """Heartbeat payload figures: buffer pool, staged streams, map-output disk use (left out
        with ``walk_disk=False``: the agent walks the disk off its heartbeat loop, ``agent_disk_usage``)."""
        with self._lock:
            staged = self.streams.count()
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
        }
        if walk_disk:
            figures["shuffle_disk_bytes"] = float(self.disk_bytes())
        figures.update({f"shuffle_{k}": v for k, v in counters.items()})
        figures["shuffle_outputs_corrupt"] = float(self.corrupt.count)
        return figures

    def close(self) -> None:
        """Stop serving and delete this executor's shuffle data and discovery file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pids = self.streams.close()
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

    def _carried_lost(self, args: dict[str, Any]) -> int:
        return int(self.carried_lost(args["shuffle"], args["owners"]))

    def _report_corrupt(self, args: dict[str, Any]) -> int:
        return int(self.report_corrupt(args["shuffle"], args["path"], args["detail"]))

    def _corrupt_outputs(self, args: dict[str, Any]) -> list[tuple[int, str, str]]:
        return [(c.map_partition, c.path, c.detail) for c in self.corrupt.of_shuffle(args["shuffle"])]


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
