"""A spark-submit application driven by command files, for ``test_spark_view``.

``view_app.py COMMANDS_DIR [FIRST_HOLD]``. With FIRST_HOLD, starts ``hold FIRST_HOLD`` as soon as
the session is up, before its executors register (so none of them is ever idle before it runs a
task). Prints ``APP-READY {json}`` (RM address), then runs the commands
the test writes as files ``1``, ``2``, ... in COMMANDS_DIR (spark-submit does not hand its stdin
to the Python driver): ``job`` runs a short job and prints ``JOB-DONE {json}``; ``hold NAME``
starts, in the background, a job of two tasks that wait for the file NAME in COMMANDS_DIR
(executors busy until then: dynamic allocation asks for them and keeps them) and prints
``HOLD-DONE {json}`` when it ends; ``stop`` stops the session.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pyspark.sql import SparkSession

from harness.procs import wait_until


def wait_for(go: str, x: int) -> int:
    """A task that runs until the test says go (bounded, so nothing waits forever). It leaves
    ``running-<go>-<pid>`` beside the go file first, so the test can tell which executors hold a
    task (its Python worker's ancestors)."""
    (Path(go).parent / f"running-{Path(go).name}-{os.getpid()}").touch()
    wait_until(Path(go).exists, 600)
    return x


def commands(directory: Path) -> Iterator[str]:
    """The commands in order, each once it is written (bounded: nothing waits forever)."""
    deadline = time.monotonic() + 900
    number = 1
    while time.monotonic() < deadline:
        path = directory / str(number)
        if path.exists():
            number += 1
            yield path.read_text().strip()
        else:
            time.sleep(0.05)


def main() -> int:
    directory = Path(sys.argv[1])
    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    holders: list[threading.Thread] = []

    def hold(go: str) -> None:
        total = sc.parallelize(range(2), 2).map(lambda x: wait_for(go, x)).sum()
        print("HOLD-DONE " + json.dumps({"sum": total}), flush=True)

    def start_hold(name: str) -> None:
        holders.append(threading.Thread(target=hold, args=(str(directory / name),), daemon=True))
        holders[-1].start()

    if len(sys.argv) > 2:
        start_hold(sys.argv[2])
    print(
        "APP-READY " + json.dumps({"rm_address": sc.getConf().get("spark.arrowbeat.rm.address")}), flush=True
    )
    for command in commands(directory):
        if command == "job":
            total = sc.parallelize(range(100), 2).map(lambda x: x * 2).sum()
            print("JOB-DONE " + json.dumps({"sum": total}), flush=True)
        elif command.startswith("hold "):
            start_hold(command.removeprefix("hold "))
        elif command == "stop":
            break
    for holder in holders:
        holder.join(300)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
