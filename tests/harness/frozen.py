"""The frozen-executor scenarios: one spark-submit application each per test session, shared by
every module that checks what arrowbeat reports about an executor gone silent (history tables, the
CLI and report, the live page, Spark's Prometheus servlet, the launcher).

Each check needs a real application whose executor JVM is frozen (SIGSTOP) while it runs, and
starting one per module cost a minute or more each. So one application runs
(``apps/hold_app.py`` on local-cluster[2,1,1024], heartbeats every 0.5 s, timeout 2 s, history
tables flushed every 0.5 s) and each module hands it a :class:`Probe`: a generator that the run
resumes at the phases the module's checks need. All probes due at a phase run at once, one thread
each, so a check of how soon a freeze shows starts at the freeze, as with its own application.
A probe's slow set-up that needs no application (an in-process session) runs in ``start`` while
the application starts, and ``stop`` ends it whatever happened. A module lists its probes in
``FROZEN_PROBES``; the fixtures (``tests/spark/conftest.py``) run the probes of the selected tests.

- :func:`thaw_run` (fixture ``frozen_run``), ``onHeartbeatTimeout`` left at ``observe``:
  ``READY``: both executors registered and heartbeating; ``FROZEN``: executor ``frozen`` (the
  lowest id) just SIGSTOPped, while the run waits for the tables to record its timeout;
  ``THAWED``: just SIGCONTed, while the run waits for its REREGISTERED; ``KILLED`` (only if a
  probe ``kills``): executor ``killed`` just SIGKILLed, while the run waits for its loss and a
  replacement; ``ENDED``: the go file written, the application exited.
- :func:`kill_run` (fixture ``frozen_kill_run``), ``onHeartbeatTimeout=kill``: ``READY``;
  ``REMOVED``: executor ``frozen`` SIGSTOPped and Spark has removed it (arrowbeat had it killed);
  ``ENDED``.

SIGCONT always follows SIGSTOP (``finally``), and every process of the application is ended by pid
before the run returns (``SubmittedApp.close``). A probe asserts as a test does; the run keeps its
first exception, stops driving it, and the module's test re-raises it (:meth:`Probe.verdict`), so
one module's failure leaves the other modules' checks standing.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import psutil

from harness.apps import HOLD_APP
from harness.history_read import events, rows
from harness.procs import executor_jvms, wait_until
from harness.submit import SubmittedApp

INTERVAL_S, TIMEOUT_S = 0.5, 2.0
GENEROUS_S = 20.0
"""A bound on a detection no loaded machine should reach, still a sixth of Spark's own 120 s."""
LOSS_EVENTS = frozenset({"HEARTBEAT_TIMEOUT", "UNREACHABLE", "UNREGISTERED"})
STEP_LIMIT_S = 600.0
"""How long one probe's step may run before the run gives up on it (its own waits are shorter)."""


class Phase(enum.Enum):
    """Where a scenario stands; a probe yields the phase it wants to be resumed at."""

    READY = "ready"
    FROZEN = "frozen"
    THAWED = "thawed"
    KILLED = "killed"
    REMOVED = "removed"
    ENDED = "ended"


THAW_PHASES = (Phase.READY, Phase.FROZEN, Phase.THAWED, Phase.KILLED, Phase.ENDED)
KILL_PHASES = (Phase.READY, Phase.REMOVED, Phase.ENDED)


def fast_heartbeats(tables: Path) -> dict[str, str]:
    """Interval, timeout and a short flush interval for the tests' applications."""
    return {
        "spark.arrowbeat.heartbeat.interval": f"{int(INTERVAL_S * 1000)}ms",
        "spark.arrowbeat.heartbeat.timeout": f"{int(TIMEOUT_S)}s",
        "spark.arrowbeat.tables.path": str(tables),
        "spark.arrowbeat.tables.flushInterval": "500ms",
    }


def registered(tables: Path) -> set[str]:
    """Executors with a REGISTERED event in the tables."""
    return {e for e, k in events(tables) if k == "REGISTERED"}


def event_ts(tables: Path, executor_id: str, kinds: Iterable[str], after: float) -> float | None:
    """When the executor's first event of ``kinds`` at or after ``after`` was recorded."""
    kinds = set(kinds)
    for r in rows(tables, "executor_events"):
        if r["executor_id"] == executor_id and r["event"] in kinds and r["ts"].timestamp() >= after:
            return float(r["ts"].timestamp())
    return None


