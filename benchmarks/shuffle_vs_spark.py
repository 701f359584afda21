"""arrowbeat's Arrow shuffle against Spark's own shuffle, in one application on local-cluster[2,1,M].

Pipelines (defined in ``jobs/arrow_pipeline.py``, shared with the demo):

1. ``mapInArrow`` generates N rows (int64 key over 100k values, three float64, one short string)
   -> shuffle by key -> per-group Arrow aggregation. Spark: ``groupBy("key").applyInArrow(f)``;
   arrowbeat: ``group_apply`` over ``map_in_arrow`` (the generator chained into the map task;
   also timed unchained, over a plain ``mapInArrow`` DataFrame).
2. cached DataFrame -> repartition by key -> ``mapInArrow``. Spark: ``repartition(n, "key")
   .mapInArrow``; arrowbeat: ``partition_apply``; plus the same ``mapInArrow`` with no shuffle
   (the floor), so each shuffle's own cost is its pipeline minus the floor.

Peak executor memory is the largest sum, sampled every 0.1 s while a pipeline runs, of the RSS
of the executor JVMs and everything under them (pyspark daemon, Python workers, arrowbeat agent).

    .venv/bin/python -m benchmarks.shuffle_vs_spark --rows 20000000
"""

from __future__ import annotations

import argparse
import shutil
import threading
from collections.abc import Callable

import psutil

from harness.env import prepare
from harness.procs import ours
from harness.session import build_session, stop_session


