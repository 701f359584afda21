"""Streams staged for reduce tasks on other executors: the executor agent's file -> network path.

A reduce task on another executor asks (``stage``, over the agent's control channel) for "reduce
partition r of these map outputs"; a PIPELINED one-subpartition ``ResultPartition`` is opened on
the agent's ``PartitionServer`` and a thread fills it from the files, so the path is bounded by
the partition's buffers and paced by the reader's credits (a slow reducer stalls the filler, never
memory). ``open`` answers at once and takes no buffers; the stream's thread queues for its
reserved buffers in the agent's pool, first come first served, for up to
``buffer_reserve_timeout_s`` (then the reader is told what it waited for), and holds at most
``STREAM_POOL_SHARE`` of the pool. A stage nobody connected to within ``peer_timeout_s`` (a reducer
that died in between) is freed by the reaper; so is a stream whose reader was handed its end but
never unstaged it, and one whose reader went away after the whole stream was queued
(``abandoned``: nothing else would ever end it, and a staged stream keeps its shuffle from the TTL).

The books are the service's (``MapOutputService``): its lock, its counters and its last-read
times, shared by reference; which files may be served, and what is lost, the service decides
before a stream is opened. A map output found damaged while streamed is the service's
``report_corrupt`` (its removal and recompute arranged) and the stream ends with the error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import CorruptDataError, InsufficientBuffersError, ShuffleError
from arrow_shuffle.ids import PartitionId
from arrow_shuffle.partition import ResultPartition
from arrow_shuffle.partition_server import PartitionServer
from arrow_shuffle.writer import RecordWriter
from arrowbeat_base.clock import Clock
from spark_plugin.shuffle.agent_layout import shuffle_folder
from spark_plugin.shuffle.map_output import read_segments

log = logging.getLogger("spark_plugin.shuffle.agent.service")

STREAM_POOL_SHARE = 0.25
"""Most of the agent's pool one staged stream may hold (less if the config says so): with 32 MiB,
eight buffers, so a stream whose reader is slow leaves the rest to the others."""


@dataclass
class _Staged:
    partition: ResultPartition
    shuffle_id: int
    started: float
    """``clock.monotonic()`` when the stream was staged."""
    thread: threading.Thread
    error: BaseException | None = None
    drained_since: float | None = None
    """``clock.monotonic()`` when the reaper first saw the stream ``_drained``; None while not."""


def _drained(partition: ResultPartition) -> bool:
    """Whole stream queued, queue empty, and its end not taken: a live reader takes the end at
    once (it needs no credit), so this lasts only while the last buffer is being sent (a send is
    bounded by ``peer_timeout_s``); past that, the reader went away and the server dropped the
    queue (it does, for a reader that leaves before the end)."""
    return (
        partition.finished
        and partition.connected
        and not partition.consumed
        and all(sub.backlog == 0 for sub in partition.subpartitions)
    )


class StagedStreams:
    """The staged streams of one executor agent, and their reaper."""

    def __init__(
        self,
        app_id: str,
        executor_id: str,
        server: PartitionServer,
        pool: NetworkBufferPool,
        config: ShuffleConfig,
        clock: Clock,
        lock: threading.Lock,
        counters: dict[str, float],
        last_read: dict[str, float],
        report_corrupt: Callable[[int, str, str], Any],
    ) -> None:
        self.app_id = app_id
        self.executor_id = executor_id
        self.server = server
        self.pool = pool
        self.config = config
        self._clock = clock
        self._lock = lock
        self._counters = counters
        self._last_read = last_read
        self.report_corrupt = report_corrupt
        self._staged: dict[PartitionId, _Staged] = {}
        self._next_token = 1
        self._closed = False

    def open(
        self,
        shuffle_id: int,
        reducer: int,
        schema: pa.Schema,
        files: Sequence[tuple[str, Sequence[Sequence[Any]]]],
    ) -> PartitionId:
        """Open a stream of ``reducer``'s rows from ``files`` (real paths the service checked);
        returns the id to request it by."""
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
            self.config,
            clock=self._clock,
            reserve_now=False,
        )
        self.server.register(partition)
        thread = threading.Thread(target=self._fill, args=(pid, partition, list(files)), daemon=True)
        with self._lock:
            now = self._clock.monotonic()
            self._staged[pid] = _Staged(partition, shuffle_id, now, thread)
            self._last_read[shuffle_folder(shuffle_id)] = now
            self._counters["streams_staged"] += 1
        thread.start()
        return pid

    def _fill(
        self, pid: PartitionId, partition: ResultPartition, files: list[tuple[str, Sequence[Sequence[Any]]]]
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
                f"(spark.arrowbeat.shuffle.agentMemory; the wait is "
                f"spark.arrowbeat.shuffle.bufferReserveTimeout): {exc}"
            )
            self._end_early(pid, partition, exc, reason)
            return
        except ShuffleError as exc:  # released (unstaged, expired, closed) while queued
            self._end_early(pid, partition, exc, f"the stream was released while queued for buffers: {exc}")
            return
        writer = RecordWriter(partition)
        try:
            for path, segments in files:
                try:
                    for batch in read_segments(path, segments, schema=partition.schema):
                        writer.write(batch, subpartition=0)
                except CorruptDataError as exc:  # never read again: removed, its recompute arranged
                    self.report_corrupt(pid.shuffle_id, path, str(exc))
                    raise
            writer.finish()
            with self._lock:
                stats = partition.stats()
                self._counters["bytes_staged"] += stats.bytes_written
                self._counters["blocked_on_credit_s"] += stats.blocked_on_credit_s
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
                self._last_read[shuffle_folder(staged.shuffle_id)] = self._clock.monotonic()
        if staged is not None:
            self.server.release(pid)
            staged.thread.join(timeout=5)

    def expire_stages(self) -> int:
        """Free the stages nobody connected to within ``peer_timeout_s`` of staging (their reducer
        died or gave up in between) and those whose reader went away after the whole stream was
        queued (``_drained`` for ``peer_timeout_s``: no writer is left to notice), and forget
        streams that ended without an ``unstage`` (reader handed its end, or the stream failed);
        returns how many stages expired or were abandoned."""
        now = self._clock.monotonic()
        timeout = self.config.peer_timeout_s
        expired, abandoned, ended = [], [], []
        with self._lock:
            for pid, staged in self._staged.items():
                partition = staged.partition
                if partition.released or partition.consumed:
                    ended.append(pid)
                elif not partition.connected and now - staged.started >= timeout:
                    expired.append(pid)
                elif not _drained(partition):
                    staged.drained_since = None
                elif staged.drained_since is None:
                    staged.drained_since = now
                elif now - staged.drained_since >= timeout:
                    abandoned.append(pid)
            self._counters["streams_expired"] += len(expired)
            self._counters["streams_abandoned"] += len(abandoned)
        for pid in expired:
            log.info("staged stream %s expired: no reader connected within %gs", pid, timeout)
            self.unstage(pid)
        for pid in abandoned:
            log.info(
                "staged stream %s abandoned: its reader went away before the end (not taken for %gs)",
                pid,
                timeout,
            )
            self.unstage(pid)
        for pid in ended:
            self.unstage(pid)
        return len(expired) + len(abandoned)

    def _next_expiry_s(self) -> float:
        """Real seconds until the next stage may expire, re-read at least every ``peer_timeout_s / 4``
        (a ``ManualClock`` moved by a test is noticed that soon)."""
        tick = self.config.peer_timeout_s / 4
        now = self._clock.monotonic()
        with self._lock:
            deadlines = [
                (s.started if s.drained_since is None else s.drained_since) + self.config.peer_timeout_s - now
                for s in self._staged.values()
                if not s.partition.connected or s.drained_since is not None
            ]
        return max(0.01, min([tick, *deadlines]))

    def reap_until(self, closed: threading.Event) -> None:
        """The reaper: expires stages (``expire_stages``) until ``closed`` is set."""
        while not closed.wait(self._next_expiry_s()):
            try:
                self.expire_stages()
            except Exception:  # a bug must not end the reaper silently
                log.exception("expiring staged streams failed")

    def of_shuffle(self, shuffle_id: int) -> list[PartitionId]:
        with self._lock:
            return [p for p, s in self._staged.items() if s.shuffle_id == shuffle_id]

    def busy_folders(self) -> set[str]:
        """The shuffle folders with a staged stream (in use: never swept). Call holding the lock."""
        return {shuffle_folder(s.shuffle_id) for s in self._staged.values()}

    def count(self) -> int:
        """Streams staged now. Call holding the lock."""
        return len(self._staged)

    def close(self) -> list[PartitionId]:
        """No stream opens from now on; returns the staged ones (to unstage). Call holding the lock."""
        self._closed = True
        return list(self._staged)
