"""Chaos soak (issue 24, item 7): a streaming query on a two-host standalone cluster while a seeded
fault injector kills and freezes its parts, and the invariants that make monitoring worth having
are checked throughout.

The cluster is ``harness/standalone.py``'s: a Master and two Workers, each its own host
(127.0.0.2, 127.0.0.3, one core, its own temp and work dirs), the driver here (client mode),
arrowbeat with interval 0.5 s and timeout 2 s. The query: a ``rate-micro-batch`` source (the rate
source whose batches are a pure function of their offsets, so the expected output of a committed
batch is known exactly), each micro-batch summed per key by an arrowbeat ``group_apply`` inside
``foreachBatch`` and appended to a Delta sink with Delta's idempotent-write options (a retried
batch is written once). A query that fails is started again from its checkpoint, as a streaming
application's supervisor would.

Faults, one at a time, in a seeded order (every kind once per round, each round shuffled; the
target host and hold times drawn from the same seed), each logged with its time, kind and target.
An RM fault that would spend the last restart the JVM allows within its window
(``spark.arrowbeat.rm.restarts.max`` per ``.window``, 10 per 10 minutes by default) is left out
(``rm_faults_left_out``): past the budget a restart waits by design.

- ``executor_kill`` / ``executor_freeze``: SIGKILL, or SIGSTOP then SIGCONT, on an executor JVM;
- ``agent_kill`` / ``agent_freeze``: the same on its agent (``spark_plugin.processes.executor``);
- ``rm_kill`` / ``rm_freeze``: the same on the RM (``spark_plugin.processes.driver``);
- ``host_kill`` / ``host_freeze``: the same on a Worker and everything under it (a killed host's
  Worker is started again after a few seconds);
- ``tables_unwritable``: the history tables' directories made unwritable for a few seconds
  (``chmod``; as root, whom modes do not stop, the immutable attribute, ``chattr +i``).

Everything frozen is thawed and every directory restored in ``finally``.

Invariants (``RESULT`` lines; the run fails unless every one holds):

- *detected within its bound* (``faults_detected`` equals ``faults_injected``): an executor,
  agent or host fault by a loss event of that executor in ``executor_events`` within interval +
  timeout + slack; an RM fault by the RM answering again and a ``MONITORING_GAP`` event; the
  tables by the rows of the unwritable window landing once writable again (nothing lost);
- *recovered*: after each fault the executors Spark runs are RUNNING again (or UNMONITORED with a
  reason) within the fault's recovery bound;
- ``false_timeouts``: HEARTBEAT_TIMEOUT or UNREACHABLE events of executors that no fault touched
  (an RM fault touches none: an RM that wakes from a pause must not convict the executors);
- ``silent_unmonitored_s``: seconds an executor that Spark runs, whose JVM lives, spent neither
  RUNNING nor UNMONITORED-with-reason in the RM's view (``ListExecutors``), outside a fault's
  window and its recovery bound and past the registration grace of a new executor;
- ``lost_rows``: rows of committed batches (the checkpoint's commit log) missing from the sink
  (``extra_rows``: duplicates or wrong values; ``inexact_batches``: batches whose output is not
  exactly the expected aggregation);
- ``leaked_processes`` (of this run, once the cluster stopped), ``leaked_files`` (arrowbeat's files
  of the application still on a live host's disk once the application ended and its Workers had
  time to remove its dirs; a killed host's disk is counted apart, as ``dead_host_files``) and
  ``leaked_fds`` (descriptors of this process, where the driver's Python side runs, open at the
  end and not at the start; the start is counted after delta-rs's and gRPC's process-wide runtimes
  exist);
- ``unsettled``: times the cluster was not whole again (both hosts running an executor that Spark
  lists and the RM has RUNNING or UNMONITORED) within a minute of a fault, or at the end;
- ``monitor_errors``: samples the monitor could not take (a bug here, not a finding);
- ``cleanup_failures``: clean-up steps that raised (each is logged; the later ones still ran).

``committed_batches``, ``expected_rows`` and ``query_restarts`` say how much the query did.

    flock /tmp/arrowbeat-spark.lock .venv/bin/python -m benchmarks.chaos --duration 1800 --seed 7
    flock /tmp/arrowbeat-spark.lock .venv/bin/python -m benchmarks.chaos --short   (under 2 minutes)

It lives in ``harness/`` because the suite runs its short form (``tests/spark/test_chaos.py``) and
checks its arithmetic (``tests/test_chaos_checks.py``); ``benchmarks/chaos.py`` is its command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.compute as pc

from harness.env import clean_up, prepare
from harness.history_read import rows
from harness.procs import end, ours, wait_until
from harness.session import build_session, stop_session
from harness.standalone import StandaloneCluster, Worker, free_port

INTERVAL_S, TIMEOUT_S = 0.5, 2.0
SLACK_S = 5.0
"""Beyond the protocol's own bounds: scheduling delay of a process on a loaded 2-core machine."""
DETECT_S = INTERVAL_S + TIMEOUT_S + SLACK_S
"""An executor, agent or host fault must show as a loss event of its executor within this."""
STARTUP_S = 15.0
"""``spark.arrowbeat.startupTimeout``: how long a JVM waits for its arrowbeat process."""
REGISTER_GRACE_S = STARTUP_S + TIMEOUT_S + SLACK_S
"""A new executor must be RUNNING or UNMONITORED within this of Spark listing it (the RM's own
``register_within_s`` plus slack)."""
RECOVER_S = 20.0
"""After a fault ends (thaw, or a kill), its executors must be RUNNING (or UNMONITORED with a
reason, or gone from Spark) within this: a re-registration is interval + backoff + slack."""
RM_BOUND_S = 30.0
"""An RM fault: the RM answering again, its gap recorded, and every executor RUNNING within this
of the kill or the thaw."""
TABLES_BOUND_S = 15.0
"""The rows of an unwritable window in the tables within this of the tables being writable."""
STEADY_WAIT_S = 60.0
"""How long the injector waits for the cluster to be whole again before the next fault."""
SAMPLE_S = 1.0
ROWS_PER_BATCH = 2000
KEYS = 16
SECRET = "chaos-soak-secret-0123456789abcdef"
LOSS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE", "UNREGISTERED", "UNMONITORED", "SPARK_LOST", "SPARK_REMOVED"}
TIMEOUTS = {"HEARTBEAT_TIMEOUT", "UNREACHABLE"}
BACK = {"REGISTERED", "REREGISTERED"}
KINDS = (
    "executor_kill",
    "executor_freeze",
    "agent_kill",
    "agent_freeze",
    "rm_kill",
    "rm_freeze",
    "host_kill",
    "host_freeze",
    "tables_unwritable",
)
RM_KINDS = {"rm_kill", "rm_freeze"}
SHORT_FAULTS = len(KINDS)
"""``--short``: one round, every kind of fault once in the seeded order, then the end (the short
form runs in ``make test``). A deadline instead (it was 100 s from the start) spent the seconds a
slow start-up left on a partial round, or on a second one: coverage varied with the load."""
SINK_SCHEMA = "k bigint, n bigint, sv bigint"


