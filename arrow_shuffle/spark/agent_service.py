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
- the control channel (``multiprocessing.connection`` with the application secret as authkey:
  an HMAC challenge both ways before any message is read) for stage / unstage / release /
  metrics, spoken by ``agent_client.MapOutputClient``;
- a discovery file ``<root>/<app>/agents/<jvm pid>.json`` so Python workers, children of the
  same executor JVM, find it by walking their parent chain (``agent_client.find_agent``).

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
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from typing import Any

import pyarrow as pa

from arrow_shuffle.auth import as_bytes
from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import PartitionKind, ResultPartition
from arrow_shuffle.partition_server import PartitionServer
from arrow_shuffle.spark.map_output import Segment, read_segments
from arrow_shuffle.writer import RecordWriter
from heartbeat.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)


def default_root() -> str:
    """Where shuffle data goes unless ``spark.arrowbeat.shuffle.dir`` says otherwise."""
    return os.path.join(tempfile.gettempdir(), "arrowbeat-shuffle")


def safe_name(text: str) -> str:
    """A path component from an id (application and executor ids come from Spark)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text) or "_"


def app_dir(root: str, app_id: str) -> str:
    return os.path.join(root, safe_name(app_id))


def agent_file(root: str, app_id: str, jvm_pid: int) -> str:
    return os.path.join(app_dir(root, app_id), "agents", f"{jvm_pid}.json")


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
    ) -> None:
        if not as_bytes(secret):
            raise ShuffleConfigError("the map-output service needs the application secret")
        self.app_id = app_id
        self.executor_id = executor_id
        self.root = root
        self.jvm_pid = jvm_pid
        self.ttl_s = ttl_s
        self._clock = clock
        self.dir = os.path.join(app_dir(root, app_id), safe_name(executor_id))
        os.makedirs(self.dir, exist_ok=True)
        # Staged streams never wait on the reader for long stretches by design, but a reducer may
        # run a slow user function between batches: a generous bound, not a hang.
        self.config = (config or ShuffleConfig(network_memory_bytes=32 << 20)).replace(
            spill_dir=self.dir, buffer_request_timeout_s=900.0
        )
        self.pool = NetworkBufferPool.from_config(self.config.network_memory_bytes, self.config.buffer_size)
        self.server = PartitionServer(secret, app_id, host, 0, self.config)
        self._listener = Listener((host, 0), authkey=as_bytes(secret))
        self._lock = threading.Lock()
        self._staged: dict[PartitionId, _Staged] = {}
        self._next_token = 1
        self._closed = False
        self.closed = threading.Event()
        """Set by ``close()``; background loops wait on it."""
        self._counters = {"streams_staged": 0.0, "bytes_staged": 0.0, "shuffles_released": 0.0}
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._accept_loop, name="shuffle-control", daemon=True)
        self._accept.start()
        self._announce()

    # -- addresses ------------------------------------------------------------------------------
    @property
    def data_address(self) -> tuple[str, int]:
        return self.server.address

    @property
    def control_address(self) -> tuple[str, int]:
        address: tuple[str, int] = self._listener.address
        return address

    def _announce(self) -> None:
        info = {
            "executor_id": self.executor_id,
            "host": self.data_address[0],
            "data_port": self.data_address[1],
            "control_port": self.control_address[1],
            "dir": self.dir,
            "pid": os.getpid(),
        }
        path = agent_file(self.root, self.app_id, self.jvm_pid)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, path)  # atomic: a worker never reads half a file

    # -- operations (also called directly by tests) ---------------------------------------------
    def stage(
        self, shuffle_id: int, reducer: int, schema: pa.Schema, files: Sequence[tuple[str, Sequence[Segment]]]
    ) -> PartitionId:
        """Open a stream of ``reducer``'s rows from ``files``; returns the id to request it by."""
        for path, _ in files:
            real = os.path.realpath(path)
            if not real.startswith(os.path.realpath(self.dir) + os.sep):
                raise ShuffleError(f"map output {path} is not in this agent's directory {self.dir}")
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
        return _remove_tree(os.path.join(self.dir, f"s{shuffle_id}"))

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
        with contextlib.suppress(OSError):
            self._listener.close()
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

    # -- control channel ------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:
                if self._closed:
                    return
                continue
            except Exception as exc:  # multiprocessing.AuthenticationError and friends
                log.warning("refused a shuffle control connection: %s", exc)
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while not self._closed:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    reply: tuple[str, Any] = ("ok", self._dispatch(request))
                except Exception as exc:
                    reply = ("error", f"{type(exc).__name__}: {exc}")
                try:
                    conn.send(reply)
                except OSError:
                    return

    def _dispatch(self, request: tuple[Any, ...]) -> Any:
        op = request[0]
        if op == "stage":
            _, shuffle_id, reducer, schema_ipc, files = request
            schema = pa.ipc.read_schema(pa.py_buffer(schema_ipc))
            return self.stage(shuffle_id, reducer, schema, files).to_wire()
        if op == "unstage":
            self.unstage(PartitionId.from_wire(request[1]))
            return None
        if op == "release":
            return self.release_shuffle(int(request[1]))
        if op == "metrics":
            return self.metrics()
        raise ShuffleError(f"unknown shuffle control request {op!r}")


def _shuffle_of(name: str) -> int:
    try:
        return int(name[1:])
    except ValueError:
        return -1


def _newest_mtime(path: str) -> float:
    newest = os.path.getmtime(path)
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                newest = max(newest, os.path.getmtime(os.path.join(folder, name)))
    return newest


def _remove_tree(path: str) -> int:
    freed = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                freed += os.path.getsize(os.path.join(folder, name))
    shutil.rmtree(path, ignore_errors=True)
    return freed
