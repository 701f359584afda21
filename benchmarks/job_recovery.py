"""What jobs pay for a frozen or a slow executor, with arrowbeat and without (issue 37, item 4).

One job (``harness/apps/timed_job_app.py``: 60 tasks of one second each, made of 20 ms sleeps, on
local-cluster[2,1,1024], executors of 512m, heartbeats every 0.5 s with a 2 s timeout,
``onHeartbeatTimeout=kill``) runs in each application first undisturbed (``calm``: the baseline,
measured in the same application) and then once per cell, disturbed:

- ``frozen``: 2.5 s into the job, the benchmark SIGSTOPs the executor JVM with the lowest id while
  it runs an attempt, and leaves it stopped. ``frozen_delay_s`` is the job's seconds minus the
  calm job's; also when the cut attempts were rerun on the other executor and when the tables
  recorded the timeout. Goal: at most interval + timeout + 3 s (5.5 s).
- ``slowed``, once with ``onDegraded=report`` and once with ``onDegraded=exclude`` (an application
  each): 2 s into the job, that executor is stopped 150 ms of every 300 ms (its JVM and its Python
  workers; not arrowbeat's agent, which only watches), until the job ended and its ``DEGRADED`` was
  recorded (or 30 s passed). ``slow_detected_s``: from the first stop to its ``DEGRADED`` in
  ``executor_events`` (``report`` application). ``slow_delay_s``: the job's delay with
  ``exclude``; ``slow_delay_report_s`` with ``report``; goal: ``slow_delay_s`` at most half of it.
- ``skewed`` (in the ``report`` application, before ``slowed``): partitions of 8, 3 and 1 units on
  healthy executors, one of them running few long tasks, the other many short ones.
  ``false_degraded``: ``DEGRADED`` events recorded while it ran (and up to the next job).
- ``--long`` adds ``frozen`` with arrowbeat off (Spark alone, no plugin): Spark waits for
  ``spark.network.timeout`` (120 s) before it reruns the frozen executor's tasks.

Why a job of about half a minute undisturbed: with ``report`` the slowed executor's share of the
job runs at half speed to its end, a cost that grows with the job; with ``exclude`` the job pays a
fixed cost (half speed until detection, then one executor until its replacement runs), which a
short job does not earn back. ``--tasks`` sets the job's length for every cell.

Every SIGSTOP is followed by a SIGCONT (``finally``, also on SIGTERM and Ctrl-C), and every process
an application started is ended by pid when it is done (found by a marker in its environment).
Until ``spark.arrowbeat.onDegraded`` is declared (issue 37, item 3), the slowed cells run with
arrowbeat's defaults, ``slow_detected_s`` is ``none`` and the ``exclude`` cell is not run.

``RESULT`` lines: ``undisturbed_s`` (the frozen application's calm job), ``frozen_delay_s``,
``frozen_rerun_after_s``, ``frozen_detected_s``, ``frozen_delay_goal_s``, ``slow_detected_s``,
``slow_detected_exclude_s``, ``slow_delay_report_s``, ``slow_delay_s``, ``slow_delay_ratio``
(exclude / report), ``slow_healthy_degraded`` (``DEGRADED`` of an executor that was not slowed, in
the slowed jobs), ``false_degraded``, ``calm_degraded`` (in the calm jobs), with ``--long``
``frozen_delay_spark_alone_s``, then ``load_1m`` before and after and ``total_s``.

    .venv/bin/python -m benchmarks.job_recovery          (about 6 minutes)
    .venv/bin/python -m benchmarks.job_recovery --long   (adds Spark alone: about 4 more)
    .venv/bin/python -m benchmarks.job_recovery --tasks 120 --cells report,exclude --no-skewed
                                                         (a longer job, slowed cells only: about 7)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil

from harness.apps import TIMED_JOB_APP
from harness.task_marks import marks, running_on, seconds_per_unit

ROOT = Path(__file__).resolve().parents[1]
APP = TIMED_JOB_APP
MASTER = "local-cluster[2,1,1024]"
INTERVAL_S, TIMEOUT_S = 0.5, 2.0
FREEZE_AFTER_S = 2.5
"""Into the frozen job: both executors are in a task, a few tasks are done."""
SLOW_AFTER_S = 2.0
"""Into the slowed job: when the duty cycle starts."""
DETECT_WITHIN_S = 30.0
"""How long the duty cycle may run, from its first stop, waiting for ``DEGRADED`` (issue 37's bound)."""
MARKER = "ARROWBEAT_JOB_RECOVERY_APP"
"""In every process an application started (inherited): how the benchmark finds them, and only them."""
DEGRADED_KEY = "spark.arrowbeat.onDegraded"
DEGRADED, RECOVERED = "DEGRADED", "RECOVERED"


def load_1m() -> float:
    return os.getloadavg()[0]


# --- environment and applications ------------------------------------------------------------


def environment(scratch: Path) -> None:
    """Loopback only, this venv's Python for the driver and the executors, the checkout on every
    Python process's path, Spark dirs in ``scratch``, and a Spark home of the run's own:
    ``local-cluster`` Workers put executor dirs in ``$SPARK_HOME/work`` (inside the pyspark package
    otherwise), so it is a folder of links to the package's entries but ``work``."""
    import pyspark

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_WORKER_DIR"] = str(scratch / "work")
    os.environ["SPARK_LOCAL_DIRS"] = str(scratch / "local")
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")
    home = scratch / "spark-home"
    home.mkdir()
    package = Path(pyspark.__file__).resolve().parent
    for entry in package.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    os.environ["SPARK_HOME"] = str(home)


def arrowbeat_flags() -> list[str]:
    """What a user copies: the output of ``python -m spark_plugin conf``."""
    printed = subprocess.run(
        [sys.executable, "-m", "spark_plugin", "conf"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return shlex.split(printed)


def degraded_declared() -> bool:
    """Whether this checkout has ``spark.arrowbeat.onDegraded`` (an undeclared key is refused)."""
    from spark_plugin.settings.config import OPTIONS_BY_KEY

    return DEGRADED_KEY in OPTIONS_BY_KEY


class App:
    """One spark-submit application of ``timed_job_app.py``; its stdout read on a thread."""

    def __init__(
        self, name: str, folder: Path, conf: dict[str, str], flags: list[str], args: list[str]
    ) -> None:
        self.name, self.folder = name, folder
        self.marker = uuid.uuid4().hex
        folder.mkdir(parents=True)
        command = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER, *flags]
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(APP), str(folder), *args]
        self.log_path = folder / "spark-submit.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, MARKER: self.marker},
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name=f"stdout-{name}", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, prefix: str, timeout_s: float) -> dict[str, Any]:
        """The JSON after the next stdout line starting with ``prefix``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"{self.name}: no {prefix!r} within {timeout_s:g} s\n{self.log_tail()}"
                ) from None
            if line is None:
                raise RuntimeError(
                    f"{self.name}: the application exited before {prefix!r}\n{self.log_tail()}"
                )
            if line.startswith(prefix):
                return json.loads(line[len(prefix) :] or "{}")  # type: ignore[no-any-return]

    def go(self, job: str) -> None:
        (self.folder / f"go-{job}").touch()

    def processes(self) -> list[psutil.Process]:
        """Every live process this application started (the marker in its environment)."""
        found = []
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error):
                if proc.pid != os.getpid() and proc.environ().get(MARKER) == self.marker:
                    found.append(proc)
        return found

    def executor_jvms(self) -> dict[str, psutil.Process]:
        """Executor id -> JVM, from ``CoarseGrainedExecutorBackend ... --executor-id N``."""
        found = {}
        for proc in self.processes():
            with contextlib.suppress(psutil.Error, ValueError, IndexError):
                args = proc.cmdline()
                if any("CoarseGrainedExecutorBackend" in a for a in args):
                    found[args[args.index("--executor-id") + 1]] = proc
        return found

    def finish(self, timeout_s: float = 90) -> None:
        """Lets the application stop (its tables flushed) and waits for it."""
        self.go("end")
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)

    def close(self) -> None:
        """Ends the application and everything it started, by pid: SIGCONT first (a stopped process
        ignores SIGTERM), SIGTERM, then SIGKILL what is left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        procs = self.processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.resume()
                proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=5)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)
        self._log.close()

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