def first_loss(tables: Path, executor_id: str, after: float) -> dict[str, Any] | None:
    """The executor's first loss event at or after ``after`` (a row of ``executor_events``)."""
    for r in rows(tables, "executor_events"):
        if r["executor_id"] == executor_id and r["event"] in LOSS_EVENTS and r["ts"].timestamp() >= after:
            return r
    return None


@dataclass
class FrozenRun:
    """What the scenario did and when: probes read it while it runs, tests after it ended."""

    app: SubmittedApp
    folder: Path
    tables: Path
    go: Path
    ready: dict[str, Any] = field(default_factory=dict)
    """``APP-READY``: rm_address, ui_url, sum, executors."""
    jvms: dict[str, psutil.Process] = field(default_factory=dict)
    """Executor id -> JVM at READY."""
    executors_at_start: set[str] = field(default_factory=set)
    frozen: str = ""
    killed: str = ""
    stop_time: float = 0.0
    """Wall clock (``time.time``) just before the SIGSTOP, comparable with the tables' ``ts``."""
    stopped_at: float = 0.0
    """``time.monotonic`` just before the SIGSTOP."""
    kill_time: float = 0.0
    removed: dict[str, Any] = field(default_factory=dict)
    """``SPARK-EXECUTOR-REMOVED`` of the frozen executor (kill scenario)."""
    result: dict[str, Any] = field(default_factory=dict)
    """``APP-RESULT``."""
    exit_code: int | None = None
    later_stdout: list[str] = field(default_factory=list)
    """The application's stdout lines the run did not wait for (kill scenario), once it exited."""
    timeline: dict[str, float] = field(default_factory=dict)
    """Seconds from spark-submit to the start and end of each phase, and each probe's seconds in
    its ``start`` and in each of its steps (``"<phase> <Probe>"``): where a slow run spent it."""
    started_at: float = field(default_factory=time.monotonic)

    @property
    def app_id(self) -> str:
        """Spark's application id, as the history tables record it."""
        return str(rows(self.tables, "executor_events")[0]["app_id"])


class Probe:
    """One module's checks on a shared run. Subclasses set ``scenario`` (``"thaw"`` or ``"kill"``),
    may add Spark settings, environment and app arguments, and write :meth:`watch`."""

    scenario: ClassVar[str] = "thaw"
    kills: ClassVar[bool] = False
    """Whether the thaw scenario must SIGKILL the other executor for this probe (KILLED)."""

    def __init__(self) -> None:
        self.folder = Path()
        """A folder of the probe's own in the run's (set before :meth:`conf` is asked)."""
        self.failure: BaseException | None = None
        self.failed_at: Phase | None = None
        self.finished = False

    def conf(self) -> dict[str, str]:
        """Spark settings the application needs for this probe."""
        return {}

    def env(self) -> dict[str, str]:
        """Environment spark-submit needs for this probe."""
        return {}

    def args(self) -> list[str]:
        """``hold_app.py`` options this probe needs (``--shuffle``)."""
        return []

    def start(self) -> None:
        """Runs on a thread of its own while the application starts: set-up that needs no
        application (an in-process Spark session), so the application does not wait for it."""

    def stop(self) -> None:
        """Runs once the application has ended, whatever happened: ends what :meth:`start` began."""

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        """Runs from READY up to its first ``yield``; ``yield Phase.X`` resumes it when X begins."""
        raise NotImplementedError

    def verdict(self) -> None:
        """Raises what the probe raised, or says where it stopped if it never reached its end."""
        if self.failure is not None:
            raise self.failure
        if not self.finished:
            raise AssertionError(f"{type(self).__name__} never ran to its end (did the scenario run?)")

    def __str__(self) -> str:
        return f"{type(self).__module__}.{type(self).__name__}"


