"""The application ``benchmarks/job_recovery.py`` and ``tests/spark/test_frozen_recovery.py`` submit:
the same job, run once per plan entry, each run started by its caller so that it can freeze or
slow an executor under it.

``timed_job_app.py FOLDER --plan calm,frozen [--tasks N] [--steps S] [--step-s T]``

Once both executors ran a warm-up task (their Python workers started) it prints ``APP-READY
{json}``. Then, for each name of ``--plan`` in turn, it prints ``JOB-WAIT {json}``, waits for the
file ``FOLDER/go-<name>``, prints ``JOB-START {json}`` (the wall-clock start) and runs the job,
then ``JOB-DONE {json}`` with its seconds (the whole ``collect``) and its sum. Last it prints
``APP-HOLD``, waits for ``FOLDER/go-end`` (the caller may still be waiting for the tables to
record what it did) and stops.

The job: ``N`` tasks, one per partition, each ``S`` steps of ``T`` seconds of ``time.sleep``
(``--tasks 60 --steps 50 --step-s 0.02``: 60 one-second tasks). A step is a sleep, not CPU, so the
job's time does not depend on the machine's load, yet a stopped process is slowed: a step that
ends while its Python worker is stopped ends only when it continues, so an executor stopped 150
ms of every 300 ms (JVM and Python workers) runs its tasks at about half speed. The job named
``skewed`` has partitions of unequal size: partition 0 is 8 units, every seventh from 3 is 3
units, the rest 1 (a unit is ``S`` steps): the executor that runs partition 0 runs few, long
tasks, the other many short ones, and both are healthy.

Every task attempt writes two marks into ``FOLDER/marks/<name>`` (its executor JVM's pid, its
partition, attempt number, units and a wall-clock time): ``<partition>-<attempt>-<tid>.start``
when it begins, ``.end`` when its steps are done. ``harness.task_marks`` reads them: which attempts a
freeze cut, when their reruns started elsewhere, how long each executor's attempts took.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from harness.apps.warm import jvm_pid, warm_executors

WAIT_S = 900.0
"""How long the application waits for a go file before it gives up (a run left behind)."""


def units_of(job: str, partition: int) -> int:
    """How many units of work a partition holds: 1 each, but in ``skewed``."""
    if job != "skewed":
        return 1
    if partition == 0:
        return 8
    return 3 if partition % 7 == 3 else 1


def write_mark(path: Path, fields: dict[str, Any]) -> None:
    """Written whole, then renamed: a reader never sees half a mark."""
    partial = path.with_suffix(path.suffix + ".part")
    partial.write_text(json.dumps(fields))
    os.replace(partial, path)


def timed_steps(
    job: str, marks: str, steps: int, step_s: float
) -> Callable[[int, Iterable[int]], Iterable[int]]:
    """The task: its partition's units of ``steps`` sleeps, marked at start and end."""

    def run(index: int, rows: Iterable[int]) -> Iterator[int]:
        from pyspark import TaskContext

        context = TaskContext.get()
        attempt = context.attemptNumber() if context else -1
        tid = context.taskAttemptId() if context else -1
        stem = Path(marks) / f"{index}-{attempt}-{tid}"
        units = units_of(job, index)
        fields = {"pid": jvm_pid(), "partition": index, "attempt": attempt, "units": units}
        write_mark(stem.with_suffix(".start"), {**fields, "t": time.time()})
        for _ in range(units * steps):
            time.sleep(step_s)
        write_mark(stem.with_suffix(".end"), {**fields, "t": time.time()})
        yield sum(rows) + units

    return run


def run_job(
    spark: SparkSession, job: str, marks: Path, tasks: int, steps: int, step_s: float
) -> dict[str, Any]:
    marks.mkdir(parents=True, exist_ok=True)
    rdd = spark.sparkContext.parallelize(range(tasks), tasks)
    began = time.time()
    print("JOB-START " + json.dumps({"name": job, "t": began}), flush=True)
    total: int = sum(rdd.mapPartitionsWithIndex(timed_steps(job, str(marks), steps, step_s)).collect())
    ended = time.time()
    expected = sum(range(tasks)) + sum(units_of(job, p) for p in range(tasks))
    return {
        "name": job,
        "seconds": round(ended - began, 3),
        "started": began,
        "ended": ended,
        "sum": total,
        "complete": total == expected,
    }


def wait_for_file(path: Path) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--plan", default="calm")
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--step-s", type=float, default=0.02)
    args = parser.parse_args()
    folder = Path(args.folder)
    spark = SparkSession.builder.appName("arrowbeat-job-recovery").getOrCreate()
    sc = spark.sparkContext
    pids = warm_executors(sc, 2, timeout_s=180)
    print("APP-READY " + json.dumps({"jvm_pids": sorted(pids), "app_id": sc.applicationId}), flush=True)
    for job in [j for j in args.plan.split(",") if j]:
        print("JOB-WAIT " + json.dumps({"name": job}), flush=True)
        if not wait_for_file(folder / f"go-{job}"):
            print(f"APP-GAVE-UP waiting for go-{job}", flush=True)
            spark.stop()
            return 1
        done = run_job(spark, job, folder / "marks" / job, args.tasks, args.steps, args.step_s)
        print("JOB-DONE " + json.dumps(done), flush=True)
    print("APP-HOLD {}", flush=True)
    wait_for_file(folder / "go-end")
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