# --- stopping executors ----------------------------------------------------------------------

_stopped: dict[int, psutil.Process] = {}
"""Every process this benchmark stopped and has not continued yet: continued on any exit."""
_stopped_lock = threading.Lock()


def stop(proc: psutil.Process) -> None:
    with _stopped_lock:
        _stopped[proc.pid] = proc
    proc.suspend()


def cont(proc: psutil.Process) -> None:
    with contextlib.suppress(psutil.Error):
        proc.resume()
    with _stopped_lock:
        _stopped.pop(proc.pid, None)


def continue_all() -> None:
    """SIGCONT to every process still stopped (same process: ``psutil`` checks its start time)."""
    with _stopped_lock:
        procs = list(_stopped.values())
        _stopped.clear()
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.resume()


def is_agent(proc: psutil.Process) -> bool:
    """arrowbeat's agent of an executor: it watches the executor, it is not the executor."""
    with contextlib.suppress(psutil.Error):
        return any("spark_plugin.processes.executor" in a for a in proc.cmdline())
    return False


def executor_processes(jvm: psutil.Process) -> list[psutil.Process]:
    """The JVM and the processes under it that run its tasks (Python daemon and workers), not the
    agent and what the agent runs."""
    found, todo = [jvm], [jvm]
    while todo:
        with contextlib.suppress(psutil.Error):
            for child in todo.pop().children():
                if not is_agent(child):
                    found.append(child)
                    todo.append(child)
    return found