class _Driver:
    """Resumes each probe's generator at the phases it asked for, all due probes at once."""

    def __init__(self, run: FrozenRun, probes: list[Probe], phases: tuple[Phase, ...]) -> None:
        self.run, self.phases, self.probes = run, phases, probes
        self.due: dict[int, tuple[Probe, Generator[Phase, None, None] | None, Phase]] = {
            i: (probe, None, Phase.READY) for i, probe in enumerate(probes)
        }
        self.starting = [
            threading.Thread(target=self._start, args=(key,), name="probe-start", daemon=True)
            for key in self.due
        ]
        for thread in self.starting:
            thread.start()

    def _start(self, key: int) -> None:
        probe = self.due[key][0]
        began = time.monotonic()
        try:
            probe.start()
        except BaseException as exc:
            probe.failure, probe.failed_at = exc, Phase.READY
        finally:
            self.run.timeline[f"start {type(probe).__name__}"] = round(time.monotonic() - began, 1)

    def _step(self, key: int, phase: Phase) -> None:
        began = time.monotonic()
        try:
            self._resume(key, phase)
        finally:
            name = type(self.probes[key]).__name__
            self.run.timeline[f"{phase.value} {name}"] = round(time.monotonic() - began, 1)

    def _resume(self, key: int, phase: Phase) -> None:
        probe, gen, _ = self.due[key]
        try:
            if gen is None:
                gen = probe.watch(self.run)
            wanted = next(gen)
            if wanted not in self.phases or self.phases.index(wanted) <= self.phases.index(phase):
                raise AssertionError(f"{probe} asked for {wanted} at {phase}: not a later phase of this run")
            self.due[key] = (probe, gen, wanted)
        except StopIteration:
            probe.finished = True
            del self.due[key]
        except BaseException as exc:
            probe.failure, probe.failed_at = exc, phase
            del self.due[key]

    def phase(self, phase: Phase, alongside: Callable[[], object] | None = None) -> None:
        """Runs every probe due at ``phase`` (and ``alongside``, the run's own step) at once."""
        if phase is Phase.READY:  # the probes' own set-up first
            for thread in self.starting:
                thread.join(STEP_LIMIT_S)
            for key in [k for k, (probe, _, _) in self.due.items() if probe.failure is not None]:
                del self.due[key]
        self.run.timeline[phase.value] = round(time.monotonic() - self.run.started_at, 1)
        keys = [key for key, (_, _, wanted) in self.due.items() if wanted is phase]
        threads = [
            threading.Thread(target=self._step, args=(key, phase), name=f"probe-{phase.value}", daemon=True)
            for key in keys
        ]
        for thread in threads:
            thread.start()
        try:
            if alongside is not None:
                alongside()
        finally:
            deadline = time.monotonic() + STEP_LIMIT_S
            for key, thread in zip(keys, threads, strict=True):
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive() and key in self.due:
                    probe = self.due.pop(key)[0]
                    probe.failure = AssertionError(f"{probe} did not finish {phase} in {STEP_LIMIT_S:g} s")
                    probe.failed_at = phase
            self.run.timeline[f"{phase.value} done"] = round(time.monotonic() - self.run.started_at, 1)

    def close(self) -> None:
        """Closes the generators the run left waiting (their ``finally`` blocks run now), then
        stops every probe."""
        for thread in self.starting:
            thread.join(STEP_LIMIT_S)
        for probe, gen, wanted in list(self.due.values()):
            if probe.failure is None:
                probe.failure = AssertionError(f"{probe} waited for {wanted}, which the run never reached")
                probe.failed_at = wanted
            if gen is not None:
                with contextlib.suppress(Exception):
                    gen.close()
        self.due.clear()
        for probe in self.probes:
            try:
                probe.stop()
            except Exception as exc:
                if probe.failure is None:
                    probe.failure, probe.failed_at = exc, Phase.ENDED


