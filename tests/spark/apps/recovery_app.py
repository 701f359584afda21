"""A spark-submit application that times what a job pays when an executor freezes under it.

``recovery_app.py MARKS GO [--tasks N] [--task-s S] [--calm]``. Once both executors ran a warm-up
task (their Python workers started) it prints ``APP-READY {json}``; with ``--calm`` it first runs
the job undisturbed and prints ``JOB-DONE {json}`` for it. Then it waits for the file ``GO``,
prints ``JOB-START {json}`` (the wall-clock start) and runs the job: N tasks of S seconds each,
one per partition. Every task attempt writes two marks into ``MARKS`` (the executor JVM's pid, its
partition, attempt number and a wall-clock time): ``<partition>-<attempt>-<tid>.start`` when it
begins, ``.end`` when it finished its sleep. Last comes ``JOB-DONE {json}`` with the job's
seconds and its partitions' sum. The caller freezes an executor JVM meanwhile and reads the marks:
which attempts the freeze cut, and when their reruns started elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def jvm_pid() -> int:
    """The executor JVM running this Python worker (its nearest ``java`` ancestor), else 0."""
    import psutil

    for parent in psutil.Process().parents():
        if parent.name() == "java":
            return parent.pid
    return 0


def write_mark(path: Path, fields: dict[str, Any]) -> None:
    """Written whole, then renamed: a reader never sees half a mark."""
    partial = path.with_suffix(path.suffix + ".part")
    partial.write_text(json.dumps(fields))
    os.replace(partial, path)


def warm_pid(_: int) -> int:
    """A warm-up task: long enough for both executors to get one; its JVM's pid."""
    time.sleep(0.3)
    return jvm_pid()


def timed_tasks(marks: str, task_s: float) -> Any:
    def run(index: int, rows: Iterator[int]) -> Iterator[int]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context else -1
        tid = context.taskAttemptId() if context else -1
        stem = Path(marks) / f"{index}-{attempt}-{tid}"
        pid = jvm_pid()
        write_mark(
            stem.with_suffix(".start"), {"pid": pid, "partition": index, "attempt": attempt, "t": time.time()}
        )
        time.sleep(task_s)
        write_mark(
            stem.with_suffix(".end"), {"pid": pid, "partition": index, "attempt": attempt, "t": time.time()}
        )
        yield sum(rows) + index

    return run


def run_job(spark: SparkSession, marks: Path, tasks: int, task_s: float) -> dict[str, Any]:
    marks.mkdir(parents=True, exist_ok=True)
    began = time.time()
    print("JOB-START " + json.dumps({"t": began}), flush=True)
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    total = sum(rdd.mapPartitionsWithIndex(timed_tasks(str(marks), task_s)).collect())
    return {"seconds": round(time.time() - began, 3), "sum": total, "started": began}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("marks")
    parser.add_argument("go")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--task-s", type=float, default=1.0)
    parser.add_argument("--calm", action="store_true")
    args = parser.parse_args()
    spark = SparkSession.builder.appName("arrowbeat-recovery").getOrCreate()
    sc = spark.sparkContext
    deadline = time.monotonic() + 120
    while sc._jsc.sc().getExecutorIds().size() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids: set[int] = set()
    while len(pids) < 2 and time.monotonic() < deadline:  # both executors have a warm Python worker
        pids |= set(sc.parallelize(range(4), 4).map(warm_pid).collect())
    print("APP-READY " + json.dumps({"jvm_pids": sorted(pids)}), flush=True)
    if args.calm:
        calm = run_job(spark, Path(args.marks) / "calm", args.tasks, args.task_s)
        print("JOB-DONE " + json.dumps({"name": "calm", **calm}), flush=True)
    go, waited_until = Path(args.go), time.monotonic() + 300
    while not go.exists() and time.monotonic() < waited_until:  # the test says when to run it
        time.sleep(0.05)
    frozen = run_job(spark, Path(args.marks) / "frozen", args.tasks, args.task_s)
    print("JOB-DONE " + json.dumps({"name": "frozen", **frozen}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
