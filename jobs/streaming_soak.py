"""A streaming soak: an arrowbeat grouped shuffle in every micro-batch, each answer checked, the
processes' memory and descriptors sampled as shuffles accumulate.

The application arrowbeat's shuffle was built for is a Structured Streaming query that runs for
months with a shuffle in every micro-batch: anything kept per shuffle (a table entry, a socket, a
sender, a file) is a slow leak there, and a limit per application (a table of at most N shuffles)
is a query that breaks after N batches. This query finds both. Each micro-batch of a
``rate-micro-batch`` source (a fixed number of rows per batch, however long a batch takes) goes
through ``group_by(batch, "k").applyInArrow(summarise, ...)``, ``materialized`` and ``pipelined``
by turns, is released (``shuffle_of(out).release()``, as a streaming application should), and its
result is compared with Spark's own ``groupBy("k").agg(count, sum, min, max)`` of the same batch.
After a batch (the quiet point: no task of ours runs) ``ProcessSampler`` records the RSS and open
descriptors of every process of the application it can see from the driver:

- the Python driver (this process: the shuffle API, the pipelined rendezvous, the metrics writer),
- the driver JVM (py4j's gateway child, or this process's parent under ``spark-submit``) and the
  arrowbeat process it starts (``spark_plugin.processes.driver``: the RM, history writer),
- under each executor JVM: arrowbeat's agent (``spark_plugin.processes.executor``), the Python
  daemons and the Python workers they fork.

Executor JVMs are found under the driver JVM, which is where ``local-cluster`` launches them; on a
real cluster only the driver side is seen. A batch whose shuffle raises is a failed batch (counted,
its first errors kept) and the query goes on: a shuffle that stops working after N per
application shows as every later batch of that mode failing, not as the soak ending.

For runs of hours, ``SoakConfig.interim_every_s`` logs an ``INTERIM`` line of the figures so far
(a run stopped early still tells its growth); ``SoakConfig.trace_from`` (off by default) traces
the Python driver's allocations from a given shuffle on and lists where those still alive at the
end were made: the way to tell what the driver keeps per shuffle.

The soak's own bookkeeping stays small in the process it measures (the Python driver): samples
and timings are kept in flat arrays, and past ``MAX_SAMPLES`` per process every other sample is
dropped and the sampling interval doubled, so it holds at most a few hundred KiB however long it
runs.

Shared by ``benchmarks/streaming_soak.py`` (minutes to hours) and its short form in
``tests/spark/test_streaming_soak.py``. It lives in the jobs room (installed as
``spark_plugin.jobs``) because tests and benchmarks must not import each other and both may
import the package.
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import threading
import time
import tracemalloc
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
import pyarrow as pa

MODES = ("materialized", "pipelined")
SCHEMA = "k bigint, n bigint, s bigint, lo bigint, hi bigint"
"""What ``summarise`` returns per key, and what Spark's ``agg`` computes for comparison."""
KEEP_ERRORS = 5
"""Failed or wrong batches whose details are kept (all are counted)."""
MAX_SAMPLES = 2048
"""Samples kept per process; past it every other one is dropped and the interval doubled."""
PYTHON_KINDS = ("python driver", "driver-side arrowbeat", "agent", "Python daemon", "Python worker")
"""The processes whose memory is all Python's (no JVM heap filling up to its working size)."""
TRACE_TOP = 12
"""Allocation sites listed when the Python driver's allocations are traced (``trace_from``)."""
TIMINGS = ("build_s", "run_s", "release_s", "spark_s")
"""Per batch: building the shuffled DataFrame (a materialized shuffle's map side may run here),
collecting it (the shuffle), ``release()`` (map outputs deleted, ``shuffle_metrics`` rows
appended) and Spark's own answer for the same batch."""