class PeakMemory:
    """Samples the executors' process trees while ``with`` is active: the largest sum (``peak``),
    what each kind of process held at that moment (``at_peak``) and the largest one process
    reached on its own (``largest``), so a peak can be told apart by where it is."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.file_backed_at_peak: dict[str, int] = {}
        """Of ``at_peak``, the pages of mapped files (a memory-mapped shuffle read, libraries):
        the kernel drops them under pressure, unlike a heap's."""
        self.largest: tuple[str, int] = ("", 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        kinds: dict[str, int] = {}
        file_backed: dict[str, int] = {}
        for jvm in ours("CoarseGrainedExecutorBackend"):
            try:
                procs = [jvm, *jvm.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                try:
                    info = proc.memory_info()
                    kind = process_kind(proc)
                except psutil.Error:
                    continue
                rss = info.rss
                total += rss
                kinds[kind] = kinds.get(kind, 0) + rss
                file_backed[kind] = file_backed.get(kind, 0) + getattr(info, "shared", 0)
                if rss > self.largest[1]:
                    self.largest = (kind, rss)
        if total > self.peak:
            self.peak, self.at_peak, self.file_backed_at_peak = total, kinds, file_backed
        return total

    def breakdown(self) -> str:
        """``at_peak`` and ``largest`` in MiB, for a line of output."""
        parts = ", ".join(
            f"{kind} {rss / 2**20:.0f} (file-backed {self.file_backed_at_peak.get(kind, 0) / 2**20:.0f})"
            for kind, rss in sorted(self.at_peak.items())
        )
        kind, rss = self.largest
        return f"{parts}; largest process: {kind} {rss / 2**20:.0f} MiB"

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self.start = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def process_kind(proc: psutil.Process) -> str:
    """What an executor's process is: the JVM, a Python worker (or the daemon forking them), or
    arrowbeat's agent and sidecar."""
    command = " ".join(proc.cmdline())
    if "CoarseGrainedExecutorBackend" in command:
        return "executor JVM"
    if "pyspark.daemon" in command or "python_daemon" in command or "pyspark.worker" in command:
        return "Python workers"
    if "spark_plugin" in command or "arrowbeat" in command:
        return "arrowbeat agents"
    return "other"


def timed(step: Callable[[], float]) -> tuple[float, int, int]:
    with PeakMemory() as memory:
        seconds = step()
    return seconds, memory.peak, memory.start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000_000, help="N, rows generated")
    parser.add_argument("--parts", type=int, default=16, help="map partitions")
    parser.add_argument("--reducers", type=int, default=16, help="shuffle partitions (both shuffles)")
    parser.add_argument("--worker-mb", type=int, default=2048, help="M of local-cluster[2,1,M]")
    parser.add_argument("--executor-memory", default="1g", help="spark.executor.memory")
    parser.add_argument("--only", default="", help="comma-separated steps to run (for profiling)")
    args = parser.parse_args()

    from spark_plugin.jobs.arrow_pipeline import pipelines

    scratch = prepare()  # loopback, the venv's Python everywhere, the run marker
    spark = build_session(
        f"local-cluster[2,1,{args.worker_mb}]",
        scratch,
        "shuffle-vs-spark",
        conf={
            "spark.executor.memory": args.executor_memory,
            "spark.sql.shuffle.partitions": str(args.reducers),
            "spark.sql.adaptive.enabled": "false",  # same partition counts on both sides
            "spark.arrowbeat.shuffle.dir": str(scratch / "shuffle"),
            "spark.arrowbeat.tables.path": str(scratch / "tables"),
        },
    )
    try:
        steps = pipelines(spark, args.rows, args.parts, args.reducers)
        # Warm-up (Python workers started, jars loaded) on a small input, not measured.
        for step in pipelines(spark, 200_000, 2, 2).values():
            step()
        results: dict[str, tuple[float, int, int]] = {}
        # arrowbeat first: a JVM's RSS does not shrink after its heap grew, so whichever runs
        # second would be charged the first one's JVM growth; Spark's shuffle is the one that
        # uses the JVM heap, so this order charges it only its own.
        names = (
            "arrow_group",
            "arrow_group_unchained",
            "spark_group",
            "cache",
            "floor",
            "spark_repartition",
            "arrow_repartition",
        )
        wanted = set(args.only.split(",")) if args.only else set(names)
        for name in names:
            if name not in wanted:
                results[name] = (float("nan"), 1, 1)
                continue
            results[name] = timed(steps[name])
            seconds, peak, start = results[name]
            print(
                f"{name:22s} {seconds:8.2f} s   peak executor memory {peak / 2**20:6.0f} MiB "
                f"(at start {start / 2**20:6.0f} MiB)",
                flush=True,
            )
        if "cache" in wanted:
            steps["uncache"]()
    finally:
        stop_session(spark)
        shutil.rmtree(scratch, ignore_errors=True)

    t = {k: v[0] for k, v in results.items()}
    m = {k: v[1] for k, v in results.items()}
    spark_cost = t["spark_repartition"] - t["floor"]
    arrow_cost = t["arrow_repartition"] - t["floor"]
    print()
    print(
        f"N={args.rows:,} rows, {args.parts} map / {args.reducers} shuffle partitions, "
        f"local-cluster[2,1,{args.worker_mb}], executor memory {args.executor_memory}"
    )
    print(
        f"(1) generate -> shuffle -> per-group aggregation: Spark {t['spark_group']:.2f} s, "
        f"arrowbeat {t['arrow_group']:.2f} s; peak memory Spark {m['spark_group'] / 2**20:.0f} MiB, "
        f"arrowbeat {m['arrow_group'] / 2**20:.0f} MiB"
    )
    print(
        f"    arrowbeat without chaining the generator (its rows cross the JVM once): "
        f"{t['arrow_group_unchained']:.2f} s, peak {m['arrow_group_unchained'] / 2**20:.0f} MiB"
    )
    print(
        f"(2) cached -> repartition -> mapInArrow: floor {t['floor']:.2f} s, "
        f"Spark {t['spark_repartition']:.2f} s (shuffle cost {spark_cost:.2f} s), "
        f"arrowbeat {t['arrow_repartition']:.2f} s (shuffle cost {arrow_cost:.2f} s)"
    )
    print(f"RESULT speedup_vs_spark={t['spark_group'] / t['arrow_group']:.3f}")
    print(f"RESULT shuffle_cost_ratio={arrow_cost / spark_cost if spark_cost > 0 else float('nan'):.3f}")
    print(f"RESULT peak_mem_ratio={m['arrow_group'] / m['spark_group']:.3f}")


if __name__ == "__main__":
    main()
