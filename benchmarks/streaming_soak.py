"""Streaming soak: a Structured Streaming query with an arrowbeat grouped shuffle in every
micro-batch, for minutes to hours: wrong answers, failed shuffles, and memory and descriptors of
every process as the shuffles add up.

The query (``spark_plugin.jobs.streaming_soak``): a ``rate-micro-batch`` source, ``foreachBatch``
running ``group_by(batch, "k").applyInArrow(f)`` in ``materialized`` and ``pipelined`` mode by
turns, each shuffle released and its answer compared with Spark's ``groupBy("k").agg(...)`` of the
same batch. After each batch (at most once every ``--sample-s``) the RSS and open descriptors of
the Python driver, the driver JVM, arrowbeat's driver-side process, every executor JVM, agent,
Python daemon and Python worker are sampled. Growth is measured after a warm-up, over the second
half of the shuffles: RSS as the Theil-Sen slope (the median of every pair's slope) of its floor
(the lowest sample of each eighth of the window: what a process keeps raises it, a task's memory
not yet given back does not) in MiB per 1,000 shuffles, the least-squares slopes of the floor and
of every sample beside it (a one-off step, such as a JVM's pool of threads made once, tilts the
least-squares floor slope; a leak moves all three), descriptors as the
change between the window's first and last samples (medians of five). A process that did not live
through most of that window (a replaced worker) gets no figure; it is listed. A JVM's RSS also
grows while its heap fills up to its working size, which is not a leak: so by default
(``--jvm-heaps fixed``) every JVM starts with its heap at full size, every page touched, and its
RSS then holds still unless something grows outside the heap (metaspace, threads, native
buffers); its slope is read as any process's. ``--jvm-heaps grow`` leaves G1 its own sizing.

``RESULT`` lines: ``shuffles`` (and ``pipelined_shuffles``), ``wrong_batches``, ``failed_batches``,
``first_failed_shuffle`` (per mode, ``none`` when nothing failed), ``shuffles_per_minute``,
``rss_mib_per_1k_shuffles_max`` (the worst process; ``rss_worst_kind`` names its kind),
``rss_mib_per_1k_shuffles_max_python`` (the worst process that is not a JVM) and one
``rss_mib_per_1k_shuffles.<kind>`` per kind (the worst of that kind), ``fds_growth_max``
(``fds_worst_kind``), ``load_1m`` before and after. It exits 1 when a batch was wrong or failed.
Every ``--interim-min`` minutes an ``INTERIM`` line gives the same figures so far (growth over the
second half of the shuffles until then), so a long run stopped early is still read.
``--tracemalloc-from N`` (a debugging aid) traces the Python driver's allocations from shuffle N to
the end and lists where the live ones were made, with ``RESULT traced_kib_per_1k_shuffles``; its
RSS figures then include the tracing's own memory.

    .venv/bin/python -m benchmarks.streaming_soak --minutes 10    (or: make bench BENCH=streaming_soak)
    .venv/bin/python -m benchmarks.streaming_soak --shuffles 10000 (the long form: 5,000 pipelined)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from spark_plugin.jobs import streaming_soak


def _environment(scratch: Path) -> None:
    """Loopback only, this venv's Python for the driver and the executors, Spark dirs in
    ``scratch``, and a Spark home of the run's own: ``local-cluster`` Workers put executor dirs
    in ``$SPARK_HOME/work`` (inside the pyspark package otherwise), so it is a folder of links to
    the package's entries but ``work``."""
    import pyspark

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch / "local")
    home = scratch / "spark-home"
    home.mkdir()
    package = Path(pyspark.__file__).resolve().parent
    for entry in package.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    os.environ["SPARK_HOME"] = str(home)


DRIVER_MEMORY = "1g"


def _heap_options(memory: str, fixed: bool) -> str:
    """With ``fixed``, a JVM whose heap is its full size from the start, every page touched
    (``-Xms`` as ``-Xmx``, ``-XX:+AlwaysPreTouch``): its RSS then grows only with what it keeps
    outside the heap, so its slope reads as a Python process's does. Otherwise G1 grows the heap
    toward ``-Xmx`` as it sees fit, and the RSS with it, for as long as that takes."""
    return f"-Xms{_mib(memory)}m -XX:+AlwaysPreTouch" if fixed else ""