def summarise(table: pa.Table) -> pa.Table:
    """One key group -> its count, sum, min and max of ``v`` (runs in the reduce task)."""
    import pyarrow.compute as pc

    v = table.column("v")
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int64()),
            "n": pa.array([table.num_rows], pa.int64()),
            "s": pa.array([pc.sum(v).as_py()], pa.int64()),
            "lo": pa.array([pc.min(v).as_py()], pa.int64()),
            "hi": pa.array([pc.max(v).as_py()], pa.int64()),
        }
    )


@dataclass(frozen=True)
class SoakConfig:
    """One soak: batches of ``rows_per_batch`` rows over ``keys`` keys, until ``max_shuffles``
    shuffles or ``max_seconds`` (whichever comes first; None: no such limit)."""

    rows_per_batch: int = 2_000
    keys: int = 64
    source_partitions: int = 2
    """Map tasks of a materialized shuffle. A pipelined one coalesces them into one: its map and
    reduce tasks run at once, and ``local-cluster[2,1,...]`` has two task slots."""
    reduce_partitions: int = 2
    """Upper bound of a materialized shuffle's reduce partitions (a pipelined one has one)."""
    trigger_ms: int = 0
    """Processing-time trigger; 0: the next batch as soon as one ends."""
    max_shuffles: int | None = None
    max_seconds: float | None = None
    sample_every_s: float = 1.0
    """Least time between two samples (taken after a batch, so at most one per batch)."""
    modes: tuple[str, ...] = MODES
    hang_s: float = 300.0
    """A batch running (or no batch starting) this long stops the soak: the query is stopped and
    that batch counted as failed."""
    interim_every_s: float | None = None
    """Every this long, one ``INTERIM`` line (:func:`interim_line`) with the figures so far, so a
    run of hours stopped early still tells its growth; None: none."""
    trace_from: int | None = None
    """A debugging aid, off by default: trace the Python driver's allocations (``tracemalloc``)
    from this many shuffles to the end, and list where those still alive at the end were made
    (``SoakResult.traced``). Tracing slows the driver and its own memory is in the driver's RSS:
    such a run's RSS figures are not the soak's."""
    trace_frames: int = 16
    """Frames kept per traced allocation."""


@dataclass
class Series:
    """One process over the soak: what it is, and its samples as flat arrays."""

    kind: str
    """``python driver``, ``driver JVM``, ``driver-side arrowbeat``, ``executor JVM``, ``agent``,
    ``Python daemon``, ``Python worker`` (or ``other``)."""
    label: str
    shuffles: array[int] = field(default_factory=lambda: array("q"))
    rss: array[int] = field(default_factory=lambda: array("q"))
    fds: array[int] = field(default_factory=lambda: array("q"))

    def add(self, shuffles: int, rss: int, fds: int) -> None:
        self.shuffles.append(shuffles)
        self.rss.append(rss)
        self.fds.append(fds)

    def thin(self) -> None:
        """Keeps every other sample (the first and the last kept)."""
        last = (self.shuffles[-1], self.rss[-1], self.fds[-1])
        for name in ("shuffles", "rss", "fds"):
            setattr(self, name, getattr(self, name)[::2])
        if self.shuffles[-1] != last[0]:
            self.add(*last)


@dataclass
class SoakResult:
    shuffles: int = 0
    by_mode: dict[str, int] = field(default_factory=dict)
    wrong_batches: int = 0
    failed_batches: int = 0
    first_failed_shuffle: dict[str, int] = field(default_factory=dict)
    """Per mode, the number (1-based, over all modes) of its first failed shuffle."""
    errors: list[str] = field(default_factory=list)
    times: dict[str, dict[str, array[float]]] = field(default_factory=dict)
    """Mode -> ``TIMINGS`` name -> seconds, one per batch that succeeded."""
    between_s: array[float] = field(default_factory=lambda: array("d"))
    """From the end of one batch's work to the start of the next: the query's own cost per batch
    (offsets and commits written to its checkpoint, the next batch planned)."""
    series: dict[int, Series] = field(default_factory=dict)
    """Pid -> its samples."""
    seconds: float = 0.0
    query_error: str | None = None
    traced_from: int | None = None
    """The shuffle after which the driver's allocations were traced (``SoakConfig.trace_from``)."""
    traced_to: int = 0
    traced_bytes: int = 0
    """Bytes allocated in the Python driver after ``traced_from`` and still alive at ``traced_to``."""
    traced: list[str] = field(default_factory=list)
    """The largest of them by allocation site (size, count, the most recent frames)."""