# -- the streaming job ---------------------------------------------------------------------------
def batch_summary(table: pa.Table) -> pa.Table:
    """One key's rows of a micro-batch -> key, row count, sum of ``value`` (``SINK_SCHEMA``)."""
    return pa.table(
        {
            "k": pa.array([table.column("k")[0].as_py()], pa.int64()),
            "n": pa.array([table.num_rows], pa.int64()),
            "sv": pa.array([pc.sum(table.column("value")).as_py()], pa.int64()),
        }
    )


def expected_batch(start: int, stop: int) -> dict[int, tuple[int, int]]:
    """What ``batch_summary`` per key must give for the values ``start`` .. ``stop - 1`` (key
    ``value % KEYS``): per key an arithmetic series, summed in closed form."""
    out: dict[int, tuple[int, int]] = {}
    for k in range(KEYS):
        first = start + (k - start) % KEYS
        if first < stop:
            n = (stop - 1 - first) // KEYS + 1
            out[k] = (n, n * first + KEYS * n * (n - 1) // 2)
    return out


class StopRequested(Exception):
    """Raised by the batch callback once the soak is over, to end the query between batches."""


class StreamKeeper:
    """Runs the query on its own thread and starts it again from the checkpoint when it fails."""

    def __init__(self, spark: Any, sink: Path, checkpoint: Path) -> None:
        self.spark, self.sink, self.checkpoint = spark, sink, checkpoint
        self.restarts = 0
        self.failures: list[str] = []
        self.release_errors = 0
        self._stop = threading.Event()
        self._query: Any = None
        self._thread = threading.Thread(target=self._run, name="chaos-stream", daemon=True)

    def write_batch(self, batch: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        if self._stop.is_set():
            raise StopRequested(f"batch {batch_id} not run: the soak is over")

        from spark_plugin.shuffle import group_apply, shuffle_of

        keyed = batch.selectExpr("value", f"value % {KEYS} AS k")
        out = group_apply(keyed, ["k"], batch_summary, SINK_SCHEMA)
        try:
            (
                out.withColumn("batch_id", F.lit(batch_id).cast("bigint"))
                .write.format("delta")
                .mode("append")
                .option("txnAppId", "arrowbeat-chaos")
                .option("txnVersion", batch_id)
                .save(str(self.sink))
            )
        finally:
            try:
                shuffle_of(out).release()
            except Exception as exc:  # an agent killed meanwhile: its files go with its executor
                self.release_errors += 1
                log(f"release of batch {batch_id}'s shuffle failed: {type(exc).__name__}: {exc}"[:300])

    def _start(self) -> None:
        source = (
            self.spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", ROWS_PER_BATCH)
            .option("numPartitions", 2)
            .load()
        )
        self._query = (
            source.writeStream.foreachBatch(self.write_batch)
            .option("checkpointLocation", str(self.checkpoint))
            .trigger(processingTime="1 second")
            .start()
        )

    def start(self) -> None:
        self._start()
        self._thread.start()

    def committed(self) -> list[int]:
        folder = self.checkpoint / "commits"
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self._query.awaitTermination(1):
                    if self._stop.is_set():
                        return
                    raise RuntimeError("the query stopped on its own")
            except Exception as exc:
                if self._stop.is_set():
                    return
                self.failures.append(f"{type(exc).__name__}: {str(exc)[:300]}")
                log(f"query failed ({self.failures[-1][:200]}); starting it again from its checkpoint")
                self.restarts += 1
                with contextlib.suppress(Exception):
                    self._query.stop()
                try:
                    self._start()
                except Exception as again:
                    self.failures.append(f"restart: {type(again).__name__}: {str(again)[:300]}")
                    self._stop.wait(2.0)

    def stop(self) -> None:
        """Ends the query between two batches: the batch in flight finishes and commits, the next
        one fails at its start (``StopRequested``: nothing written, nothing committed). A
        ``query.stop()`` that interrupts a batch's Python callback instead ends Spark's stream
        thread in a StackOverflowError (a regex over the interrupted call's message); it is only
        the fallback for a batch that does not finish."""
        self._stop.set()
        with contextlib.suppress(Exception):
            wait_until(lambda: not self._query.isActive, 60, interval_s=0.1)
        with contextlib.suppress(Exception):
            self._query.stop()
        self._thread.join(timeout=60)


# -- what runs where -------------------------------------------------------------------------------
def cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@dataclass
class Executor:
    executor_id: str
    worker: Worker
    jvm: psutil.Process
    agent: psutil.Process | None


def executors(cluster: StandaloneCluster) -> dict[str, Executor]:
    """Executor id -> its JVM and agent, from every live Worker's process tree."""
    found: dict[str, Executor] = {}
    for worker in cluster.workers:
        for jvm in cluster.executors_of(worker):
            with contextlib.suppress(psutil.Error, ValueError, IndexError):
                args = jvm.cmdline()
                agents = [
                    c for c in jvm.children(recursive=True) if "spark_plugin.processes.executor" in cmd(c)
                ]
                found[args[args.index("--executor-id") + 1]] = Executor(
                    args[args.index("--executor-id") + 1], worker, jvm, agents[0] if agents else None
                )
    return found


def rm_process() -> psutil.Process | None:
    """The driver-side process (the RM) of this run, the newest if a restart overlaps."""
    found = [p for p in ours("spark_plugin.processes.driver") if p.is_running()]
    return max(found, key=lambda p: p.create_time()) if found else None


def one(proc: psutil.Process) -> Callable[[], list[psutil.Process]]:
    return lambda: [proc]


def stopped(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def spark_executor_ids(spark: Any) -> set[str] | None:
    try:
        text = str(spark.sparkContext._jsc.sc().getExecutorIds().mkString(","))
    except Exception:
        return None
    return {e for e in text.split(",") if e}


def rm_restart_budget(spark: Any) -> tuple[int, float] | None:
    """(restarts, window in seconds) the driver JVM allows the RM (``spark.arrowbeat.rm.restarts.*``),
    or None where this build declares no such budget."""
    from spark_plugin.settings.config import early_value

    settings = {str(k): str(v) for k, v in spark.sparkContext.getConf().getAll()}
    try:
        most = early_value(settings, "spark.arrowbeat.rm.restarts.max")
        window = early_value(settings, "spark.arrowbeat.rm.restarts.window")
    except KeyError:
        return None
    return int(most), float(window)


def rm_states(address: str) -> dict[str, str] | None:
    from heartbeat.rm.admin import list_executors

    try:
        return {e.executor_id: e.state for e in list_executors(address, SECRET, timeout_s=2.0)}
    except Exception:
        return None


def events(tables: Path) -> list[dict[str, Any]]:
    try:
        return rows(tables, "executor_events")
    except Exception:  # a commit landing as we read; the next look sees it
        return []


def gap_rows(tables: Path) -> set[str]:
    """The details of every ``MONITORING_GAP`` row (``from=... to=... lost_rows=... cause=...``)."""
    return {str(r["detail"]) for r in events(tables) if r["event"] == "MONITORING_GAP"}


def first_event(tables: Path, kinds: set[str], executor_ids: set[str], after: float) -> dict[str, Any] | None:
    for r in events(tables):
        if r["event"] in kinds and r["executor_id"] in executor_ids and r["ts"].timestamp() >= after:
            return r
    return None


# -- faults ----------------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str
    started: float
    target: str
    executors: set[str] = field(default_factory=set)
    ended: float | None = None
    detected: bool = False
    """Its check held within its bound."""
    recovery_checked: bool = False
    states_after: dict[str, str] = field(default_factory=dict)
    """The RM's state of the fault's executors once recovered (``absent``: not listed)."""
    detected_after_s: float | None = None
    recovered_after_s: float | None = None
    problems: list[str] = field(default_factory=list)

    def window_end(self) -> float:
        return (self.ended if self.ended is not None else time.time()) + (
            RM_BOUND_S if self.kind in RM_KINDS else RECOVER_S
        )

    def covers(self, executor_id: str, ts: float) -> bool:
        """Whether ``executor_id`` at ``ts`` is inside this fault's window and recovery bound."""
        touched = self.kind in RM_KINDS or executor_id in self.executors
        return touched and self.started - 1.0 <= ts <= self.window_end()


def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


class Frozen:
    """Every process this run stopped, so ``thaw_all`` can always send SIGCONT."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()

    def stop(self, procs: list[psutil.Process]) -> None:
        for proc in procs:
            with self._lock:
                self._procs[proc.pid] = proc
            with contextlib.suppress(psutil.Error):
                proc.suspend()

    def thaw(self, procs: list[psutil.Process]) -> None:
        for proc in reversed(procs):
            with contextlib.suppress(psutil.Error):
                proc.resume()
            with self._lock:
                self._procs.pop(proc.pid, None)

    def thaw_all(self) -> None:
        with self._lock:
            procs = list(self._procs.values())
        self.thaw(procs)


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[list[str]]:
    """Every directory under ``path`` unwritable while inside; restored on the way out."""
    dirs = [str(path), *(os.path.join(d, n) for d, names, _ in os.walk(path) for n in names)]
    if os.geteuid() == 0:  # modes do not stop root; the immutable attribute does (ext4, xfs, btrfs)
        subprocess.run(["chattr", "+i", *dirs], check=True, capture_output=True)
        try:
            yield dirs
        finally:
            subprocess.run(["chattr", "-i", *dirs], check=False, capture_output=True)
    else:
        modes = {d: os.stat(d).st_mode for d in dirs}
        for d in dirs:
            os.chmod(d, 0o555)
        try:
            yield dirs
        finally:
            for d, mode in modes.items():
                with contextlib.suppress(OSError):
                    os.chmod(d, mode)


class Chaos:
    """The injector, the monitor and the checks, over one application on one cluster."""

    def __init__(self, spark: Any, cluster: StandaloneCluster, tables: Path, seed: int) -> None:
        self.spark, self.cluster, self.tables = spark, cluster, tables
        self.rng = random.Random(seed)
        self.address = str(spark.sparkContext.getConf().get("spark.arrowbeat.rm.address"))
        self.rm_budget = rm_restart_budget(spark)
        self.faults: list[Fault] = []
        self.frozen = Frozen()
        self.first_seen: dict[str, float] = {}
        self.silent_s: dict[str, float] = {}
        self.unmonitored_s: dict[str, float] = {}
        self.killed_host_entries: set[Path] = set()
        self.monitor_error: str = ""
        self.monitor_errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor = threading.Thread(target=self._watch, name="chaos-monitor", daemon=True)

    # -- the monitor -------------------------------------------------------------------------------
    def start_monitor(self) -> None:
        self._monitor.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        self._monitor.join(timeout=30)

    def exempt(self, executor_id: str, ts: float) -> bool:
        with self._lock:
            faults = list(self.faults)
        return any(f.covers(executor_id, ts) for f in faults)

    def _watch(self) -> None:
        last = time.time()
        while not self._stop.wait(SAMPLE_S):
            try:
                self._sample(last)
            except Exception as exc:  # a bug here must not end the watch silently, nor pass unseen
                self.monitor_errors += 1
                self.monitor_error = f"{type(exc).__name__}: {exc}"
            last = time.time()

    def _sample(self, last: float) -> None:
        spark_ids = spark_executor_ids(self.spark)
        states = rm_states(self.address)
        now = time.time()
        dt = min(now - last, 5 * SAMPLE_S)
        if spark_ids is None:
            return
        procs = executors(self.cluster)
        for executor_id in spark_ids:
            self.first_seen.setdefault(executor_id, now)
            proc = procs.get(executor_id)
            if proc is None or not alive(proc.jvm) or stopped(proc.jvm):
                continue  # gone (Spark has not noticed yet) or frozen by a fault
            if now - self.first_seen[executor_id] < REGISTER_GRACE_S or self.exempt(executor_id, now):
                continue
            state = None if states is None else states.get(executor_id)
            if state == "UNMONITORED":
                self.unmonitored_s[executor_id] = self.unmonitored_s.get(executor_id, 0.0) + dt
            elif state != "RUNNING":
                if executor_id not in self.silent_s or self.silent_s[executor_id] == 0:
                    log(f"executor {executor_id} (JVM alive) is {state or 'unknown'} in the RM's view")
                self.silent_s[executor_id] = self.silent_s.get(executor_id, 0.0) + dt

    # -- steady state ------------------------------------------------------------------------------
    def whole(self) -> bool:
        """Both hosts run an executor that Spark lists and the RM has RUNNING (or UNMONITORED)."""
        procs = executors(self.cluster)
        spark_ids = spark_executor_ids(self.spark) or set()
        states = rm_states(self.address) or {}
        live = {e for e, p in procs.items() if alive(p.jvm)}
        return (
            len(live) == len(self.cluster.workers)
            and live <= spark_ids
            and all(states.get(e) in ("RUNNING", "UNMONITORED") for e in live)
        )

    # -- the injector ------------------------------------------------------------------------------
    def rm_fault_allowed(self) -> bool:
        """Whether one more RM fault stays within the JVM's restart budget, one restart spared for
        a failure nobody injected: past the budget a restart waits (by design), and the soak would
        measure the budget instead of the recovery."""
        if self.rm_budget is None:
            return True
        most, window_s = self.rm_budget
        with self._lock:
            recent = [f for f in self.faults if f.kind in RM_KINDS and f.started > time.time() - window_s]
        return len(recent) < most - 1

    def plan(self, count: int) -> list[str]:
        kinds: list[str] = []
        while len(kinds) < count:
            round_ = list(KINDS)
            self.rng.shuffle(round_)
            kinds.extend(round_)
        return kinds[:count]

    def inject(self, kind: str) -> Fault:
        procs = executors(self.cluster)
        hosts = self.cluster.workers
        if kind.startswith("agent_"):  # a host whose executor has an agent, if one has
            hosts = [w for w in hosts if any(p.worker is w and p.agent for p in procs.values())] or hosts
        elif kind.startswith("executor_"):
            hosts = [w for w in hosts if any(p.worker is w for p in procs.values())] or hosts
        worker = self.rng.choice(hosts)
        hold_s = self.rng.uniform(0.0, 2.0)
        on_worker = [p for p in procs.values() if p.worker is worker]
        touched = set() if kind in RM_KINDS or kind == "tables_unwritable" else on_worker
        fault = Fault(kind, time.time(), worker.host, {p.executor_id for p in touched})
        if kind.startswith(("executor_", "agent_")) and not on_worker:
            fault.problems.append(f"no executor on {worker.name} to fault")
            fault.ended = time.time()
            return self._record(fault)
        if kind == "rm_kill" or kind == "rm_freeze":
            self.rm_fault(fault, kind, hold_s)
        elif kind == "tables_unwritable":
            self.tables_fault(fault, self.rng.uniform(4.0, 8.0))
        elif kind == "host_kill":
            self.host_kill(fault, worker, self.rng.uniform(2.0, 4.0))
        elif kind == "host_freeze":
            self.freeze(fault, lambda: self.cluster.processes_of(worker), f"host {worker.host}", hold_s)
        else:
            victim = on_worker[0]
            role = kind.split("_")[0]
            proc = victim.jvm if role == "executor" else victim.agent
            if proc is None:
                fault.problems.append(f"executor {victim.executor_id} has no agent to fault")
                fault.ended = time.time()
                return self._record(fault)
            what = f"{role} pid {proc.pid} (executor {victim.executor_id} on {worker.host})"
            if kind.endswith("_kill"):
                fault.target = what
                self._record(fault)
                log(f"FAULT {kind} {what}")
                with contextlib.suppress(psutil.Error):
                    proc.kill()
                fault.ended = time.time()
                self.detect(fault)
            else:
                self.freeze(fault, one(proc), what, hold_s)
        self.check_recovery(fault)
        return fault

    def _record(self, fault: Fault) -> Fault:
        with self._lock:
            if fault not in self.faults:
                self.faults.append(fault)
        return fault

    def detect(self, fault: Fault) -> None:
        """A loss event of the fault's executors within ``DETECT_S`` of its start."""
        found = None
        if wait_until(
            lambda: first_event(self.tables, LOSS, fault.executors, fault.started - 0.5),
            DETECT_S,
            interval_s=0.25,
        ):
            found = first_event(self.tables, LOSS, fault.executors, fault.started - 0.5)
        if found is None:
            fault.problems.append(
                f"no loss event of executors {sorted(fault.executors)} within {DETECT_S:g}s"
            )
            return
        fault.detected_after_s = found["ts"].timestamp() - fault.started
        fault.detected = fault.detected_after_s <= DETECT_S
        if not fault.detected:
            fault.problems.append(f"detected after {fault.detected_after_s:.1f}s > {DETECT_S:g}s")
        log(
            f"  detected: {found['event']} of executor {found['executor_id']} "
            f"after {fault.detected_after_s:.2f}s"
        )

    def freeze(
        self, fault: Fault, procs: Callable[[], list[psutil.Process]], what: str, hold_s: float
    ) -> None:
        fault.target = what
        self._record(fault)
        log(f"FAULT {fault.kind} {what}")
        stopped_procs: list[psutil.Process] = []
        try:
            for _ in range(10):  # a process may fork while the others are being stopped
                fresh = [p for p in procs() if p.pid not in {s.pid for s in stopped_procs}]
                if not fresh:
                    break
                self.frozen.stop(fresh)
                stopped_procs.extend(fresh)
            self.detect(fault)
            self._stop.wait(hold_s)
        finally:
            self.frozen.thaw(stopped_procs)
            fault.ended = time.time()

    def host_kill(self, fault: Fault, worker: Worker, down_s: float) -> None:
        fault.target = f"host {worker.host} (Worker pid {worker.pid})"
        self.killed_host_entries.update(worker.private_dir.iterdir())
        self._record(fault)
        log(f"FAULT host_kill {fault.target}")
        self.cluster.kill(worker)
        self.killed_host_entries.update(worker.private_dir.iterdir())
        try:
            self.detect(fault)
            self._stop.wait(down_s)
        finally:
            self.cluster.start_worker(worker)
            fault.ended = time.time()
        self.cluster.wait_alive([worker])

    def rm_fault(self, fault: Fault, kind: str, hold_s: float) -> None:
        rm = rm_process()
        if rm is None:
            fault.problems.append("no RM process to fault")
            fault.ended = time.time()
            self._record(fault)
            return
        fault.target = f"RM pid {rm.pid} ({self.address})"
        self._record(fault)
        gaps_before = gap_rows(self.tables)
        log(f"FAULT {kind} {fault.target}")
        if kind == "rm_kill":
            with contextlib.suppress(psutil.Error):
                rm.kill()
            fault.ended = time.time()
        else:
            self.frozen.stop([rm])
            try:  # longer than the heartbeat timeout: the agents see it gone, and the RM wakes late
                self._stop.wait(self.rng.uniform(3 * TIMEOUT_S, 6 * TIMEOUT_S) + hold_s)
            finally:
                self.frozen.thaw([rm])
                fault.ended = time.time()
        answers = wait_until(lambda: rm_states(self.address) is not None, RM_BOUND_S, interval_s=0.25)
        if not answers:
            fault.problems.append(f"the RM did not answer within {RM_BOUND_S:g}s")
            return
        self.check_recovery(fault)  # before the gap's wait, which may take the whole bound
        now = rm_process()
        # A gap row's ts is where the history stopped being complete (before the fault): a new row.
        gap = wait_until(
            lambda: gap_rows(self.tables) - gaps_before,
            max(1.0, fault.started + RM_BOUND_S - time.time()),
            interval_s=0.5,
        )
        if not gap:
            fault.problems.append(
                f"no MONITORING_GAP event within {RM_BOUND_S:g}s (RM pid now "
                f"{now.pid if now else None}, was {rm.pid})"
            )
            return
        fault.detected_after_s = time.time() - fault.started
        fault.detected = True
        new_gaps = sorted(gap_rows(self.tables) - gaps_before)
        log(f"  detected: RM answers (pid {now.pid if now else None}), gap recorded: {new_gaps[:2]}")

    def tables_fault(self, fault: Fault, hold_s: float) -> None:
        fault.target = f"tables {self.tables}"
        self._record(fault)
        running_before = self.running_now()
        log(f"FAULT tables_unwritable {self.tables} for {hold_s:.1f}s")
        with unwritable(self.tables):
            self._stop.wait(hold_s)
            fault.ended = time.time()
        want = running_before & self.running_now()
        start, stop = fault.started + 1.0, fault.ended - 1.0

        def landed() -> bool:
            try:
                beats = rows(self.tables, "heartbeats")
            except Exception:
                return False
            seen = {b["executor_id"] for b in beats if start <= b["ts"].timestamp() <= stop}
            return want <= seen

        if wait_until(landed, TABLES_BOUND_S, interval_s=0.5):
            fault.detected_after_s = time.time() - fault.started
            fault.detected = True
            log(f"  detected: the window's heartbeats of {sorted(want)} landed once writable")
        else:
            fault.problems.append(f"heartbeats of {sorted(want)} in the unwritable window not in the tables")

    def running_now(self) -> set[str]:
        states = rm_states(self.address) or {}
        return {e for e, s in states.items() if s == "RUNNING" and e != "driver"}

    def check_recovery(self, fault: Fault) -> None:
        """Every executor Spark runs with a live JVM is RUNNING (or UNMONITORED) again in time."""
        if fault.recovery_checked:
            return
        fault.recovery_checked = True
        if fault.ended is None:
            fault.ended = time.time()
        bound = RM_BOUND_S if fault.kind in RM_KINDS else RECOVER_S
        if fault.kind in ("executor_kill", "host_kill"):
            bound = max(bound, REGISTER_GRACE_S)  # a new executor replaces the lost one

        def recovered() -> bool:
            spark_ids = spark_executor_ids(self.spark) or set()
            procs = executors(self.cluster)
            states = rm_states(self.address)
            if states is None:
                return False
            live = {e for e in spark_ids if e in procs and alive(procs[e].jvm)}
            return bool(live) and all(states.get(e) in ("RUNNING", "UNMONITORED") for e in live)

        if wait_until(recovered, max(1.0, fault.ended + bound - time.time()), interval_s=0.25):
            fault.recovered_after_s = time.time() - fault.ended
            now = rm_states(self.address) or {}
            fault.states_after = {e: now.get(e, "absent") for e in sorted(fault.executors)}
        else:
            states = rm_states(self.address)
            fault.problems.append(f"not RUNNING again within {bound:g}s: RM view {states}")

    # -- after the run -----------------------------------------------------------------------------
    def false_timeouts(self, since: float) -> list[dict[str, Any]]:
        with self._lock:
            faults = list(self.faults)
        found = []
        for r in events(self.tables):
            ts = r["ts"].timestamp()
            if r["event"] not in TIMEOUTS or ts < since:
                continue
            touched = [
                f for f in faults if r["executor_id"] in f.executors and f.covers(r["executor_id"], ts)
            ]
            if not touched:
                found.append(r)
        return found

    def unmonitored_without_reason(self) -> list[str]:
        reasons = {
            r["executor_id"] for r in events(self.tables) if r["event"] == "UNMONITORED" and r["detail"]
        }
        return [e for e in self.unmonitored_s if e not in reasons]


# -- output ----------------------------------------------------------------------------------------
def check_sink(sink: Path, checkpoint: Path, committed: list[int]) -> dict[str, int]:
    """Lost, extra and inexact rows of the committed batches in the Delta sink."""
    from deltalake import DeltaTable

    got: dict[int, dict[int, list[tuple[int, int]]]] = {}
    if (sink / "_delta_log").is_dir():
        for r in DeltaTable(str(sink)).to_pyarrow_table().to_pylist():
            got.setdefault(int(r["batch_id"]), {}).setdefault(int(r["k"]), []).append((r["n"], r["sv"]))

    def end_offset(batch: int) -> int:
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        return int(json.loads(lines[2])["offset"])

    lost = extra = inexact = expected_rows = 0
    for batch in committed:
        start = end_offset(batch - 1) if batch > 0 else 0
        want = expected_batch(start, end_offset(batch))
        have = got.get(batch, {})
        expected_rows += sum(n for n, _ in want.values())
        exact = True
        for k, (n, s) in want.items():
            found = have.get(k, [])
            total_n = sum(x for x, _ in found)
            lost += max(0, n - total_n)
            extra += max(0, total_n - n)
            exact &= found == [(n, s)]
        for k, found in have.items():
            if k not in want:
                extra += sum(x for x, _ in found)
                exact = False
        inexact += not exact
    return {
        "lost_rows": lost,
        "extra_rows": extra,
        "inexact_batches": inexact,
        "expected_rows": expected_rows,
    }


def arrowbeat_files(worker: Worker, app_id: str, skip: set[Path]) -> tuple[int, int]:
    """(files of ``app_id`` under arrowbeat's roots on a live host's disk, those on a killed host's).

    The Worker may be removing the application's folders while we count: a folder or file gone
    mid-walk is simply not counted (``os.walk`` skips a folder it cannot list)."""
    live = dead = 0
    for folder, _dirs, files in os.walk(worker.private_dir):
        parts = Path(folder).parts
        if "arrowbeat" not in parts or app_id not in parts:
            continue
        for name in files:
            path = Path(folder, name)
            if not path.is_file():
                continue
            if any(path.is_relative_to(s) for s in skip):
                dead += 1
            else:
                live += 1
    return live, dead


def step(problems: list[str], what: str, action: Callable[[], None]) -> None:
    """Runs one clean-up step; a failure is reported and the next steps still run (a leaked
    cluster would otherwise hide the run's results)."""
    try:
        action()
    except Exception as exc:  # every step must run: reported as a problem, never raised
        problems.append(f"clean-up step {what!r} failed: {type(exc).__name__}: {exc}")


def count_files(cluster: StandaloneCluster, chaos: Chaos, app_id: str, results: dict[str, float]) -> None:
    """``leaked_files`` and ``dead_host_files``: a live Worker removes an ended application's local
    dirs (arrowbeat's roots inside); a killed host's stay."""
    skip = chaos.killed_host_entries
    wait_until(lambda: all(arrowbeat_files(w, app_id, skip)[0] == 0 for w in cluster.workers), 20)
    counts = [arrowbeat_files(w, app_id, skip) for w in cluster.workers]
    results["leaked_files"] = sum(c[0] for c in counts)
    results["dead_host_files"] = sum(c[1] for c in counts)


def warm_up(folder: Path) -> None:
    """Creates the process-wide runtimes that live as long as the process, so that the descriptor
    count before the run includes them: delta-rs's (two eventfds, four epolls, a socket pair, on
    the first read) and gRPC's polling engine (on the first channel)."""
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(folder / "t"), pa.table({"a": [1]}))
    DeltaTable(str(folder / "t")).to_pyarrow_table()
    rm_states(f"127.0.0.1:{free_port()}")  # nothing listens there: the call fails, the engine stays


def started_here() -> list[psutil.Process]:
    """Processes of this run, not counting the ones that started this one (a test run that
    called it shares the run marker)."""
    ancestors = {p.pid for p in psutil.Process().parents()}
    return [p for p in ours() if p.pid not in ancestors]


def open_fds() -> dict[str, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            found[name] = os.readlink(f"/proc/self/fd/{name}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults (after start-up)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--short",
        action="store_true",
        help=f"the form run by make test: {SHORT_FAULTS} faults, every kind once (--duration ignored)",
    )
    parser.add_argument("--fault-log", type=Path, help="also write each fault as a JSON line here")
    args = parser.parse_args()
    began = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so every ``finally`` below runs
    prepare()  # loopback, the venv's Python everywhere, the run marker
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-chaos-"))
    warm_up(scratch / "warm-up")
    fds_before = open_fds()
    root = scratch / "cluster"
    tables, sink, checkpoint = root / "tables", scratch / "sink", scratch / "checkpoint"
    conf = {
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S)}s",
        "spark.arrowbeat.startupTimeout": f"{int(STARTUP_S)}s",
        "spark.arrowbeat.authenticate.secret": SECRET,
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
        "spark.arrowbeat.shuffle.adaptive": "true",
        "spark.sql.shuffle.partitions": "4",
        "spark.shuffle.io.retryWait": "2s",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.task.maxFailures": "8",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.minBatchesToRetain": "1000000",  # check_sink reads every offset and commit
    }
    results: dict[str, float] = {}
    report: list[str] = []
    cluster: StandaloneCluster | None = None
    spark: Any = None
    chaos: Chaos | None = None
    keeper: StreamKeeper | None = None
    app_id = ""
    deferred = 0  # RM faults left out to stay within the RM's restart budget
    unsettled = 0  # times the cluster was not whole again (two executors, RUNNING or UNMONITORED) in time
    try:
        cluster = StandaloneCluster.start(root)
        spark = build_session(cluster.master_url, scratch, "bench-chaos", conf=conf)
        app_id = str(spark.sparkContext.applicationId)
        chaos = Chaos(spark, cluster, tables, args.seed)
        # The query first: its start and first batch's driver side (the sink's table, the plan)
        # overlap the executors' start; no fault comes before both are done.
        keeper = StreamKeeper(spark, sink, checkpoint)
        keeper.start()
        if not wait_until(chaos.whole, 120, interval_s=0.5):
            raise SystemExit(f"the application never had both executors RUNNING: {rm_states(chaos.address)}")
        if not wait_until(lambda: keeper.committed(), 120, interval_s=0.5):
            raise SystemExit(f"the query committed no batch in 120s: {keeper.failures}")
        startup_s = time.monotonic() - began
        duration = float("inf") if args.short else args.duration
        planned = SHORT_FAULTS if args.short else 10_000
        what = f"{planned} faults" if args.short else f"faults for {duration:.0f}s"
        log(f"start-up took {startup_s:.0f}s; {what}, seed {args.seed}")
        chaos.start_monitor()
        chaos_started = time.time()
        deadline = time.monotonic() + duration
        for kind in chaos.plan(planned):
            if time.monotonic() >= deadline:
                break
            allowed = min(STEADY_WAIT_S, deadline - time.monotonic())
            if not wait_until(chaos.whole, allowed, interval_s=0.5) and allowed >= STEADY_WAIT_S:
                unsettled += 1
                log(f"not whole again within {STEADY_WAIT_S:g}s: RM view {rm_states(chaos.address)}")
            if time.monotonic() >= deadline:
                break
            if kind in RM_KINDS and not chaos.rm_fault_allowed():
                deferred += 1
                log(f"{kind} left out: the RM's restart budget {chaos.rm_budget} is nearly spent")
                continue
            fault = chaos.inject(kind)
            line = {
                "t": round(fault.started - chaos_started, 2),
                "kind": fault.kind,
                "target": fault.target,
                "executors": sorted(fault.executors),
                "detected_after_s": fault.detected_after_s,
                "recovered_after_s": fault.recovered_after_s,
                "states_after": fault.states_after,
                "problems": fault.problems,
            }
            log(f"  {json.dumps(line)}")
            if args.fault_log:
                with args.fault_log.open("a") as out:
                    out.write(json.dumps(line) + "\n")
        if not wait_until(chaos.whole, STEADY_WAIT_S, interval_s=0.5):
            unsettled += 1
            log(f"not whole at the end within {STEADY_WAIT_S:g}s: RM view {rm_states(chaos.address)}")
        chaos.stop_monitor()
        keeper.stop()
        committed = keeper.committed()
        sink_check = check_sink(sink, checkpoint, committed)
        false = chaos.false_timeouts(chaos_started)
        no_reason = chaos.unmonitored_without_reason()
        silent = sum(chaos.silent_s.values()) + sum(chaos.unmonitored_s[e] for e in no_reason)
        faults = chaos.faults
        results.update(
            faults_injected=len(faults),
            kinds_injected=len({f.kind for f in faults}),
            faults_detected=sum(1 for f in faults if f.detected),
            faults_recovered=sum(1 for f in faults if f.recovered_after_s is not None),
            false_timeouts=len(false),
            silent_unmonitored_s=round(silent, 1),
            committed_batches=len(committed),
            query_restarts=keeper.restarts,
            monitor_errors=chaos.monitor_errors,
            unsettled=unsettled,
            rm_faults_left_out=deferred,
            **sink_check,
        )
        for f in faults:
            if f.problems:
                report.append(
                    f"{f.kind} at +{f.started - chaos_started:.1f}s ({f.target}): {'; '.join(f.problems)}"
                )
        for r in false:
            report.append(
                f"false timeout: {r['event']} of executor {r['executor_id']} at {r['ts']}: {r['detail']}"
            )
        if no_reason:
            report.append(f"UNMONITORED without a recorded reason: {no_reason}")
        if chaos.silent_s:
            report.append(f"silent seconds per executor: {chaos.silent_s}")
        if chaos.monitor_error:
            report.append(f"the monitor failed: {chaos.monitor_error}")
        if keeper.failures:
            report.append(f"query failures ({len(keeper.failures)}): {keeper.failures[:3]}")
    finally:
        if chaos is not None:
            chaos._stop.set()
            step(report, "thaw", chaos.frozen.thaw_all)
        if keeper is not None:
            step(report, "stop the query", keeper.stop)
        if spark is not None:
            step(report, "stop the session", lambda: stop_session(spark))
        if cluster is not None:
            if app_id and chaos is not None:
                step(report, "count files", lambda: count_files(cluster, chaos, app_id, results))
            step(report, "stop the cluster", cluster.stop)
        gone = wait_until(lambda: not started_here(), 30)
        left = started_here()
        results["leaked_processes"] = len(left)
        if not gone and left:
            report.append(f"processes left: {[cmd(p)[:120] for p in left]}")
            end(left)
        shutil.rmtree(scratch, ignore_errors=True)
        step(report, "clean up", clean_up)  # the run's environment folder (``prepare``)
    results["cleanup_failures"] = sum(1 for p in report if p.startswith("clean-up step"))
    fds_after = open_fds()
    new_fds = {k: v for k, v in fds_after.items() if fds_before.get(k) != v}
    results["leaked_fds"] = len(new_fds)
    if new_fds:
        report.append(f"descriptors open at the end and not at the start: {sorted(new_fds.values())[:20]}")
    for problem in report:
        log(problem)
    for name in (
        "faults_injected",
        "kinds_injected",
        "faults_detected",
        "faults_recovered",
        "false_timeouts",
        "silent_unmonitored_s",
        "lost_rows",
        "extra_rows",
        "inexact_batches",
        "committed_batches",
        "expected_rows",
        "query_restarts",
        "monitor_errors",
        "unsettled",
        "rm_faults_left_out",
        "leaked_processes",
        "leaked_files",
        "dead_host_files",
        "leaked_fds",
        "cleanup_failures",
    ):
        if name in results:
            value = results[name]
            print(f"RESULT {name}={value:g}" if isinstance(value, float) else f"RESULT {name}={value}")
    print(f"RESULT chaos_wall_s={time.monotonic() - began:.0f}")
    ok = (
        results.get("faults_detected") == results.get("faults_injected")
        and results.get("faults_recovered") == results.get("faults_injected")
        and results.get("false_timeouts") == 0
        and results.get("silent_unmonitored_s") == 0
        and results.get("lost_rows") == 0
        and results.get("extra_rows") == 0
        and results.get("inexact_batches") == 0
        and results.get("leaked_processes") == 0
        and results.get("leaked_files") == 0
        and results.get("leaked_fds") == 0
        and results.get("monitor_errors") == 0
        and results.get("unsettled") == 0
        and results.get("cleanup_failures") == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
