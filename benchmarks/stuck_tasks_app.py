"""The application ``benchmarks/stuck_tasks.py`` submits: hangs, busy tasks and GC pauses in rounds.

``stuck_tasks_app.py SCRATCH --rounds R --hang-s H --busy-s B --small-gc N --big-gc M``

1. ``R`` jobs of two partitions: partition 0 hangs (``threading.Event().wait(H)``, its start time in
   ``SCRATCH/hang-<round>``), partition 1 spins on CPU for ``B`` seconds (slow but busy);
2. ``R`` GC pauses under the heartbeat timeout (``GcPause.pause(N)``), then prints ``APP-STOPS``
   and waits for ``SCRATCH/go-gc`` while the benchmark SIGSTOPs an executor JVM ``R`` times;
3. ``R`` GC pauses over the heartbeat timeout (``GcPause.pause(M)``), each followed by time to
   re-register; prints ``APP-DONE {json}`` with every pause's length.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession

from harness.procs import wait_until


def spin(seconds: float) -> int:
    deadline, n = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        n += sum(range(1000))
    return n


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scratch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hang-s", type=float, default=6.0)
    parser.add_argument("--busy-s", type=float, default=6.0)
    parser.add_argument("--small-gc", type=int, default=5_000_000)
    parser.add_argument("--big-gc", type=int, default=20_000_000)
    args = parser.parse_args()
    scratch = Path(args.scratch)
    spark = SparkSession.builder.getOrCreate()

    for round_ in range(args.rounds):

        def hang_or_spin(batches: Iterable[pa.RecordBatch], r: int = round_) -> Iterator[pa.RecordBatch]:
            ctx = TaskContext.get()
            assert ctx is not None
            if ctx.partitionId() == 0:
                (scratch / f"hang-{r}").write_text(repr(time.time()))
                threading.Event().wait(args.hang_s)
            else:
                spin(args.busy_s)
            yield from batches

        spark.range(0, 100, numPartitions=2).mapInArrow(hang_or_spin, "id long").collect()

    def pause(objects: int) -> int:
        expr = f"java_method('GcPause', 'pause', {objects})"
        return int(spark.range(0, 1, numPartitions=1).selectExpr(expr).collect()[0][0])

    small = [pause(args.small_gc) for _ in range(args.rounds)]
    print("APP-STOPS " + json.dumps({"app_id": spark.sparkContext.applicationId}), flush=True)
    wait_until((scratch / "go-gc").exists, 600)
    big = []
    for _ in range(args.rounds):
        big.append(pause(args.big_gc))
        time.sleep(3.0)  # re-registration and a heartbeat before the next pause
    print("APP-DONE " + json.dumps({"small_pause_ms": small, "big_pause_ms": big}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