def _mib(memory: str) -> int:
    """A Spark memory setting (``512m``, ``1g``, ``1gb``, bare ``512``: MiB) in MiB, as the JVM's
    ``-Xms`` must be spelled (it reads ``512mb`` as an error and a bare ``512`` as bytes)."""
    found = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", memory.lower())
    if found is None:
        raise SystemExit(f"--executor-memory {memory!r}: expected a Spark memory size such as 512m or 2g")
    scale = {"k": 1 / 1024, "": 1, "m": 1, "g": 1024, "t": 1024 * 1024}[found[2]]
    return max(1, int(int(found[1]) * scale))


def _session(master: str, executor_memory: str, scratch: Path, fixed_heaps: bool = True) -> Any:
    from pyspark.sql import SparkSession

    from spark_plugin import configure

    driver_options = f"-Dderby.system.home={scratch / 'derby'} {_heap_options(DRIVER_MEMORY, fixed_heaps)}"
    builder = (
        SparkSession.builder.master(master)
        .appName("arrowbeat-streaming-soak")
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config("spark.executor.memory", executor_memory)
        .config("spark.executor.extraJavaOptions", _heap_options(executor_memory, fixed_heaps))
        .config("spark.sql.shuffle.partitions", "2")  # Spark's side of the comparison: a small batch
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", driver_options.strip())
        .config("spark.arrowbeat.shuffle.dir", str(scratch / "shuffle"))
        .config("spark.arrowbeat.tables.path", str(scratch / "tables"))
    )
    return configure(builder, delta=False).getOrCreate()


def _accumulators() -> int | str:
    """How many accumulators PySpark's driver-side registry holds: it keeps every one ever made
    (each arrowbeat shuffle's task reports travel in one) until the interpreter exits."""
    from pyspark import accumulators

    registry = getattr(accumulators, "_accumulatorRegistry", None)
    return "unknown" if registry is None else len(registry)