class DutyCycle:
    """Stops an executor ``stop_s`` of every ``period_s`` (SIGSTOP, SIGCONT) on a thread of its
    own, until :meth:`end` or the JVM is gone; what it stopped is continued whatever happens."""

    def __init__(self, jvm: psutil.Process, stop_s: float, period_s: float) -> None:
        self.jvm, self.stop_s, self.period_s = jvm, stop_s, period_s
        self.first_stop: float | None = None
        """Wall clock (``time.time``) of the first SIGSTOP, comparable with the tables' ``ts``."""
        self.cycles = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="duty-cycle", daemon=True)

    def start(self) -> DutyCycle:
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._done.is_set() and self.jvm.is_running():
            procs = executor_processes(self.jvm)
            if self.first_stop is None:
                self.first_stop = time.time()
            try:
                for proc in procs:
                    with contextlib.suppress(psutil.Error):
                        stop(proc)
                self._done.wait(self.stop_s)
            finally:
                for proc in reversed(procs):
                    cont(proc)
            self.cycles += 1
            next_at += self.period_s
            self._done.wait(max(0.0, next_at - time.monotonic()))

    def end(self) -> None:
        self._done.set()
        self._thread.join(10)
        continue_all()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through every ``finally``: stopped processes continue


# --- what the application and the tables say -------------------------------------------------


def events(tables: Path) -> list[dict[str, Any]]:
    """``executor_events`` rows (ts as epoch seconds), oldest first; none before the table exists."""
    path = tables / "executor_events"
    if not (path / "_delta_log").is_dir():
        return []
    from deltalake import DeltaTable

    try:
        table = DeltaTable(str(path)).to_pyarrow_table(columns=["executor_id", "ts", "event", "detail"])
    except Exception as exc:  # a commit being written: read again later
        print(f"  (executor_events not readable yet: {type(exc).__name__})", flush=True)
        return []
    found = [{**r, "ts": r["ts"].timestamp()} for r in table.to_pylist()]
    return sorted(found, key=lambda r: r["ts"])


def first_event(
    rows: list[dict[str, Any]], executor: str, kinds: set[str], after: float
) -> dict[str, Any] | None:
    for r in rows:
        if r["executor_id"] == executor and r["event"] in kinds and r["ts"] >= after:
            return r
    return None


def count_events(rows: list[dict[str, Any]], kind: str, since: float, until: float) -> list[dict[str, Any]]:
    return [r for r in rows if r["event"] == kind and since <= r["ts"] < until]


