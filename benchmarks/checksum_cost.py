"""What the map-output checksums cost a shuffle's tasks: one map task's output written and read
back with ``spark.arrowbeat.shuffle.checksum`` on and off, in one process, without Spark.

The matrix (``shuffle_matrix``) also times whole 20 M-row cells with the key on and off, in
applications of their own; there two runs of one setting differ by up to 13 % on this machine,
more than the 3 % to be shown. On a host-local read the checksums change two steps of a
shuffle, and both run here as the tasks run them, on the same input:

* the map task's write (``MapOutputWriter``: route, sort into runs, Arrow writing each reducer's
  segment natively; when on, each run's segments read back from the page cache and hashed,
  ``region_checksums``);
* every reducer's read of its segments (``read_segments``): with checksums, each chunk read whole
  and verified, then decoded natively; without, decoded from the file and fully validated
  (``RecordBatch.validate(full=True)``: no checksum vouches for the offsets).

Not here: a read streamed through another host's agent also hashes each network frame at both
ends (XXH3, about 30 GB/s here: 0.03 s of CPU per GiB at each end); the matrix's cells read
host-local.

The input is one map task's share of a matrix cell (``--rows`` / 8 input partitions, the
matrix's columns: an int key with nulls, uniform or hot, a double, a unicode string with nulls),
fed in Spark's Arrow batches of 10,000 rows, written for ``--reducers`` reduce partitions (200:
Spark's default) with Spark's default map memory (8 MiB, so a task writes many runs).

Rounds alternate the order (off, on; on, off; ...) so a drift of load falls on both alike; each
round's ``on / off`` (CPU seconds: the process's, every thread) is one ratio, and ``cost`` is the
median of those ratios minus one, with their spread (largest minus smallest) beside it.
``--cell-s`` (a matrix cell's arrowbeat time) turns the extra seconds into a share of that cell:
its 8 map tasks each pay one write's extra and its reducers together one read's extra per map
output, spread over the cluster's ``--cores``.

    .venv/bin/python -m benchmarks.checksum_cost [--rows 20000000] [--rounds 7]

``RESULT`` lines: ``checksum_write_cost``, ``checksum_read_cost``, ``checksum_task_cost`` (write
and read together) and its ``..._spread``, ``checksum_extra_s_per_map_output``, ``rounds``,
``load_1m`` at start and end, and with ``--cell-s`` ``checksum_cell_cost``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from spark_plugin.shuffle.map_output import MapOutputWriter, ReducerOutput, read_segments

INPUT_PARTITIONS = 8
"""A matrix cell's input partitions, hence its map tasks (``shuffle_matrix`` builds its inputs
with this and ``KEYS``, defined here so that both benchmarks measure one shape)."""
SPARK_BATCH_ROWS = 10_000
"""``spark.sql.execution.arrow.maxRecordsPerBatch``'s default: the batches a map task is fed."""
MAP_MEMORY = 8 << 20
"""``spark.arrowbeat.shuffle.mapMemory``'s default."""
KEYS = 5003
"""A matrix cell's key count."""


def map_input(rows: int, keys: str, seed: int = 7) -> list[pa.RecordBatch]:
    """One map task's share of a matrix cell, as the matrix builds its columns."""
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    key = rng.integers(0, KEYS, rows, dtype=np.int32)
    if keys == "hot":
        key[rng.random(rows) < 0.6] = 0  # one key: 60 % of rows
    key_nulls = ids % 997 == 0
    text = np.array([f"ключ-{i}-é" for i in range(211)], dtype=object)[ids % 211]
    schema = pa.schema([("k", pa.int32()), ("x", pa.float64()), ("s", pa.string())])
    table = pa.table(
        [
            pa.array(key, mask=key_nulls),
            pa.array((ids % 1000).astype(np.float64) * 0.5),
            pa.array(text, type=pa.string(), mask=ids % 13 == 0),
        ],
        schema=schema,
    )
    batches: list[pa.RecordBatch] = table.to_batches(max_chunksize=SPARK_BATCH_ROWS)
    return batches


def write(path: str, batches: list[pa.RecordBatch], reducers: int, checksum: bool) -> list[ReducerOutput]:
    writer = MapOutputWriter(path, batches[0].schema, ["k"], reducers, MAP_MEMORY, checksum=checksum)
    for batch in batches:
        writer.write(batch)
    outputs: list[ReducerOutput] = writer.finish()
    return outputs


def read_all(path: str, outputs: list[ReducerOutput], schema: pa.Schema) -> int:
    rows = 0
    for output in outputs:
        batches: Iterator[pa.RecordBatch] = read_segments(path, output.segments, schema=schema)
        rows += sum(batch.num_rows for batch in batches)
    return rows