class ProcessSampler:
    """RSS and descriptor counts of the application's processes, found afresh at every sample
    (a restarted agent or a replaced worker is a new series: a new pid)."""

    def __init__(self, driver_jvm: psutil.Process | None) -> None:
        self.driver_jvm = driver_jvm
        self.me = psutil.Process()

    def processes(self) -> dict[int, tuple[str, str]]:
        """Pid -> (kind, label) of every process seen now."""
        found = {self.me.pid: ("python driver", "python driver")}
        if self.driver_jvm is None:
            return found
        found[self.driver_jvm.pid] = ("driver JVM", "driver JVM")
        with contextlib.suppress(psutil.Error):
            for child in self.driver_jvm.children():
                found.update(self._under_driver(child))
        return found

    def _under_driver(self, proc: psutil.Process) -> dict[int, tuple[str, str]]:
        try:
            args = proc.cmdline()
        except psutil.Error:
            return {}
        if proc.pid == self.me.pid:
            return {}
        if not any(a.endswith("CoarseGrainedExecutorBackend") for a in args):
            if "spark_plugin.processes.driver" in args:
                return {proc.pid: ("driver-side arrowbeat", f"driver-side arrowbeat pid {proc.pid}")}
            return {proc.pid: ("other", f"other ({_name(args)}) pid {proc.pid}")}
        executor = args[args.index("--executor-id") + 1] if "--executor-id" in args else "?"
        found = {proc.pid: ("executor JVM", f"executor {executor} JVM pid {proc.pid}")}
        with contextlib.suppress(psutil.Error):
            for child in proc.children():
                if "spark_plugin.processes.executor" in child.cmdline():
                    found[child.pid] = ("agent", f"executor {executor} agent pid {child.pid}")
                    continue
                found[child.pid] = ("Python daemon", f"executor {executor} Python daemon pid {child.pid}")
                for worker in child.children():
                    found[worker.pid] = (
                        "Python worker",
                        f"executor {executor} Python worker pid {worker.pid}",
                    )
        return found

    def sample(self, shuffles: int, into: dict[int, Series]) -> None:
        for pid, (kind, label) in self.processes().items():
            try:
                proc = self.me if pid == self.me.pid else psutil.Process(pid)
                rss, fds = proc.memory_info().rss, proc.num_fds()
            except psutil.Error:
                continue
            into.setdefault(pid, Series(kind, label)).add(shuffles, rss, fds)


def _name(args: list[str]) -> str:
    """A process's name from its arguments: the module after ``-m``, else the program."""
    if "-m" in args and args.index("-m") + 1 < len(args):
        return args[args.index("-m") + 1]
    return os.path.basename(args[0]) if args else "?"