def wait_until(condition: Callable[[], object], timeout_s: float, every_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


# --- cells -----------------------------------------------------------------------------------


@dataclass
class Job:
    """One job's run: what the application reported, and the window it owns in the tables."""

    name: str
    seconds: float
    started: float
    ended: float
    complete: bool
    until: float = 0.0
    """When the next job of the application started (or the application was asked to stop)."""


@dataclass
class AppRun:
    """One application's jobs and what it recorded."""

    name: str
    jobs: dict[str, Job] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    load: tuple[float, float] = (0.0, 0.0)

    def delay(self, job: str) -> float | None:
        if job not in self.jobs or "calm" not in self.jobs:
            return None
        return self.jobs[job].seconds - self.jobs["calm"].seconds


@dataclass
class Settings:
    scratch: Path
    tasks: int
    steps: int
    step_s: float
    stop_ms: int
    period_ms: int
    flags: list[str]

    def base_conf(self, folder: Path) -> dict[str, str]:
        return {
            "spark.executor.memory": "512m",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.warehouse.dir": str(folder / "warehouse"),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={folder / 'derby'}",
            "spark.databricks.delta.snapshotPartitions": "2",
        }

    def arrowbeat_conf(self, folder: Path, on_degraded: str | None) -> dict[str, str]:
        conf = {
            **self.base_conf(folder),
            "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
            "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S * 1000)}ms",
            "spark.arrowbeat.tables.path": str(folder / "tables"),
            "spark.arrowbeat.tables.flushInterval": "500ms",
            "spark.arrowbeat.onHeartbeatTimeout": "kill",
        }
        if on_degraded is not None:
            conf[DEGRADED_KEY] = on_degraded
        return conf

    def app_args(self, plan: list[str]) -> list[str]:
        return [
            "--plan",
            ",".join(plan),
            "--tasks",
            str(self.tasks),
            "--steps",
            str(self.steps),
            "--step-s",
            str(self.step_s),
        ]


@contextlib.contextmanager
def application(
    s: Settings, name: str, plan: list[str], arrowbeat: bool, on_degraded: str | None
) -> Iterator[tuple[App, AppRun]]:
    folder = s.scratch / name
    conf = s.arrowbeat_conf(folder, on_degraded) if arrowbeat else s.base_conf(folder)
    run = AppRun(name)
    before = load_1m()
    print(
        f"\n== {name}: arrowbeat {'on' if arrowbeat else 'off'}"
        f"{f', onDegraded={on_degraded}' if on_degraded else ''}; jobs {', '.join(plan)}; load {before:.2f}",
        flush=True,
    )
    app = App(name, folder, conf, s.flags if arrowbeat else [], s.app_args(plan))
    stopped_at = 0.0
    try:
        app.wait_for("APP-READY ", timeout_s=240)
        yield app, run
        app.wait_for("APP-HOLD ", timeout_s=60)
        stopped_at = time.time()
        app.finish()
    finally:
        continue_all()
        app.close()
    run.load = (before, load_1m())
    if arrowbeat:
        run.events = events(folder / "tables")
    jobs = list(run.jobs.values())
    for job, after in zip(jobs, [*jobs[1:], None], strict=True):
        job.until = after.started if after is not None else max(stopped_at, job.ended)
    for job in jobs:
        print(f"  {job.name:8s} {job.seconds:7.2f} s{'' if job.complete else ' (INCOMPLETE)'}", flush=True)


def run_job(
    app: App, run: AppRun, name: str, during: Callable[[float], None] | None = None, timeout_s: float = 600
) -> Job:
    """Starts job ``name``, calls ``during(start)`` once it started, waits for its end."""
    app.wait_for("JOB-WAIT ", timeout_s=60)
    app.go(name)
    started = float(app.wait_for("JOB-START ", timeout_s=60)["t"])
    if during is not None:
        during(started)
    done = app.wait_for("JOB-DONE ", timeout_s=timeout_s)
    job = Job(
        name, float(done["seconds"]), float(done["started"]), float(done["ended"]), bool(done["complete"])
    )
    run.jobs[name] = job
    return job


def victim_of(app: App) -> tuple[str, psutil.Process]:
    """The executor with the lowest id, and its JVM."""
    jvms = app.executor_jvms()
    if not jvms:
        raise RuntimeError(f"{app.name}: no executor JVM found")
    executor = min(jvms, key=lambda e: (not e.isdigit(), int(e) if e.isdigit() else 0, e))
    return executor, jvms[executor]


def frozen_cell(s: Settings, arrowbeat: bool) -> AppRun:
    """Calm, then frozen: one executor JVM SIGSTOPped 2.5 s into the job, left stopped."""
    name = "frozen" if arrowbeat else "frozen-spark-alone"
    with application(s, name, ["calm", "frozen"], arrowbeat, None) as (app, run):
        run_job(app, run, "calm")
        executor, jvm = victim_of(app)
        job_marks = app.folder / "marks" / "frozen"

        def freeze(began: float) -> None:
            wait_until(lambda: time.time() >= began + FREEZE_AFTER_S and running_on(job_marks, jvm.pid), 60)
            run.facts["frozen_at"] = time.time()
            stop(jvm)

        try:
            run_job(app, run, "frozen", during=freeze, timeout_s=600)
        finally:
            cont(jvm)
        run.facts.update(executor=executor, pid=jvm.pid)
    frozen_at = run.facts["frozen_at"]
    starts, ends = marks(job_marks, ".start"), marks(job_marks, ".end")
    ended = {m["tid"]: m["t"] for m in ends}
    cut = [
        m for m in starts if m["pid"] == jvm.pid and m["t"] <= frozen_at < ended.get(m["tid"], float("inf"))
    ]
    reruns = [
        min(
            (m["t"] for m in starts if m["partition"] == c["partition"] and m["pid"] != jvm.pid), default=None
        )
        for c in cut
    ]
    known = [r - frozen_at for r in reruns if r is not None]
    run.facts["rerun_after_s"] = max(known) if known and len(known) == len(cut) else None
    timeout = first_event(run.events, executor, {"HEARTBEAT_TIMEOUT", "UNREACHABLE"}, frozen_at)
    removed = first_event(run.events, executor, {"SPARK_REMOVED", "SPARK_LOST"}, frozen_at)
    run.facts["detected_s"] = None if timeout is None else timeout["ts"] - frozen_at
    run.facts["removed_s"] = None if removed is None else removed["ts"] - frozen_at
    seen = (
        f"timeout recorded after {_fmt(run.facts['detected_s'])} s, "
        f"Spark removed it after {_fmt(run.facts['removed_s'])} s"
        if arrowbeat
        else "no tables (arrowbeat off)"
    )
    print(
        f"  executor {executor} (pid {jvm.pid}) frozen "
        f"{frozen_at - run.jobs['frozen'].started:.2f} s into the job, {len(cut)} attempt(s) cut; "
        f"rerun after {_fmt(run.facts['rerun_after_s'])} s; {seen}",
        flush=True,
    )
    timeline(run.events, frozen_at, run.jobs["frozen"].until, "the freeze")
    return run


def slowed_cell(s: Settings, on_degraded: str | None, with_skewed: bool) -> AppRun:
    """Calm (and skewed), then slowed: one executor on a stop/continue duty cycle from 2 s into
    the job until the job ended and its ``DEGRADED`` was recorded (or 30 s passed)."""
    plan = ["calm", "skewed", "slowed"] if with_skewed else ["calm", "slowed"]
    name = f"slowed-{on_degraded or 'default'}"
    with application(s, name, plan, True, on_degraded) as (app, run):
        run_job(app, run, "calm")
        if with_skewed:
            run_job(app, run, "skewed")
            time.sleep(2.0)  # a DEGRADED the skewed job caused has time to be recorded in its window
        executor, jvm = victim_of(app)
        cycle = DutyCycle(jvm, s.stop_ms / 1000, s.period_ms / 1000)
        tables = app.folder / "tables"

        def degraded() -> bool:
            return cycle.first_stop is not None and bool(
                first_event(events(tables), executor, {DEGRADED}, cycle.first_stop)
            )

        def slow(began: float) -> None:
            wait_until(lambda: time.time() >= began + SLOW_AFTER_S, 30)
            cycle.start()

        try:
            run_job(app, run, "slowed", during=slow, timeout_s=900)
            if on_degraded is not None:  # the detection, if the job ended before it
                wait_until(
                    lambda: (
                        degraded()
                        or time.time() >= (cycle.first_stop or 0) + DETECT_WITHIN_S
                        or not jvm.is_running()
                    ),
                    DETECT_WITHIN_S + 5,
                    every_s=1.0,
                )
        finally:
            cycle.end()
        run.facts.update(executor=executor, pid=jvm.pid, first_stop=cycle.first_stop, cycles=cycle.cycles)
    first_stop = run.facts["first_stop"]
    found = first_event(run.events, executor, {DEGRADED}, first_stop) if first_stop is not None else None
    run.facts["detected_s"] = None if found is None else found["ts"] - first_stop
    slowed = run.jobs["slowed"]
    run.facts["healthy_degraded"] = [
        r
        for r in count_events(run.events, DEGRADED, slowed.started, slowed.until)
        if r["executor_id"] != executor
    ]
    per_unit = seconds_per_unit(app.folder / "marks" / "slowed")
    slow_units = per_unit.get(jvm.pid, [])
    others = ", ".join(
        f"pid {pid}: {len(xs)} (median {_median(xs)} s)"
        for pid, xs in sorted(per_unit.items())
        if pid != jvm.pid
    )
    print(
        f"  executor {executor} (pid {jvm.pid}) on a {s.stop_ms}/{s.period_ms} ms duty cycle "
        f"{_fmt(first_stop - slowed.started if first_stop else None)} s into the job, {cycle.cycles} cycles; "
        f"its attempts {len(slow_units)} (median {_median(slow_units)} s per unit), the others' {others}; "
        f"DEGRADED after {_fmt(run.facts['detected_s'])} s",
        flush=True,
    )
    timeline(run.events, slowed.started, slowed.until, "the slowed job's start")
    return run


def timeline(rows: list[dict[str, Any]], since: float, until: float, what: str) -> None:
    """The executor events recorded in a window, in seconds from its start."""
    for r in rows:
        if since <= r["ts"] < until:
            detail = (r["detail"] or "").replace("\n", " ")
            print(
                f"    {r['ts'] - since:7.2f} s from {what}: {r['event']} executor {r['executor_id']}"
                + (f": {detail[:160]}" if detail else ""),
                flush=True,
            )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _median(values: list[float]) -> str:
    return "-" if not values else f"{statistics.median(values):.2f}"


# --- the run ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--long", action="store_true", help="also the frozen cell with arrowbeat off (Spark alone)"
    )
    parser.add_argument("--tasks", type=int, default=60, help="tasks per job (one per partition)")
    parser.add_argument("--steps", type=int, default=50, help="sleeps per task (per unit of a skewed task)")
    parser.add_argument("--step-s", type=float, default=0.02, help="seconds per sleep")
    parser.add_argument("--stop-ms", type=int, default=150, help="duty cycle: stopped this long ...")
    parser.add_argument("--period-ms", type=int, default=300, help="... of every this long")
    parser.add_argument(
        "--cells", default="frozen,report,exclude", help="which of frozen,report,exclude to run"
    )
    parser.add_argument(
        "--skewed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the skewed healthy job in the report application (false_degraded)",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    began, load_before = time.monotonic(), load_1m()
    scratch = Path(tempfile.mkdtemp(prefix="arrowbeat-job-recovery-"))
    wanted = set(args.cells.split(","))
    declared = degraded_declared()
    print(
        f"{MASTER}, executors 512m; job: {args.tasks} tasks x {args.steps} x {args.step_s:g} s; "
        f"heartbeats {INTERVAL_S:g} s / {TIMEOUT_S:g} s, onHeartbeatTimeout=kill; duty cycle "
        f"{args.stop_ms}/{args.period_ms} ms; {DEGRADED_KEY} "
        f"{'declared' if declared else 'NOT declared (item 3 not in)'}; "
        f"load average {load_before:.2f} (2 cores)",
        flush=True,
    )
    runs: dict[str, AppRun] = {}
    try:
        environment(scratch)
        s = Settings(
            scratch, args.tasks, args.steps, args.step_s, args.stop_ms, args.period_ms, arrowbeat_flags()
        )
        if "frozen" in wanted:
            runs["frozen"] = frozen_cell(s, arrowbeat=True)
        if "report" in wanted:
            runs["report"] = slowed_cell(s, "report" if declared else None, with_skewed=args.skewed)
        if "exclude" in wanted and declared:
            runs["exclude"] = slowed_cell(s, "exclude", with_skewed=False)
        if args.long:
            runs["alone"] = frozen_cell(s, arrowbeat=False)
    finally:
        continue_all()
        shutil.rmtree(scratch, ignore_errors=True)
    report(runs, declared, (load_before, load_1m()), time.monotonic() - began)
    return 0


def report(runs: dict[str, AppRun], declared: bool, load: tuple[float, float], total_s: float) -> None:
    print(
        "\nper application: calm job, disturbed job (its delay), load before -> after (skewed is another job)"
    )
    for key, run in runs.items():
        parts = ", ".join(
            f"{j} {run.jobs[j].seconds:.2f}" + ("" if j == "skewed" else f" (+{_fmt(run.delay(j))})")
            for j in run.jobs
            if j != "calm"
        )
        calm = run.jobs.get("calm")
        print(
            f"  {key:8s} calm {calm.seconds if calm else float('nan'):.2f}; {parts}; "
            f"load {run.load[0]:.2f} -> {run.load[1]:.2f}"
        )
    incomplete = [f"{k}/{j.name}" for k, r in runs.items() for j in r.jobs.values() if not j.complete]
    if incomplete:
        print(f"INCOMPLETE jobs (wrong sum): {', '.join(incomplete)}")
    print()
    frozen, rep, exc, alone = (runs.get(k) for k in ("frozen", "report", "exclude", "alone"))
    if frozen is not None:
        print(f"RESULT undisturbed_s={frozen.jobs['calm'].seconds:.2f}")
        print(f"RESULT frozen_delay_s={_fmt(frozen.delay('frozen'))}")
        print(f"RESULT frozen_rerun_after_s={_fmt(frozen.facts.get('rerun_after_s'))}")
        print(f"RESULT frozen_detected_s={_fmt(frozen.facts.get('detected_s'))}")
        print(f"RESULT frozen_delay_goal_s={INTERVAL_S + TIMEOUT_S + 3:g}")
    if rep is not None:
        print(f"RESULT slow_detected_s={_fmt(rep.facts.get('detected_s')) if declared else 'none'}")
    if exc is not None:
        print(f"RESULT slow_detected_exclude_s={_fmt(exc.facts.get('detected_s'))}")
    report_delay = rep.delay("slowed") if rep is not None else None
    exclude_delay = exc.delay("slowed") if exc is not None else None
    if rep is not None:
        print(f"RESULT slow_delay_report_s={_fmt(report_delay)}")
    if rep is not None or exc is not None:
        print(f"RESULT slow_delay_s={_fmt(exclude_delay)}")
    if report_delay and exclude_delay is not None and report_delay > 0:
        print(f"RESULT slow_delay_ratio={exclude_delay / report_delay:.2f}")
    slowed_runs = [r for r in (rep, exc) if r is not None]
    if declared and slowed_runs:
        print(f"RESULT slow_healthy_degraded={sum(len(r.facts['healthy_degraded']) for r in slowed_runs)}")
    if rep is not None and "skewed" in rep.jobs:
        skewed = rep.jobs["skewed"]
        found = count_events(rep.events, DEGRADED, skewed.started, skewed.until)
        print(f"RESULT false_degraded={len(found) if declared else 'none'}")
    calm_degraded = sum(
        len(count_events(r.events, DEGRADED, r.jobs["calm"].started, r.jobs["calm"].until))
        for r in runs.values()
        if "calm" in r.jobs and r.events
    )
    if declared:
        print(f"RESULT calm_degraded={calm_degraded}")
    if alone is not None:
        print(f"RESULT frozen_delay_spark_alone_s={_fmt(alone.delay('frozen'))}")
        print(f"RESULT frozen_rerun_after_spark_alone_s={_fmt(alone.facts.get('rerun_after_s'))}")
    print(f"RESULT load_1m={load[0]:.2f}->{load[1]:.2f}")
    print(f"RESULT total_s={total_s:.0f}")


if __name__ == "__main__":
    from arrowbeat_base.hard_exit import exit_now

    try:
        code = main()
    except KeyboardInterrupt:
        continue_all()
        code = 130
    sys.stdout.flush()
    exit_now(code)  # no interpreter finalisation: delta-rs's readers can abort it
