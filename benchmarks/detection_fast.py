"""``detection_latency --part fast``: the sub-second detector on real executors, frozen and GC-stormed.

One spark-submit application per mode (``MODES``) on local-cluster[2,1,1536]: executor JVMs with
1.5 GB heaps and the serial collector, arrowbeat's RM, agents and JVM pulses as in production.
See ``benchmarks/detection_latency.py``'s doc for what is measured; this module runs it.
"""

from __future__ import annotations

import math
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from harness.apps import gc_pause_jar
from harness.history_read import rows
from harness.procs import executor_jvms, ours, wait_until
from harness.submit import SubmittedApp
from heartbeat import ExecutorInfo
from heartbeat.rm.admin import list_executors

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "benchmarks" / "detection_app.py"
LOSSES = frozenset({"HEARTBEAT_TIMEOUT", "UNREACHABLE"})

MODES: dict[str, dict[str, str]] = {
    "phi": {  # the timeout stays at its 5 s default: the longest silence, and a GC pause's bound
        "spark.arrowbeat.heartbeat.detector": "phi",
        "spark.arrowbeat.heartbeat.interval": "100ms",
    },
    "standard": {},  # the timeout detector at its defaults: 1 s / 5 s
    "short-timeout": {
        "spark.arrowbeat.heartbeat.detector": "timeout",
        "spark.arrowbeat.heartbeat.interval": "100ms",
        "spark.arrowbeat.heartbeat.timeout": "500ms",
    },
}
FREEZE_LIMIT_S = {"phi": 5.0, "standard": 15.0, "short-timeout": 5.0}
"""How long a freeze lasts at most: a detection later than this counts as missed."""


@dataclass
class Trial:
    executor_id: str
    frozen_at: float
    thawed_at: float
    detect_s: float = math.inf


@dataclass
class ModeRun:
    mode: str
    trials: list[Trial] = field(default_factory=list)
    false_timeouts: int = 0
    false_in_storm: int = 0
    pauses_ms: list[int] = field(default_factory=list)
    idle_cpu: dict[str, float] = field(default_factory=dict)
    loads: list[float] = field(default_factory=list)
    false_details: list[str] = field(default_factory=list)

    @property
    def detections(self) -> list[float]:
        return sorted(t.detect_s for t in self.trials)

    def percentile(self, q: float) -> float:
        values = self.detections
        if not values:
            return math.nan
        return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


def _view(rm: str, secret: str) -> dict[str, ExecutorInfo]:
    try:
        return {e.executor_id: e for e in list_executors(rm, secret, timeout_s=2.0)}
    except Exception:  # a busy RM: the next poll asks again
        return {}


def _wait_view(
    rm: str, secret: str, executor_id: str, ok: Any, timeout_s: float, poll_s: float = 0.1
) -> ExecutorInfo | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _view(rm, secret).get(executor_id)
        if info is not None and ok(info):
            return info
        time.sleep(poll_s)
    return None


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def idle_cpu(marker: str, seconds: float) -> dict[str, float]:
    """Percent of one core the RM's process and the agents used over ``seconds`` of idling."""
    groups = {
        "rm": ours("spark_plugin.processes.driver", marker),
        "agents": ours("spark_plugin.processes.executor", marker),
    }
    return _cpu_pct(groups, seconds)


def _cpu_pct(groups: dict[str, list[psutil.Process]], seconds: float) -> dict[str, float]:
    before = {name: _cpu_s(procs) for name, procs in groups.items()}
    time.sleep(seconds)
    return {name: 100.0 * (_cpu_s(procs) - before[name]) / seconds for name, procs in groups.items()}