def driver_jvm_of(spark: Any) -> psutil.Process | None:
    """The JVM behind ``spark``: py4j's gateway child when this process launched it, else the
    parent (``spark-submit`` starts the Python driver from the JVM)."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    if proc is not None:
        return psutil.Process(proc.pid)
    with contextlib.suppress(psutil.Error, IndexError):
        parent = psutil.Process().parent()
        if parent is not None and os.path.basename(parent.cmdline()[0]) == "java":
            return parent
    return None


def _answer(rows: list[Any]) -> dict[int, tuple[int, int, int, int]]:
    return {int(r["k"]): (int(r["n"]), int(r["s"]), int(r["lo"]), int(r["hi"])) for r in rows}


class _Soak:
    """The ``foreachBatch`` body and what it counts."""

    def __init__(self, spark: Any, config: SoakConfig, log: Callable[[str], None]) -> None:
        self.config = config
        self.log = log
        self.result = SoakResult(
            by_mode=dict.fromkeys(config.modes, 0),
            times={m: {t: array("d") for t in TIMINGS} for m in config.modes},
        )
        self.sampler = ProcessSampler(driver_jvm_of(spark))
        self.sample_every_s = config.sample_every_s
        self.done = threading.Event()
        self.in_batch = False
        self.started = time.monotonic()
        self.last_event = self.started
        """When a batch last started or ended: the hang watch counts from here."""
        self._last_sample = -1e18
        self._last_log = self.started
        self._last_interim = self.started

    def enough(self) -> bool:
        c, r = self.config, self.result
        over_time = c.max_seconds is not None and time.monotonic() - self.started >= c.max_seconds
        return over_time or (c.max_shuffles is not None and r.shuffles >= c.max_shuffles)

    def sample(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_sample < self.sample_every_s:
            return
        self._last_sample = now
        self.sampler.sample(self.result.shuffles, self.result.series)
        if any(len(s.shuffles) > MAX_SAMPLES for s in self.result.series.values()):
            for series in self.result.series.values():
                series.thin()
            self.sample_every_s *= 2

    def __call__(self, batch: Any, batch_id: int) -> None:
        if self.done.is_set():
            return  # the soak is over and the query being stopped: no more shuffles
        if self.result.shuffles == 0:
            self.sample(force=True)  # the starting point, before any shuffle of ours
        else:
            self.result.between_s.append(time.monotonic() - self.last_event)
        self.in_batch, self.last_event = True, time.monotonic()
        try:
            self._one(batch, self.config.modes[self.result.shuffles % len(self.config.modes)])
        finally:
            self.in_batch, self.last_event = False, time.monotonic()
        if self.config.trace_from is not None and self.result.shuffles == self.config.trace_from:
            start_tracing(self.result, self.config.trace_frames)
        if self.enough():
            self.sample(force=True)
            finish_tracing(self.result)
            self.done.set()
            return
        self.sample()
        now = time.monotonic()
        if now - self._last_log >= 30:
            self._last_log = now
            self.log(progress(self.result, now - self.started))
        if (
            self.config.interim_every_s is not None
            and now - self._last_interim >= self.config.interim_every_s
        ):
            self._last_interim = now
            self.log(interim_line(self.result, now - self.started))

    def _one(self, batch: Any, mode: str) -> None:
        from pyspark.sql import functions as F

        from spark_plugin.shuffle import group_by, shuffle_of

        r = self.result
        r.shuffles += 1
        r.by_mode[mode] += 1
        number = r.shuffles
        out = None
        took = dict.fromkeys(TIMINGS, 0.0)
        try:
            started = time.perf_counter()
            if mode == "pipelined":
                grouped = group_by(batch.coalesce(1), "k", num_partitions=1, mode=mode)
            else:
                grouped = group_by(batch, "k", num_partitions=self.config.reduce_partitions, mode=mode)
            out = grouped.applyInArrow(summarise, SCHEMA)
            took["build_s"] = time.perf_counter() - started
            got = _answer(out.collect())
            took["run_s"] = time.perf_counter() - started - took["build_s"]
        except Exception as exc:
            r.failed_batches += 1
            r.first_failed_shuffle.setdefault(mode, number)
            self._keep(f"shuffle {number} ({mode}) failed: {type(exc).__name__}: {_first_line(exc)}")
            return
        finally:
            if out is not None:
                releasing = time.perf_counter()
                with contextlib.suppress(Exception):  # a failed release is the TTL's to clean up
                    shuffle_of(out).release()
                took["release_s"] = time.perf_counter() - releasing
        comparing = time.perf_counter()
        want = _answer(
            batch.groupBy("k")
            .agg(
                F.count("*").alias("n"), F.sum("v").alias("s"), F.min("v").alias("lo"), F.max("v").alias("hi")
            )
            .collect()
        )
        took["spark_s"] = time.perf_counter() - comparing
        for name, seconds in took.items():
            r.times[mode][name].append(seconds)
        if got != want:
            r.wrong_batches += 1
            missing = sorted(set(want) - set(got))[:5]
            differ = sorted(k for k in set(want) & set(got) if want[k] != got[k])[:5]
            self._keep(
                f"shuffle {number} ({mode}) wrong: {len(got)} keys against Spark's {len(want)}, "
                f"missing {missing}, different {differ}"
            )

    def _keep(self, error: str) -> None:
        if len(self.result.errors) < KEEP_ERRORS:
            self.result.errors.append(error)
        self.log(error)


def _first_line(exc: BaseException) -> str:
    """The line of an error (often a py4j-wrapped Python traceback) that names the error."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if "Error" in line or "Exception" in line]
    return (lines[-1] if lines else text)[:400]