def _merged(parts: Iterable[dict[str, str]], what: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for part in parts:
        for key, value in part.items():
            if merged.setdefault(key, value) != value:
                raise ValueError(f"probes disagree on {what} {key}: {merged[key]!r} vs {value!r}")
    return merged


@contextlib.contextmanager
def _application(
    scratch: Path, name: str, probes: list[Probe], conf: dict[str, str], phases: tuple[Phase, ...]
) -> Iterator[tuple[FrozenRun, _Driver]]:
    """The application with every probe's settings; ends all its processes (SIGCONT first)."""
    folder = scratch / name
    folder.mkdir(parents=True, exist_ok=True)
    tables, go = folder / "tables", folder / "go"
    for probe in probes:
        probe.folder = folder / f"{type(probe).__module__.rpartition('.')[2]}-{type(probe).__name__}"
        probe.folder.mkdir(exist_ok=True)
    app = SubmittedApp(
        HOLD_APP,
        "local-cluster[2,1,1024]",
        scratch,
        conf=_merged([fast_heartbeats(tables), conf, *(p.conf() for p in probes)], "setting"),
        args=[str(go), *dict.fromkeys(a for p in probes for a in p.args())],
        env=_merged((p.env() for p in probes), "variable"),
    )
    run = FrozenRun(app=app, folder=folder, tables=tables, go=go)
    driver = _Driver(run, probes, phases)
    try:
        yield run, driver
    finally:
        for proc in executor_jvms(app.marker).values():
            with contextlib.suppress(psutil.Error):
                proc.resume()
        app.close()
        driver.close()


def thaw_run(scratch: Path, probes: list[Probe]) -> FrozenRun:
    """Freeze executor ``frozen``, thaw it, then (if a probe ``kills``) SIGKILL ``killed``."""
    with _application(scratch, "frozen-thaw", probes, {}, THAW_PHASES) as (run, driver):
        app, tables = run.app, run.tables
        run.ready = app.wait_for("APP-READY ", timeout_s=180)
        wait_until(lambda: len(registered(tables)) >= 2, 30)
        run.executors_at_start = registered(tables)
        wait_until(lambda: len(rows(tables, "heartbeats")) > 4, 30)
        run.jvms = executor_jvms(app.marker)
        run.frozen, run.killed = sorted(run.jvms)[:2]
        driver.phase(Phase.READY)

        run.stop_time, run.stopped_at = time.time(), time.monotonic()
        run.jvms[run.frozen].suspend()
        try:
            # Waits are generous: the tests judge what was recorded, and when.
            timeout = {"HEARTBEAT_TIMEOUT", "UNREACHABLE"}
            driver.phase(
                Phase.FROZEN,
                alongside=lambda: wait_until(
                    lambda: event_ts(tables, run.frozen, timeout, run.stop_time), 3 * GENEROUS_S
                ),
            )
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):
                run.jvms[run.frozen].resume()
        driver.phase(
            Phase.THAWED,
            alongside=lambda: wait_until(
                lambda: event_ts(tables, run.frozen, {"REREGISTERED"}, run.stop_time), 3 * GENEROUS_S
            ),
        )

        if any(p.kills for p in probes):
            run.kill_time = time.time()
            run.jvms[run.killed].send_signal(signal.SIGKILL)

            def lost_and_replaced() -> None:
                wait_until(lambda: event_ts(tables, run.killed, LOSS_EVENTS, run.kill_time), 3 * GENEROUS_S)
                wait_until(lambda: len(registered(tables)) >= 3, 90)

            driver.phase(Phase.KILLED, alongside=lost_and_replaced)

        run.go.touch()
        run.result = app.wait_for("APP-RESULT ", timeout_s=180)
        run.timeline["last job done"] = round(time.monotonic() - run.started_at, 1)
        run.exit_code = app.wait(timeout_s=120)
        driver.phase(Phase.ENDED)
        return run


def kill_run(scratch: Path, probes: list[Probe]) -> FrozenRun:
    """``onHeartbeatTimeout=kill``: freeze executor ``frozen`` until Spark has removed it."""
    conf = {"spark.arrowbeat.onHeartbeatTimeout": "kill"}
    with _application(scratch, "frozen-kill", probes, conf, KILL_PHASES) as (run, driver):
        app, tables = run.app, run.tables
        run.ready = app.wait_for("APP-READY ", timeout_s=180)
        assert wait_until(lambda: len(registered(tables)) >= 2, 30), events(tables)
        run.executors_at_start = registered(tables)
        run.jvms = executor_jvms(app.marker)
        run.frozen = sorted(run.jvms)[0]
        driver.phase(Phase.READY)

        victim = run.jvms[run.frozen]
        run.stop_time, run.stopped_at = time.time(), time.monotonic()
        victim.suspend()
        try:
            run.removed = app.wait_for("SPARK-EXECUTOR-REMOVED ", timeout_s=90)
            driver.phase(Phase.REMOVED)
        finally:
            with contextlib.suppress(psutil.Error):
                if victim.is_running():
                    victim.resume()

        run.go.touch()
        run.result = app.wait_for("APP-RESULT ", timeout_s=180)
        run.timeline["last job done"] = round(time.monotonic() - run.started_at, 1)
        run.exit_code = app.wait(timeout_s=120)
        run.later_stdout = app.stdout_lines()
        driver.phase(Phase.ENDED)
        return run


def probes_of(modules: Iterable[object], scenario: str) -> list[Probe]:
    """The probes of ``scenario`` that ``modules`` declare in ``FROZEN_PROBES``, once each."""
    found: list[Probe] = []
    for module in modules:
        for probe in getattr(module, "FROZEN_PROBES", ()):
            if isinstance(probe, Probe) and probe.scenario == scenario and probe not in found:
                found.append(probe)
    return found