def measure(folder: str, batches: list[pa.RecordBatch], reducers: int, checksum: bool) -> tuple[float, float]:
    """CPU seconds to write and to read back one map output (the process's, every thread). CPU,
    not wall time: the step runs alone in its process, and its CPU moves far less with the
    machine's load than its wall time does."""
    path = os.path.join(folder, f"map-{int(checksum)}.arrows")
    started = time.process_time()
    outputs = write(path, batches, reducers, checksum)
    written = time.process_time()
    rows = read_all(path, outputs, batches[0].schema)
    read = time.process_time()
    if rows != sum(b.num_rows for b in batches):
        raise AssertionError(f"read {rows} rows back, wrote {sum(b.num_rows for b in batches)}")
    os.unlink(path)
    return written - started, read - written


def spread(values: list[float]) -> float:
    return max(values) - min(values)


@dataclass
class TaskCost:
    """The checksums' cost to one map output's write and read: medians of per-round ``on / off``
    of CPU seconds, minus one."""

    write: float
    read: float
    task: float
    task_spread: float
    extra_s: float
    """CPU seconds the checksums add to one map output's write and read (median of per-round
    on - off)."""
    rounds: int

    def cell_cost(self, cell_s: float, cores: int) -> float:
        """The share of a cell of ``cell_s`` seconds on ``cores`` cores that its 8 map outputs'
        extra CPU takes."""
        return INPUT_PARTITIONS * self.extra_s / cores / cell_s


def task_cost(rows: int, keys: str, reducers: int, rounds: int, verbose: bool = True) -> TaskCost:
    """One map task's share of a ``rows``-row cell written and read ``rounds`` times each way."""
    batches = map_input(rows // INPUT_PARTITIONS, keys)
    times: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    ratios: dict[str, list[float]] = {"write": [], "read": [], "task": []}
    with tempfile.TemporaryDirectory(prefix="arrowbeat-checksum-cost-") as folder:
        measure(folder, batches, reducers, True)  # warm: imports, pools, page cache
        for round_ in range(rounds):
            for checksum in (False, True) if round_ % 2 == 0 else (True, False):
                write_s, read_s = measure(folder, batches, reducers, checksum)
                times[checksum].append((write_s, read_s))
            (on_w, on_r), (off_w, off_r) = times[True][-1], times[False][-1]
            ratios["write"].append(on_w / off_w)
            ratios["read"].append(on_r / off_r)
            ratios["task"].append((on_w + on_r) / (off_w + off_r))
            if verbose:
                print(
                    f"round {round_ + 1}: on write {on_w:.3f} s read {on_r:.3f} s, "
                    f"off write {off_w:.3f} s read {off_r:.3f} s, task on/off {ratios['task'][-1]:.3f}",
                    flush=True,
                )
    cost = {name: statistics.median(values) - 1 for name, values in ratios.items()}
    pairs = zip(times[True], times[False], strict=True)
    extra_s = statistics.median(sum(on) - sum(off) for on, off in pairs)  # per round: drift cancels
    return TaskCost(cost["write"], cost["read"], cost["task"], spread(ratios["task"]), extra_s, rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000, help="a matrix cell's rows (a task gets 1/8)")
    parser.add_argument("--keys", default="uniform", choices=("uniform", "hot"))
    parser.add_argument("--reducers", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cell-s", type=float, default=None, help="a matrix cell's arrowbeat seconds")
    parser.add_argument("--cores", type=int, default=2, help="the cluster's cores (for --cell-s)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds: at least 3")

    load_start = os.getloadavg()[0]
    print(
        f"one map task of a {args.rows:,}-row cell: {args.rows // INPUT_PARTITIONS:,} rows, "
        f"{args.reducers} reducers, keys {args.keys}, load(1 min) {load_start:.2f}",
        flush=True,
    )
    cost = task_cost(args.rows, args.keys, args.reducers, args.rounds)
    print(f"RESULT checksum_write_cost={cost.write:.3f}")
    print(f"RESULT checksum_read_cost={cost.read:.3f}")
    print(f"RESULT checksum_task_cost={cost.task:.3f}")
    print(f"RESULT checksum_task_cost_spread={cost.task_spread:.3f}")
    print(f"RESULT checksum_extra_s_per_map_output={cost.extra_s:.3f}")
    if args.cell_s is not None:
        print(f"RESULT checksum_cell_cost={cost.cell_cost(args.cell_s, args.cores):.3f}")
    print(f"RESULT rounds={args.rounds}")
    print(f"RESULT load_1m_start={load_start:.2f}")
    print(f"RESULT load_1m_end={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