def start_hogs(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` CPU-bound processes (each spins one core), nice 0 like everything else here."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        hog.kill()
        hog.wait(10)


def run_mode(
    mode: str, scratch: Path, trials: int, storm_s: float, hogs: int, gc_objects: int, seed: int
) -> ModeRun:
    run = ModeRun(mode)
    base = scratch / mode
    base.mkdir(parents=True, exist_ok=True)
    tables = base / "tables"
    secret = secrets.token_hex(16)
    jar = gc_pause_jar(scratch)
    conf = {
        "spark.arrowbeat.authenticate.secret": secret,
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
        "spark.arrowbeat.heartbeat.registrationBackoff.max": "500ms",
        "spark.driver.extraClassPath": str(jar),
        "spark.executor.extraClassPath": str(jar),
        "spark.executor.extraJavaOptions": "-XX:+UseSerialGC -Xmn900m",
        "spark.executor.memory": "1536m",
        **MODES[mode],
    }
    commands = base / "commands"
    commands.mkdir()
    args = [str(commands), "--gc-objects", str(gc_objects)]
    app = SubmittedApp(APP, "local-cluster[2,1,1536]", base, conf=conf, args=args)
    rng = random.Random(seed)
    try:
        rm = app.wait_for("APP-READY ", 300)["rm_address"]
        jvms = executor_jvms(app.marker)
        ids = sorted(jvms)
        for executor_id in ids:
            if _wait_view(rm, secret, executor_id, lambda e: e.state == "RUNNING", 60) is None:
                raise SystemExit(f"{mode}: executor {executor_id} never registered")
        run.loads.append(os.getloadavg()[0])
        run.idle_cpu = idle_cpu(app.marker, 20.0)
        limit = FREEZE_LIMIT_S[mode]
        for number in range(trials):
            victim = ids[number % len(ids)]
            info = _wait_view(rm, secret, victim, lambda e: e.state == "RUNNING", 60)
            if info is None:
                raise SystemExit(f"{mode}: executor {victim} did not register again")
            time.sleep(1.0 + rng.uniform(0.0, 1.0))  # a history to judge by, and a random phase
            frozen_at = time.time()
            os.kill(jvms[victim].pid, signal.SIGSTOP)
            try:
                _wait_view(
                    rm,
                    secret,
                    victim,
                    lambda e, i=info.instance_id: e.state != "RUNNING" or e.instance_id != i,
                    limit,
                )
            finally:
                os.kill(jvms[victim].pid, signal.SIGCONT)
            run.trials.append(Trial(victim, frozen_at, time.time()))
            print(f"{mode}: trial {number + 1}/{trials} executor {victim} thawed", flush=True)
        for executor_id in ids:
            _wait_view(rm, secret, executor_id, lambda e: e.state == "RUNNING", 60)
        run.loads.append(os.getloadavg()[0])
        storm_from = time.time()
        hog_procs = start_hogs(hogs)
        try:
            (commands / "storm.tmp").write_text(str(storm_s))
            (commands / "storm.tmp").rename(commands / "storm")
            run.pauses_ms = app.wait_for("APP-STORM ", storm_s + 600)["pauses_ms"]
            run.loads.append(os.getloadavg()[0])
        finally:
            stop_hogs(hog_procs)
        storm_to = time.time() + 2.0  # a timeout may be recorded a moment after the storm
        time.sleep(3.0)  # the tables' flush (500 ms) and a loss just after the storm
        wait_until(lambda: _flushed(tables, run.trials), 30)
        _score(run, rows(tables, "executor_events"), storm_from, storm_to)
        (commands / "end").touch()
        app.wait(120)
    finally:
        app.close()
    return run


def _flushed(tables: Path, trials: list[Trial]) -> bool:
    """Whether the events table holds a REREGISTERED after the last thaw (every earlier row too)."""
    if not trials:
        return True
    last = trials[-1].thawed_at
    return any(
        r["event"] == "REREGISTERED" and r["ts"].timestamp() >= last for r in rows(tables, "executor_events")
    )


def _score(run: ModeRun, events: list[dict[str, Any]], storm_from: float, storm_to: float) -> None:
    """Each trial's detection; every loss outside a trial's freeze (+1 s) of its executor is false."""
    explained: set[int] = set()
    for trial in run.trials:
        for index, row in enumerate(events):
            ts = row["ts"].timestamp()
            ours_then = trial.frozen_at <= ts <= trial.thawed_at + 1.0
            if row["executor_id"] == trial.executor_id and row["event"] in LOSSES and ours_then:
                explained.add(index)
                trial.detect_s = min(trial.detect_s, ts - trial.frozen_at)
    for index, row in enumerate(events):
        if row["event"] in LOSSES and index not in explained:
            run.false_timeouts += 1
            run.false_in_storm += storm_from <= row["ts"].timestamp() <= storm_to
            run.false_details.append(f"{row['executor_id']} {row['event']} {row['detail']}")


def report(runs: list[ModeRun], hogs: int) -> None:
    for run in runs:
        pauses = sorted(run.pauses_ms)
        longest = pauses[-1] if pauses else 0
        median = pauses[len(pauses) // 2] if pauses else 0
        missed = sum(1 for t in run.trials if math.isinf(t.detect_s))
        print(
            f"{run.mode}: {len(run.trials)} freezes, detection p50 {run.percentile(0.5):.3f} s, "
            f"p99 {run.percentile(0.99):.3f} s, max {run.percentile(1.0):.3f} s, missed {missed}; "
            f"false timeouts {run.false_timeouts} ({run.false_in_storm} in the storm); "
            f"storm: {len(pauses)} full GCs, median {median} ms, "
            f"longest {longest} ms, {hogs} CPU hogs on {os.cpu_count()} cores; idle CPU: RM "
            f"{run.idle_cpu.get('rm', math.nan):.1f}%, agents {run.idle_cpu.get('agents', math.nan):.1f}% "
            f"of a core; load {', '.join(f'{x:.1f}' for x in run.loads)}",
            flush=True,
        )
        for detail in run.false_details[:5]:
            print(f"  false: {detail}", flush=True)
    by_mode = {run.mode: run for run in runs}
    for name, run in by_mode.items():
        prefix = "" if name == "phi" else f"{name.replace('-', '_')}_"
        print(f"RESULT {prefix}detect_p99_s={run.percentile(0.99):.3f}")
        print(f"RESULT {prefix}detect_p50_s={run.percentile(0.5):.3f}")
        print(f"RESULT {prefix}false_timeouts={run.false_timeouts}")
        print(f"RESULT {prefix}storm_longest_gc_ms={max(run.pauses_ms, default=0)}")
        print(f"RESULT {prefix}idle_cpu_pct_rm={run.idle_cpu.get('rm', math.nan):.1f}")
        print(f"RESULT {prefix}idle_cpu_pct_agents={run.idle_cpu.get('agents', math.nan):.1f}")
    loads = [x for run in runs for x in run.loads]
    if loads:
        print(f"RESULT load_min={min(loads):.1f}")
        print(f"RESULT load_max={max(loads):.1f}")


__all__ = ["MODES", "ModeRun", "heartbeat_only", "report", "run_mode"]


def heartbeat_only(trials: int, load_s: float, hogs: int, seed: int = 37) -> ModeRun:
    """The same detector without Spark (``--part fast-heartbeat``): an RM process and three agent
    processes over gRPC on loopback, phi at 100 ms. Each trial SIGSTOPs one agent (the whole
    executor side frozen, agent and JVM alike) at a random phase and takes the RM's loss event;
    then ``load_s`` seconds with ``hogs`` CPU-bound processes while every agent answers, counting
    losses. No JVM and so no GC here: the Spark part has the storm."""
    from harness.heartbeat_processes import LOST, AgentProcess, RmProcess
    from heartbeat import EventKind, HeartbeatServices
    from heartbeat.phi_accrual import PhiSettings

    services = HeartbeatServices(0.1, 2.0, 2, phi=PhiSettings.for_interval(0.1))
    secret = secrets.token_hex(16)
    run = ModeRun("phi-heartbeat")
    rng = random.Random(seed)
    started: list[AgentProcess | RmProcess] = []
    try:
        rm = RmProcess(services, secret)
        started.append(rm)
        rm.wait_ready(60)

        def lost(name: str) -> int:
            return sum(len(rm.events.find(kind, name)) for kind in LOST)

        names = ["a", "b", "c"]
        agents = {name: AgentProcess(rm.address, name, services, secret) for name in names}
        started.extend(agents.values())
        for agent in agents.values():
            agent.wait_line("READY", 60)
        run.loads.append(os.getloadavg()[0])
        run.idle_cpu = _cpu_pct(
            {
                "rm": [psutil.Process(rm.proc.pid)],
                "agents": [psutil.Process(a.proc.pid) for a in agents.values()],
            },
            10.0,
        )
        for number in range(trials):
            name = names[number % len(names)]
            again = len(rm.events.find(EventKind.REREGISTERED, name)) + 1
            before = lost(name)
            time.sleep(1.0 + rng.uniform(0.0, 1.0))  # a history to judge by, and a random phase
            frozen_at = agents[name].signal(signal.SIGSTOP)
            try:
                rm.events.wait_for(partial(_more_than, lost, name, before), 5.0)
            finally:
                agents[name].signal(signal.SIGCONT)
            run.trials.append(Trial(name, frozen_at, time.time()))
            rm.events.wait_event(EventKind.REREGISTERED, name, 30, count=again)
        run.loads.append(os.getloadavg()[0])
        load_from = time.time()
        hog_procs = start_hogs(hogs)
        try:
            time.sleep(load_s)
            run.loads.append(os.getloadavg()[0])
        finally:
            stop_hogs(hog_procs)
        time.sleep(1.0)  # a loss at the very end of the load is recorded
        events = [
            {"executor_id": e.executor_id, "event": e.kind.value, "ts": _Ts(e.ts), "detail": e.detail}
            for e in rm.events.events
        ]
        _score(run, events, load_from, time.time())
    finally:
        for child in started:
            child.reap()
    return run


def _more_than(count: Callable[[str], int], name: str, before: int) -> bool:
    return count(name) > before


class _Ts:
    """A wall-clock reading shaped like a table row's ``ts`` (``.timestamp()``)."""

    def __init__(self, ts: float) -> None:
        self._ts = ts

    def timestamp(self) -> float:
        return self._ts
