"""Materialized map outputs: one Arrow IPC file per map task attempt, one set of segments per reducer.

Why files and not the engine's BLOCKING ``ResultPartition`` (memory, then spill) in the agent,
although both are "materialized" results in Flink's sense: a map task runs in a Spark Python
worker, which may exit after the task; its output must outlive it and be readable *more than
once* (a reduce task that fails half-way is retried and reads again, and an engine subpartition
is consumed by its single reader). Spark's external-shuffle-service model gives both: the worker
writes its output to the executor agent's directory, the agent's ``MapOutputService``
(``agent_service``) streams it to reduce tasks that do not read the file themselves and deletes it
on release, TTL or exit; reduce tasks on the same host memory-map it (``tasks``).

Layout: the file is a sequence of *runs*. A run holds, for each reduce partition with data, one
complete Arrow IPC stream (schema, batches, end-of-stream) of that partition's rows. Rows are
buffered in memory up to ``memory_bytes`` and then written as a run, so a map task's memory is
bounded whatever its input size; the status of reduce partition ``r`` lists its ``(offset,
length)`` segments in run order. Memory-mapped, every segment is read back with no copy.

The file is private (``arrow_shuffle.private_files``): its folder 0700, the file created 0600 with
``O_EXCL | O_NOFOLLOW``, so a name that exists already (a planted symlink) is refused, never
written through.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError
from arrow_shuffle.partitioner import hash_rows, key_type_problem
from arrow_shuffle.private_files import create_private_file, make_private_dir

BATCH_ROWS = 16384
"""Rows per batch in map-output files (Spark hands Python 10k-row batches by default)."""

Segment = tuple[int, int]
"""``(offset, length)`` of one Arrow IPC stream inside a map output file."""


@dataclass
class ReducerOutput:
    """What one map task wrote for one reduce partition."""

    segments: list[Segment] = field(default_factory=list)
    bytes: int = 0
    batches: int = 0
    rows: int = 0


def check_keys(schema: pa.Schema, key_columns: Sequence[str]) -> None:
    """Fail before any data moves when a key column is missing or of a type rows cannot be grouped by.

    Every type Spark groups by passes (``key_type_problem``): numbers, decimals, strings, binaries,
    booleans, dates, timestamps, and structs, arrays and maps of them; a variant does not.
    """
    if not key_columns:
        raise ShuffleConfigError("key_columns must name at least one column")
    for name in key_columns:
        index = schema.get_field_index(name)
        if index < 0:
            raise ShuffleConfigError(f"key column {name!r} is not a column of the DataFrame ({schema.names})")
        field = schema.field(index)
        problem = key_type_problem(field)
        if problem:
            raise ShuffleConfigError(
                f"key column {name!r} has type {field.type}, which arrowbeat cannot group or "
                f"hash-partition by: {problem}"
            )


def route(batch: pa.RecordBatch, key_columns: Sequence[str], num_partitions: int) -> np.ndarray:
    """The reduce partition of every row: the engine's process-independent key hash."""
    ids: np.ndarray = (hash_rows(batch, key_columns) % np.uint64(num_partitions)).astype(np.int64)
    return ids


class MapOutputWriter:
    """Routes batches to reduce partitions and writes them as runs of IPC streams to ``path``.

    Input batches are held as they come (Spark hands each one over in its own buffers) with the
    reduce partition of every row; a run then orders all held rows by partition with *one*
    ``take`` and streams each partition's slice straight into the file. One copy of the data
    before the file, where sorting every input batch and merging the pieces again took three.
    """

    def __init__(
        self,
        path: str,
        schema: pa.Schema,
        key_columns: Sequence[str],
        num_partitions: int,
        memory_bytes: int,
    ) -> None:
        self.path = path
        self.schema = schema
        self.keys = list(key_columns)
        self.num_partitions = num_partitions
        self.memory_bytes = memory_bytes
        self.outputs = [ReducerOutput() for _ in range(num_partitions)]
        self.spill_bytes = 0
        """Bytes written in runs forced by the memory bound (all but the final run)."""
        self._held: list[pa.RecordBatch] = []
        self._routes: list[np.ndarray] = []
        self._held_bytes = 0
        try:
            make_private_dir(os.path.dirname(path))  # its parent (the agent's folder): checked by the caller
            self._file = pa.PythonFile(os.fdopen(create_private_file(path), "wb"), mode="w")
        except OSError as exc:
            raise ShuffleError(
                f"cannot create map output {path}: {exc}; check spark.arrowbeat.shuffle.dir"
            ) from exc

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if not batch.schema.equals(self.schema):
            batch = pa.RecordBatch.from_arrays(batch.columns, schema=self.schema)
        self._routes.append(route(batch, self.keys, self.num_partitions))
        self._held.append(batch)
        self._held_bytes += batch.nbytes
        if self._held_bytes >= self.memory_bytes:
            self.spill_bytes += self._write_run()

    def finish(self) -> list[ReducerOutput]:
        """Write the last run, close the file; the per-reducer segments are final."""
        self._write_run()
        self._file.close()
        return self.outputs

    def abort(self) -> None:
        self._held, self._routes = [], []
        self._file.close()
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _write_run(self) -> int:
        if not self._held:
            return 0
        ids = np.concatenate(self._routes)
        counts = np.bincount(ids, minlength=self.num_partitions)
        # A stable sort of small integers is a radix sort in numpy: 5x faster than on int64.
        narrow = ids.astype(np.uint16) if self.num_partitions <= 1 << 16 else ids
        order = np.argsort(narrow, kind="stable")
        grouped = pa.Table.from_batches(self._held, schema=self.schema).take(pa.array(order))
        self._held, self._routes, self._held_bytes = [], [], 0
        written = 0
        start = 0
        for reducer in np.flatnonzero(counts):
            rows = int(counts[reducer])
            # Large batches: every later step (network, JVM conversion) pays per batch.
            batches = grouped.slice(start, rows).to_batches(max_chunksize=BATCH_ROWS)
            start += rows
            offset = self._file.tell()
            try:
                with pa.ipc.new_stream(self._file, self.schema) as stream:
                    for b in batches:
                        stream.write_batch(b)
            except OSError as exc:
                raise ShuffleError(
                    f"writing map output {self.path} failed: {exc}; free disk space or point "
                    "spark.arrowbeat.shuffle.dir elsewhere"
                ) from exc
            size = self._file.tell() - offset
            out = self.outputs[reducer]
            out.segments.append((offset, size))
            out.bytes += size
            out.batches += len(batches)
            out.rows += rows
            written += size
        return written


def read_segments(path: str, segments: Sequence[Segment]) -> Iterator[pa.RecordBatch]:
    """The batches of ``segments`` of a local map output file, memory-mapped (no copy)."""
    try:
        source = pa.memory_map(path, "r")
    except OSError as exc:
        raise ShuffleError(f"map output {path} is gone: {exc}") from exc
    # Not closed explicitly: batches handed out view the mapping, which lives while they do.
    for offset, length in segments:
        source.seek(offset)
        yield from pa.ipc.open_stream(source.read_buffer(length))
