"""``RecordWriter``: routes record batches to subpartitions and packs them into buffers.

Small batches are coalesced into the subpartition's open buffer; a buffer is handed to the
subpartition when the next batch does not fit (trigger one: full) or when the flusher thread's
``flush_timeout_s`` passes on the partition's clock (trigger two: timeout). Requesting a buffer
may block on the partition's pool: that is the backpressure a slow consumer exerts on the
producer.

A batch (or slice) that fills at least half a buffer on its own is not copied into a partition's
buffer: it is queued as an ``ArrowPayload`` of its IPC pieces, views of its own Arrow
memory, which the sender passes to ``sendmsg`` (one copy fewer). It still takes a buffer of the
pool, so backpressure and credit count it like any other. Arrow data is immutable; such a batch's
memory is referenced until it is sent, so memory wrapped zero-copy (a numpy array given to
``pa.array``) must not be modified after it was written.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from arrow_shuffle.buffer_pool import Buffer
from arrow_shuffle.codec import BufferBuilder, PayloadEncoder, schema_size, split_to_fit
from arrow_shuffle.errors import ChannelClosedError, SchemaMismatchError, ShuffleConfigError, ShuffleError
from arrow_shuffle.partition import ResultPartition
from arrow_shuffle.partitioner import Partitioner, hash_partitioner

_MAX_PACE_S = 0.5
"""Longest the flusher sleeps between looks at the clock (so a jumped test clock is seen soon)."""


class RecordWriter:
    """Writes batches into one ``ResultPartition``. Not thread-safe: one writing thread."""

    def __init__(
        self,
        partition: ResultPartition,
        key_columns: Sequence[str] | None = None,
        partitioner: Partitioner | None = None,
    ) -> None:
        if key_columns is not None and partitioner is not None:
            raise ShuffleConfigError("give key_columns or partitioner, not both")
        self.partition = partition
        self._route = hash_partitioner(key_columns) if key_columns is not None else partitioner
        self._usable = partition.config.buffer_size - schema_size(partition.schema)
        if self._usable <= 0:
            raise ShuffleConfigError(
                f"buffer_size={partition.config.buffer_size} cannot even hold the schema"
            )
        self._direct_from = self._usable // 2
        """Pieces at least this big are sent from the batch's memory, not copied (see the module)."""
        self._encoder = PayloadEncoder(partition.schema)
        self._builders: list[BufferBuilder | None] = [None] * partition.num_subpartitions
        self._lock = threading.Lock()
        self._closed = False
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        timeout = partition.config.flush_timeout_s
        if timeout > 0:
            self._flusher = threading.Thread(
                target=self._flush_loop,
                args=(timeout,),
                name=f"flusher-{partition.partition_id}",
                daemon=True,
            )
            self._flusher.start()

    # -- public ---------------------------------------------------------------------------------
    def write(self, batch: pa.RecordBatch, subpartition: int | None = None) -> None:
        """Append ``batch``: all of it to ``subpartition``, or each row where the partitioner says.

        A large batch of a PIPELINED partition is sent from its own memory: do not modify memory
        it wraps zero-copy afterwards (Arrow data is immutable; see the module docstring)."""
        self._check()
        if not batch.schema.equals(self.partition.schema):
            raise SchemaMismatchError(
                f"batch schema {batch.schema} differs from partition {self.partition.partition_id}'s "
                f"schema {self.partition.schema}"
            )
        n = self.partition.num_subpartitions
        if subpartition is not None:
            if not 0 <= subpartition < n:
                raise ShuffleConfigError(f"subpartition={subpartition} is out of range: allowed 0 <= x < {n}")
            self._emit(subpartition, batch)
        elif n == 1:
            self._emit(0, batch)
        elif self._route is None:
            raise ShuffleConfigError("this writer has no key_columns/partitioner: pass subpartition=")
        else:
            self._emit_routed(batch, self._route(batch, n))
        self.partition.record(batches_written=1, rows_written=batch.num_rows)

    def flush(self) -> None:
        """Hand every non-empty open buffer to its subpartition now."""
        self._check()
        self._flush_all()

    def finish(self) -> None:
        """Flush and mark the partition finished (consumers then see end-of-partition)."""
        self._check()
        self._stop_flusher()
        self._flush_all()
        self._closed = True
        self.partition.finish()

    def abort(self, reason: str = "its writer was aborted") -> None:
        """Cancel: return the open buffers without publishing them. Idempotent.

        Unless the partition was already finished, it is failed (``ResultPartition.fail``): its
        readers get ``ProducerFailedError`` at once instead of waiting for an end that never comes.
        """
        self._closed = True
        self._stop_flusher()
        with self._lock:
            builders, self._builders = self._builders, [None] * len(self._builders)
        for builder in builders:
            if builder is not None:
                builder.abandon()
        if not self.partition.finished:
            self.partition.fail(reason)

    # -- internals ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._error is not None:  # sticky: same error type on every call, chained to the original
            kind = type(self._error) if isinstance(self._error, ShuffleError) else ShuffleError
            message = f"the flusher of {self.partition.partition_id} failed: {self._error}"
            raise kind(message) from self._error
        if self._closed:
            raise ChannelClosedError(f"writer of {self.partition.partition_id} is finished or aborted")

    def _emit_routed(self, batch: pa.RecordBatch, ids: np.ndarray) -> None:
        n = self.partition.num_subpartitions
        counts = np.bincount(ids, minlength=n)
        if counts.max(initial=0) == batch.num_rows:
            self._emit(int(ids[0]), batch)
            return
        order = np.argsort(ids, kind="stable")
        grouped = batch.take(pa.array(order))
        offset = 0
        for sub in range(n):
            count = int(counts[sub])
            if count:
                self._emit(sub, grouped.slice(offset, count))
                offset += count

    def _emit(self, sub: int, batch: pa.RecordBatch) -> None:
        for piece, size in split_to_fit(batch, self._usable):
            if size >= self._direct_from:
                self._emit_direct(sub, piece)
                continue
            while True:
                with self._lock:
                    current = self._builders[sub]
                    if current is not None and current.remaining < size:
                        self._publish_locked(sub)
                        current = None
                    if current is not None:
                        current.append(piece)
                        break
                # Outside the lock: this may block on the pool while the flusher keeps flushing.
                fresh: BufferBuilder | None = BufferBuilder(
                    self.partition.request_buffer(), self.partition.schema
                )
                with self._lock:
                    if self._builders[sub] is None:
                        self._builders[sub], fresh = fresh, None
                if fresh is not None:
                    fresh.abandon()
        if self.partition.config.flush_timeout_s == 0:
            with self._lock:
                self._publish_locked(sub)

    def _emit_direct(self, sub: int, piece: pa.RecordBatch) -> None:
        """Queue ``piece`` uncopied (its IPC pieces) on a buffer of the pool, after whatever the
        subpartition's open buffer holds (order is kept)."""
        lease = self.partition.request_buffer()  # may block: the same backpressure as a copy
        payload: Buffer | None = None
        try:
            payload = self._encoder.encode(lease, piece)
            if payload is None:  # larger than estimated: copy, which names the problem if it fails
                builder = BufferBuilder(lease, self.partition.schema)
                builder.append(piece)
                payload = builder.finish()
        except BaseException:
            lease.recycle()
            raise
        with self._lock:
            try:
                self._publish_locked(sub)  # may find the subpartition closed (its reader left)
            except BaseException:
                payload.recycle()
                raise
            self.partition.add(sub, payload)  # recycles the payload itself when closed

    def _publish_locked(self, sub: int) -> None:
        builder = self._builders[sub]
        self._builders[sub] = None
        if builder is None:
            return
        if builder.num_batches == 0:
            builder.abandon()
            return
        self.partition.add(sub, builder.finish())

    def _flush_all(self) -> None:
        with self._lock:
            for sub in range(len(self._builders)):
                self._publish_locked(sub)

    def _flush_loop(self, timeout: float) -> None:
        """Flush every ``timeout`` on the partition's clock; the real wait only paces the checks."""
        clock = self.partition.clock
        due = clock.monotonic() + timeout
        while not self._stop.wait(min(max(due - clock.monotonic(), 0.0), timeout, _MAX_PACE_S)):
            if clock.monotonic() < due:
                continue
            try:
                self._flush_all()
            except BaseException as exc:  # sticky: re-raised by the next public call
                self._error = exc
                return
            due = clock.monotonic() + timeout

    def _stop_flusher(self) -> None:
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