def progress(result: SoakResult, seconds: float) -> str:
    """One line on how the soak is going."""
    driver = [s for s in result.series.values() if s.kind == "python driver"]
    rss = f", python driver RSS {driver[0].rss[-1] / 2**20:.0f} MiB" if driver else ""
    return (
        f"{seconds / 60:5.1f} min: {result.shuffles} shuffles {result.by_mode}, wrong "
        f"{result.wrong_batches}, failed {result.failed_batches}{rss}"
    )


def run(spark: Any, config: SoakConfig, checkpoint: str, log: Callable[[str], None] = print) -> SoakResult:
    """Runs the soak's query on ``spark`` until ``config``'s limits and returns what it saw. The
    query is stopped before this returns, whatever happened."""
    soak = _Soak(spark, config, log)
    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", config.rows_per_batch)
        .option("numPartitions", config.source_partitions)
        .load()
        .selectExpr(f"value % {config.keys} AS k", "value AS v")
    )
    query = (
        rows.writeStream.foreachBatch(soak)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
        .queryName("arrowbeat_streaming_soak")
        .start()
    )
    try:
        while not soak.done.wait(1.0):
            if not query.isActive:
                error = query.exception()
                soak.result.query_error = _first_line(error) if error is not None else "the query stopped"
                break
            if time.monotonic() - soak.last_event > config.hang_s:
                what = "a batch ran" if soak.in_batch else "no batch started"
                soak.result.query_error = f"{what} for {config.hang_s:.0f} s: the soak stopped its query"
                soak.result.failed_batches += int(soak.in_batch)
                break
    finally:
        soak.done.set()
        query.stop()
        soak.result.seconds = time.monotonic() - soak.started
        finish_tracing(soak.result)  # the query ended otherwise: what was traced until then
    return soak.result


_tracing_lock = threading.Lock()
"""The query's batch thread and the caller of :func:`run` may both end the tracing."""


def start_tracing(result: SoakResult, frames: int) -> None:
    """Starts tracing this process's Python allocations (unless something else already does)."""
    if tracemalloc.is_tracing():
        return
    tracemalloc.start(frames)
    result.traced_from = result.shuffles


def finish_tracing(result: SoakResult, top: int = TRACE_TOP) -> None:
    """What was allocated since :func:`start_tracing` and is still alive, by allocation site;
    then tracing stops (once: a second call finds nothing to do). Garbage in reference cycles is
    collected first: PySpark leaves some per batch (cloudpickle's picklers, ``StructType``'s
    recursive closures), which the collector frees in its own time and is no leak."""
    with _tracing_lock:
        if result.traced_from is None or not tracemalloc.is_tracing():
            return
        gc.collect()
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        tracemalloc.stop()
    stats = snapshot.statistics("traceback")
    result.traced_to = result.shuffles
    result.traced_bytes = sum(s.size for s in stats)
    for stat in stats[:top]:
        frames = "\n      ".join(stat.traceback.format(limit=6, most_recent_first=True))
        result.traced.append(f"{stat.size / 1024:9.1f} KiB in {stat.count} blocks, made at\n      {frames}")