def report(result: streaming_soak.SoakResult, load: tuple[float, float]) -> None:
    """The run's figures: per process, per mode, then the ``RESULT`` lines."""
    print()
    if result.query_error:
        print(f"the query ended early: {result.query_error}")
    for error in result.errors:
        print(f"  {error}")
    for mode, by_name in streaming_soak.timings(result).items():
        parts = ", ".join(f"{name} {med:.3f}/{p95:.3f}" for name, (med, p95) in by_name.items())
        print(f"{mode:12s} seconds per batch (median/p95): {parts}")
    if result.between_s:
        between = sorted(result.between_s)
        print(f"between batches (the query's own work), median {between[len(between) // 2]:.3f} s")
    print(f"accumulators the Python driver still holds: {_accumulators()} (one per arrowbeat shuffle made)")
    if result.traced_from is not None:
        traced = max(result.traced_to - result.traced_from, 1)
        print(
            f"\nPython allocations of this process made after shuffle {result.traced_from} and alive at "
            f"shuffle {result.traced_to} (tracemalloc): {result.traced_bytes / 1024:.0f} KiB, "
            f"{result.traced_bytes / 1024 / traced * 1000:.1f} KiB per 1,000 shuffles; the largest by site:"
        )
        for line in result.traced:
            print(f"  {line}")
    rows = sorted(streaming_soak.growth(result), key=lambda g: (g.kind, g.label))
    print(f"\nper process, after the warm-up (shuffles {result.shuffles // 2}-{result.shuffles}):")
    for g in rows:
        per = "-" if g.rss_mib_per_1k is None else f"{g.rss_mib_per_1k:+8.2f}"
        every = (
            ""
            if g.rss_all_mib_per_1k is None or g.rss_floor_ls_mib_per_1k is None
            else f" (least squares: floor {g.rss_floor_ls_mib_per_1k:+.2f}, "
            f"every sample {g.rss_all_mib_per_1k:+.2f})"
        )
        fds = "-" if g.fds_growth is None else f"{g.fds_growth:+d}"
        print(
            f"  {g.label:48s} RSS {g.rss_start_mib:7.1f} -> {g.rss_end_mib:7.1f} MiB, "
            f"{per} MiB/1k shuffles{every}; fds {g.fds_start} -> {g.fds_end} ({fds})"
        )
    first_failed = ", ".join(f"{m} {n}" for m, n in result.first_failed_shuffle.items()) or "none"
    print()
    print(f"RESULT shuffles={result.shuffles}")
    print(f"RESULT pipelined_shuffles={result.by_mode.get('pipelined', 0)}")
    print(f"RESULT wrong_batches={result.wrong_batches}")
    print(f"RESULT failed_batches={result.failed_batches}")
    print(f"RESULT first_failed_shuffle={first_failed}")
    print(f"RESULT shuffles_per_minute={result.shuffles / max(result.seconds, 1e-9) * 60:.1f}")
    for name, value in streaming_soak.figures(result).items():
        print(f"RESULT {name}={value}")
    if result.traced_from is not None:
        print(f"RESULT traced_kib_per_1k_shuffles={result.traced_bytes / 1024 / traced * 1000:.1f}")
    print(f"RESULT load_1m={load[0]:.2f}->{load[1]:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="stop after this long (0: no limit)")
    parser.add_argument("--shuffles", type=int, default=None, help="stop after N shuffles")
    parser.add_argument("--trigger-ms", type=int, default=0, help="processing-time trigger (0: back to back)")
    parser.add_argument("--rows-per-batch", type=int, default=2_000)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--sample-s", type=float, default=1.0, help="least time between two samples")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--executor-memory", default="512m", help="spark.executor.memory")
    parser.add_argument(
        "--jvm-heaps",
        choices=("fixed", "grow"),
        default="fixed",
        help="fixed: every JVM's heap at its full size from the start (its RSS then shows what grows "
        "outside it); grow: G1's own sizing, RSS growing with the heap toward -Xmx",
    )
    parser.add_argument(
        "--interim-min",
        type=float,
        default=10.0,
        help="an INTERIM line of the figures so far this often (0: none)",
    )
    parser.add_argument(
        "--tracemalloc-from",
        type=int,
        default=None,
        metavar="N",
        help="debugging: trace the Python driver's allocations from shuffle N on; list the live ones",
    )
    args = parser.parse_args(argv)
    config = streaming_soak.SoakConfig(
        rows_per_batch=args.rows_per_batch,
        keys=args.keys,
        trigger_ms=args.trigger_ms,
        max_shuffles=args.shuffles,
        max_seconds=args.minutes * 60 if args.minutes > 0 else None,
        sample_every_s=args.sample_s,
        interim_every_s=args.interim_min * 60 if args.interim_min > 0 else None,
        trace_from=args.tracemalloc_from,
    )
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-streaming-soak-"))
    load_before = os.getloadavg()[0]
    print(
        f"{args.master}, executor memory {args.executor_memory} (JVM heaps {args.jvm_heaps}): "
        f"{args.rows_per_batch:,} rows per batch over "
        f"{args.keys} keys, trigger {args.trigger_ms} ms, modes {'/'.join(config.modes)}; "
        f"limits {args.minutes:g} min, {args.shuffles or 'no'} shuffles; "
        f"load average {load_before:.2f} (2 cores)",
        flush=True,
    )
    spark = None
    try:
        _environment(scratch)
        started = time.perf_counter()
        spark = _session(args.master, args.executor_memory, scratch, args.jvm_heaps == "fixed")
        print(f"session started in {time.perf_counter() - started:.1f} s", flush=True)
        result = streaming_soak.run(
            spark, config, str(scratch / "checkpoint"), log=lambda s: print(s, flush=True)
        )
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    report(result, (load_before, os.getloadavg()[0]))
    clean = not (result.wrong_batches or result.failed_batches or result.query_error)
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