@dataclass(frozen=True)
class Growth:
    """One process's figures over the measured window (the shuffles after the warm-up)."""

    kind: str
    label: str
    rss_start_mib: float
    rss_end_mib: float
    rss_mib_per_1k: float | None
    """Growth of the process's RSS floor in MiB per 1,000 shuffles: the Theil-Sen slope
    (:func:`median_slope`) of the lowest sample of each of ``FLOOR_BINS`` equal spans of the
    window (:func:`floor`). None: the process did not live through most of the window, or was
    sampled too few times in it."""
    fds_start: int
    fds_end: int
    fds_growth: int | None
    """Median descriptor count of the window's last ``EDGE`` samples minus that of its first
    ``EDGE`` (a median, so one sample caught mid-close does not decide it); None as above."""
    rss_all_mib_per_1k: float | None = None
    """The least-squares slope over every sample of the window (what ``rss_mib_per_1k`` was before
    the floor): shown beside it, as a process's transient memory makes it swing."""
    rss_floor_ls_mib_per_1k: float | None = None
    """The least-squares slope of the same floor (what ``rss_mib_per_1k`` was before the median):
    shown beside it, as one step in the floor (a pool of threads made once) tilts it."""


EDGE = 5
FLOOR_BINS = 8
"""Spans of the window whose lowest samples make a process's RSS floor (:func:`floor`)."""


def slope(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``points`` (x, y); None for fewer than 3 or a single x."""
    if len(points) < 3:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def median_slope(points: list[tuple[float, float]]) -> float | None:
    """The Theil-Sen slope of ``points`` (x, y): the median of the slopes of every pair with
    distinct x; None for fewer than 3 points or a single x.

    A leak raises a process's floor a little with every shuffle, and every pair of points sees it.
    A one-off step (a JVM making a pool of threads once, 21 MiB, at a fifth of the long soak's
    window) is seen only by the pairs that straddle it; while they are under half of all pairs
    (the step in the window's first or last 29%) the median is the slope on either side of it,
    where the least-squares slope of the same floor read +4.9 MiB per 1,000 shuffles."""
    if len(points) < 3:
        return None
    slopes = sorted(
        (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1
    )
    return statistics.median(slopes) if slopes else None


def _key(kind: str) -> str:
    return kind.lower().replace(" ", "_").replace("-", "_")


def figures(result: SoakResult, warm_up: float = 0.5) -> dict[str, str]:
    """The memory and descriptor figures of the soak's ``RESULT`` lines, by name, from
    :func:`growth`: the worst process (and its kind), the worst that is not a JVM, the worst of
    each kind, and the worst descriptor growth (and its kind, ``none`` when nothing grew)."""
    rows = sorted(growth(result, warm_up), key=lambda g: (g.kind, g.label))
    measured = [g for g in rows if g.rss_mib_per_1k is not None]
    out: dict[str, str] = {}
    worst = max(measured, key=lambda g: g.rss_mib_per_1k or 0.0, default=None)
    if worst is not None:
        out["rss_mib_per_1k_shuffles_max"] = f"{worst.rss_mib_per_1k:.2f}"
        out["rss_worst_kind"] = worst.kind
    python = [g.rss_mib_per_1k or 0.0 for g in measured if g.kind in PYTHON_KINDS]
    if python:
        out["rss_mib_per_1k_shuffles_max_python"] = f"{max(python):.2f}"
    for kind in sorted({g.kind for g in measured}):
        top = max(g.rss_mib_per_1k or 0.0 for g in measured if g.kind == kind)
        out[f"rss_mib_per_1k_shuffles.{_key(kind)}"] = f"{top:.2f}"
    fds_worst = max(
        (g for g in rows if g.fds_growth is not None), key=lambda g: g.fds_growth or 0, default=None
    )
    if fds_worst is not None:
        out["fds_growth_max"] = str(fds_worst.fds_growth)
        out["fds_worst_kind"] = fds_worst.kind if fds_worst.fds_growth else "none"
    return out


def interim_line(result: SoakResult, seconds: float) -> str:
    """One ``INTERIM`` line: the run's figures so far (growth over the second half of the shuffles
    until now), as ``name=value`` pairs named as the ``RESULT`` lines are (a kind's spaces as ``_``)."""
    pairs = {
        "minutes": f"{seconds / 60:.1f}",
        "shuffles": str(result.shuffles),
        "pipelined_shuffles": str(result.by_mode.get("pipelined", 0)),
        "wrong_batches": str(result.wrong_batches),
        "failed_batches": str(result.failed_batches),
        **figures(result),
        "load_1m": f"{os.getloadavg()[0]:.2f}",
    }
    return "INTERIM " + " ".join(f"{name}={value.replace(' ', '_')}" for name, value in pairs.items())


def floor(points: list[tuple[float, float]], bins: int = FLOOR_BINS) -> list[tuple[float, float]]:
    """The lowest point of each of ``bins`` equal spans of ``points``' x (empty spans give none).

    What a process keeps raises its floor; what it holds for a while does not. A sample is taken
    after a batch, and a reused Python worker's RSS then reads 141 or 176 MiB depending on whether
    its last task's memory was given back yet: over every sample, such a worker's slope swung by
    +-30 MiB per 1,000 shuffles between runs while its floor stayed at 141 MiB."""
    if not points:
        return []
    lo, hi = points[0][0], points[-1][0]
    width = (hi - lo) / bins or 1.0
    lowest: dict[int, tuple[float, float]] = {}
    for x, y in points:
        b = min(int((x - lo) / width), bins - 1)
        if b not in lowest or y < lowest[b][1]:
            lowest[b] = (x, y)
    return [lowest[b] for b in sorted(lowest)]


def growth(result: SoakResult, warm_up: float = 0.5) -> list[Growth]:
    """Each process's growth after the warm-up (the first ``warm_up`` of the shuffles)."""
    first = int(result.shuffles * warm_up)
    span = max(result.shuffles - first, 1)
    out = []
    for series in result.series.values():
        index = [i for i, n in enumerate(series.shuffles) if n >= first]
        if not index:
            continue
        lived = series.shuffles[index[-1]] - series.shuffles[index[0]]
        whole = len(index) >= 2 * EDGE and lived >= 0.8 * span
        rss = [(float(series.shuffles[i]), series.rss[i] / 2**20) for i in index]
        fds = [series.fds[i] for i in index]
        lowest = floor(rss)
        per = median_slope(lowest) if whole else None
        least_squares = slope(lowest) if whole else None
        every = slope(rss) if whole else None
        grown = int(statistics.median(fds[-EDGE:]) - statistics.median(fds[:EDGE])) if whole else None
        out.append(
            Growth(
                series.kind,
                series.label,
                rss[0][1],
                rss[-1][1],
                None if per is None else per * 1000,
                fds[0],
                fds[-1],
                grown,
                None if every is None else every * 1000,
                None if least_squares is None else least_squares * 1000,
            )
        )
    return out


def timings(result: SoakResult) -> dict[str, dict[str, tuple[float, float]]]:
    """Mode -> ``TIMINGS`` name -> (median, 95th percentile) in seconds, over successful batches."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for mode, by_name in result.times.items():
        for name, values in by_name.items():
            if values:
                ordered = sorted(values)
                p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
                out.setdefault(mode, {})[name] = (statistics.median(ordered), p95)
    return out
