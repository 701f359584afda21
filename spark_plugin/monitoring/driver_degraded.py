"""Gray failures (issue 37, item 3): the executor that is consistently slower than its peers, named.

An executor can be alive and still hurt every job it serves: a noisy neighbour, a throttled CPU, a
JVM stopped and continued by something. Its heartbeats arrive and nothing times out. Here the
driver side compares what each executor's heartbeats say with what its *peers'* say, signal by
signal, and records ``DEGRADED`` for one that stays clearly slower (with the evidence: which signal,
how far from the peers, since when) and ``RECOVERED`` once it is back in line.

Like with like. An executor that is merely busier (more tasks, a skewed partition) must never be
named, so only figures that do not grow with the amount of work are compared:

- ``pulse_late_ms``: how late the executor JVM's own once-per-pulse lines come, on the JVM's clock,
  minus the JVM's garbage-collection pauses in between (``monitoring.executor_pace``): a thread
  that sleeps and wakes is late only when the process cannot run (stopped, starved, throttled),
  however many tasks it runs. GC is taken out because a busier JVM collects more.
- ``rtt_ms``: the heartbeat's round trip to the agent (a separate process beside the JVM): a
  lossy link, a starved host. The agent also serves the executor's Arrow shuffle, so a busier
  agent answers somewhat later: only a round trip five times the peers' and 100 ms beyond counts.
- ``task_cpu``: CPU seconds per second of each running task's JVM thread, compared only between
  tasks *of the same stage* (same work per row): a larger partition takes longer, not a smaller
  share of the CPU; judged only when the peers' tasks are busy (a waiting task says nothing).
  Evidence only, never a trigger: a skewed partition's task may wait more on its reads and spills.
- ``gc_share``: the share of time the JVM spent in pausing collections. Evidence only, never a
  trigger: a skewed partition's executor rightly collects more.

So what names an executor is a JVM or an agent that cannot run when it should; the evidence
shows what that cost its tasks.

Robust peer comparison. Each executor's figure for a signal is the median of its heartbeats'
samples over the last ``window_s``; the peers' reference is the median of the other executors'
figures (for ``task_cpu``, those with tasks of the same stage). An executor is *off* on a signal
when its figure is beyond all of: ``ratio`` times the reference, the reference plus an absolute
``margin``, and (three or more peers) the reference plus four scaled MADs of the peers. Hysteresis:
off on some signal at every evaluation for ``enter_s`` -> ``DEGRADED``; off on none (and judged on
at least one) for ``leave_s`` -> ``RECOVERED``. No peer, no verdict: a lone executor is never named.

Transport-free: ``on_heartbeat`` takes ``HeartbeatRecord``s and returns ``ExecutorEvent``s, time is
an injected ``Clock``; the driver's ``EventRouter`` records and acts on them. Memory is bounded by
the live executors (``forget``) times the signals' windows and ``MAX_GROUPS`` stages each.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord
from spark_plugin.errors import JvmCommandError
from spark_plugin.history.recovery import still_degraded as still_degraded

log = logging.getLogger("arrowbeat.driver.degraded")

WINDOW_S = 10.0
"""Seconds of samples one executor's figure is the median of (at least ``WINDOW_INTERVALS``
heartbeat intervals)."""
WINDOW_INTERVALS = 8
MIN_SAMPLES = 4
"""Samples of a signal an executor needs in its window before it is judged or counts as a peer."""
ENTER_S = 8.0
"""Seconds an executor must be off at every evaluation before it is recorded ``DEGRADED``."""
LEAVE_S = 15.0
"""Seconds it must be in line at every evaluation before it is recorded ``RECOVERED``."""
EVALUATE_EVERY_S = 0.5
"""Evaluations of every executor at most this often (each heartbeat may trigger one)."""
MAX_GROUPS = 8
"""Stages per executor whose task figures are kept (the newest): a long application runs many."""
EXACT_PEERS = 64
"""Up to this many executors, each one's reference leaves it out exactly; beyond, the median of
all (one rank off at most) keeps an evaluation O(executors) per signal."""
MAD_SCALE = 1.4826
MAD_FACTOR = 4.0


@dataclass(frozen=True, slots=True)
class Signal:
    """A figure compared between peers, and how far off it must be."""

    name: str
    what: str
    """For people: what the figure is, with its unit."""
    higher_is_worse: bool
    ratio: float
    margin: float
    floor: float = 0.0
    """Lower-is-worse signals: judged only when the peers' reference is at least this."""
    trigger: bool = True
    """False: shown as evidence, never makes an executor off."""
    unit: str = ""


PULSE_LATE = Signal("pulse_late_ms", "JVM pulse lateness (GC pauses excluded)", True, 3.0, 20.0, unit=" ms")
RTT = Signal("rtt_ms", "heartbeat RTT", True, 5.0, 100.0, unit=" ms")
TASK_CPU = Signal("task_cpu", "task CPU share", False, 1.6, 0.15, floor=0.25, trigger=False)
GC_SHARE = Signal("gc_share", "time in GC pauses", True, 3.0, 0.1, trigger=False)
SIGNALS: tuple[Signal, ...] = (PULSE_LATE, RTT, TASK_CPU, GC_SHARE)
_BY_NAME = {s.name: s for s in SIGNALS}

# The agent's cumulative figures (``monitoring.executor_pace``) behind the signals.
PACE_LINES = "jvm_pace_lines"
PACE_LATE_MS = "jvm_pace_late_ms"
TASK_CPU_PREFIX = "task_cpu_s."
TASK_WALL_PREFIX = "task_wall_s."
GC_SECONDS = "jvm_gc_s"

Key = tuple[str, str]
"""(signal name, group): the group is a stage id for ``task_cpu``, empty for the others."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One signal on which an executor is off (or, for evidence, where it stands)."""

    signal: Signal
    group: str
    value: float
    reference: float
    peers: int
    since: float
    """Wall-clock time it has been off since (the first evaluation of the current run)."""

    def text(self) -> str:
        where = f" in stage {self.group}" if self.group else ""
        worse, better = (
            (self.value, self.reference) if self.signal.higher_is_worse else (self.reference, self.value)
        )
        how = f"{worse / better:.1f}x" if better > 0 else "off the scale"
        peers = f"{self.peers} peer{'s' if self.peers != 1 else ''}"
        return (
            f"{self.signal.what}{where} {_fmt(self.value)}{self.signal.unit} vs the peers' "
            f"{_fmt(self.reference)}{self.signal.unit} ({how}, {peers}) since {_iso(self.since)}"
        )


@dataclass
class _Executor:
    host: str = ""
    instance_id: str = ""
    samples: dict[Key, deque[tuple[float, float]]] = field(default_factory=dict)
    figures: dict[Key, float] = field(default_factory=dict)
    """Median of each signal's samples in the window (only with ``MIN_SAMPLES``), for peers."""
    last: Mapping[str, float] | None = None
    """The previous heartbeat's cumulative figures (for differences)."""
    last_at: float = 0.0
    groups: deque[str] = field(default_factory=deque)
    off_since: dict[Key, tuple[float, float]] = field(default_factory=dict)
    """Per key off now: since when (monotonic, wall)."""
    bad_since: float | None = None
    good_since: float | None = None
    degraded: bool = False
    degraded_at: float = 0.0
    evidence: str = ""
    adopted: bool = False
    """Taken over from a previous driver-side process: recorded, never excluded on that verdict."""


class DegradedWatch:
    """Turns heartbeats into ``DEGRADED`` / ``RECOVERED`` events. One thread only (the RM's event
    thread, through ``processes.driver.EventRouter``)."""

    def __init__(
        self,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
        *,
        window_s: float | None = None,
        enter_s: float = ENTER_S,
        leave_s: float = LEAVE_S,
        evaluate_every_s: float = EVALUATE_EVERY_S,
        min_samples: int = MIN_SAMPLES,
    ) -> None:
        if interval_s <= 0 or enter_s < 0 or leave_s < 0 or min_samples < 1:
            raise ValueError("interval must be positive, enter/leave times non-negative, min_samples >= 1")
        self._clock = clock
        self._window_s = window_s if window_s is not None else max(WINDOW_S, WINDOW_INTERVALS * interval_s)
        self._enter_s = enter_s
        self._leave_s = leave_s
        self._every_s = evaluate_every_s
        self._min = min_samples
        self._executors: dict[str, _Executor] = {}
        self._evaluated = float("-inf")

    # -- input ------------------------------------------------------------------------------------
    def on_heartbeat(self, record: HeartbeatRecord) -> list[ExecutorEvent]:
        """Takes one heartbeat's samples; evaluates every executor if ``evaluate_every_s`` passed."""
        now = self._clock.monotonic()
        state = self._executors.setdefault(record.executor_id, _Executor())
        if state.instance_id != record.instance_id:  # a new agent process: its counters start over
            state.last = None
        state.host, state.instance_id = record.host, record.instance_id
        for key, value in self._samples(state, record, now):
            series = state.samples.get(key)
            if series is None:
                series = state.samples[key] = deque()
            series.append((now, value))
        if now - self._evaluated < self._every_s:
            return []
        self._evaluated = now
        return self.evaluate()

    def adopt(self, executor_ids: Iterable[str]) -> None:
        """Executors a previous driver-side process of this application recorded ``DEGRADED`` and
        not since recovered or gone (:func:`still_degraded` of the recovered history): taken as
        degraded still, so that they are recorded ``RECOVERED`` once in line (never ``DEGRADED``
        twice). A restarted process calls this before its RM serves."""
        wall = self._clock.time()
        for executor_id in executor_ids:
            state = self._executors.setdefault(executor_id, _Executor())
            state.degraded, state.degraded_at, state.adopted = True, wall, True
            state.evidence = "recorded DEGRADED before the driver-side process restarted"

    def forget(self, executor_id: str) -> None:
        """The executor is gone (Spark removed or lost it, its agent left): its state goes, no
        event (its removal is the end of its story)."""
        self._executors.pop(executor_id, None)

    def degraded(self) -> dict[str, str]:
        """Executors recorded ``DEGRADED`` and not recovered, each with its evidence, the earliest
        recorded first."""
        found = sorted((s.degraded_at, e) for e, s in self._executors.items() if s.degraded)
        return {e: self._executors[e].evidence for _, e in found}

    def excludable(self) -> dict[str, str]:
        """``degraded()`` less the executors taken over from a previous process: an exclusion acts
        only on a verdict this process reached on its own samples."""
        return {e: why for e, why in self.degraded().items() if not self._executors[e].adopted}

    def healthy(self) -> int:
        """Executors with heartbeats in the window that are not degraded."""
        return sum(1 for s in self._executors.values() if not s.degraded and s.samples)

    def tracked(self) -> int:
        return len(self._executors)

    def _samples(self, state: _Executor, record: HeartbeatRecord, now: float) -> list[tuple[Key, float]]:
        out: list[tuple[Key, float]] = [((RTT.name, ""), record.rtt_ms)]
        metrics = record.payload.metrics
        last, elapsed = state.last, now - state.last_at
        state.last, state.last_at = dict(metrics), now
        if last is None or elapsed <= 0:
            return out
        lines = _delta(metrics, last, PACE_LINES)
        late = _delta(metrics, last, PACE_LATE_MS)
        if lines is not None and late is not None and lines > 0:
            out.append(((PULSE_LATE.name, ""), late / lines))
        gc = _delta(metrics, last, GC_SECONDS)
        if gc is not None:
            out.append(((GC_SHARE.name, ""), min(1.0, gc / elapsed)))
        for name in metrics:
            if not name.startswith(TASK_CPU_PREFIX):
                continue
            stage = name[len(TASK_CPU_PREFIX) :]
            cpu = _delta(metrics, last, name)
            wall = _delta(metrics, last, TASK_WALL_PREFIX + stage)
            if cpu is None or wall is None or wall < 0.1:  # less than a tenth of a task-second: noise
                continue
            out.append(((TASK_CPU.name, stage), min(1.5, cpu / wall)))
            if stage not in state.groups:
                state.groups.append(stage)
                while len(state.groups) > MAX_GROUPS:
                    old = state.groups.popleft()
                    for key in [k for k in state.samples if k[1] == old]:
                        del state.samples[key]
                        state.figures.pop(key, None)
                        state.off_since.pop(key, None)
        return out

    # -- judgement --------------------------------------------------------------------------------
    def evaluate(self) -> list[ExecutorEvent]:
        """Judges every executor now; the events of those whose state changed."""
        now, wall = self._clock.monotonic(), self._clock.time()
        for state in self._executors.values():
            self._refresh(state, now)
        by_key: dict[Key, list[tuple[str, float]]] = {}
        for executor_id, state in self._executors.items():
            for key, value in state.figures.items():
                by_key.setdefault(key, []).append((executor_id, value))
        degraded = {e for e, s in self._executors.items() if s.degraded}
        out = []
        for executor_id, state in self._executors.items():
            findings, judged = self._findings(executor_id, state, by_key, degraded, now, wall)
            event = self._step(executor_id, state, findings, judged, now, wall)
            if event is not None:
                out.append(event)
        return out

    def _refresh(self, state: _Executor, now: float) -> None:
        cutoff = now - self._window_s
        for key in list(state.samples):
            series = state.samples[key]
            while series and series[0][0] < cutoff:
                series.popleft()
            if not series:
                del state.samples[key]
                state.figures.pop(key, None)
                continue
            if len(series) >= self._min:
                state.figures[key] = statistics.median(v for _, v in series)
            else:
                state.figures.pop(key, None)

    def _findings(
        self,
        executor_id: str,
        state: _Executor,
        by_key: dict[Key, list[tuple[str, float]]],
        degraded: set[str],
        now: float,
        wall: float,
    ) -> tuple[list[Finding], bool]:
        """The keys on which ``executor_id`` is off now (evidence-only signals too, marked), and
        whether any triggering signal could be judged at all."""
        findings: list[Finding] = []
        judged = False
        for key, value in state.figures.items():
            signal = _BY_NAME[key[0]]
            peers = _peer_values(executor_id, by_key.get(key, []), degraded)
            if not peers:
                state.off_since.pop(key, None)
                continue
            reference = float(statistics.median(peers))
            spread = (
                MAD_SCALE * statistics.median(abs(p - reference) for p in peers) if len(peers) >= 3 else 0.0
            )
            off = _off(signal, value, reference, spread)
            if off is None:
                continue  # the peers are idle on a lower-is-worse signal: nothing to judge
            judged = judged or signal.trigger
            if not off:
                state.off_since.pop(key, None)
                continue
            since = state.off_since.setdefault(key, (now, wall))
            findings.append(Finding(signal, key[1], value, reference, len(peers), since[1]))
        return findings, judged

    def _step(
        self,
        executor_id: str,
        state: _Executor,
        findings: list[Finding],
        judged: bool,
        now: float,
        wall: float,
    ) -> ExecutorEvent | None:
        triggering = [f for f in findings if f.signal.trigger]
        if not state.degraded:
            state.good_since = None
            if not triggering:
                state.bad_since = None
                return None
            if state.bad_since is None:
                state.bad_since = now
            if now - state.bad_since < self._enter_s:
                return None
            state.degraded, state.degraded_at = True, wall
            state.evidence = _evidence(findings)
            log.warning("executor %s is slower than its peers: %s", executor_id, state.evidence)
            return self._event(
                EventKind.DEGRADED, executor_id, state, wall, f"slower than its peers: {state.evidence}"
            )
        state.bad_since = None
        if triggering or not judged:
            state.good_since = None
            if triggering:
                state.evidence = _evidence(findings)
            return None
        if state.good_since is None:
            state.good_since = now
        if now - state.good_since < self._leave_s:
            return None
        state.degraded, state.good_since = False, None
        spell = _duration(wall - self._leave_s - state.degraded_at)
        detail = (
            f"back in line with its peers for {self._leave_s:g} s after {spell} degraded "
            f"(since {_iso(state.degraded_at)}; was: {state.evidence})"
        )
        state.evidence = ""
        log.info("executor %s recovered: %s", executor_id, detail)
        return self._event(EventKind.RECOVERED, executor_id, state, wall, detail)

    @staticmethod
    def _event(
        kind: EventKind, executor_id: str, state: _Executor, wall: float, detail: str
    ) -> ExecutorEvent:
        return ExecutorEvent(kind, executor_id, state.host, state.instance_id, wall, detail)


def _off(signal: Signal, value: float, reference: float, spread: float) -> bool | None:
    """Whether ``value`` is beyond every bound of ``signal`` from the peers' ``reference``; None
    when a lower-is-worse signal's peers are below its floor (idle: nothing to compare)."""
    if signal.higher_is_worse:
        return value >= max(
            reference * signal.ratio, reference + signal.margin, reference + MAD_FACTOR * spread
        )
    if reference < signal.floor:
        return None
    return value <= min(reference / signal.ratio, reference - signal.margin, reference - MAD_FACTOR * spread)


def _peer_values(executor_id: str, figures: list[tuple[str, float]], degraded: set[str]) -> list[float]:
    """The other executors' figures, leaving out degraded ones while a healthy peer remains (one
    slow executor must not raise the bar for the next). Beyond ``EXACT_PEERS``, all of them."""
    if len(figures) > EXACT_PEERS:
        return [v for _, v in figures]
    others = [(e, v) for e, v in figures if e != executor_id]
    healthy = [v for e, v in others if e not in degraded]
    return healthy or [v for _, v in others]


def _delta(now: Mapping[str, float], before: Mapping[str, float], name: str) -> float | None:
    """A cumulative figure's growth since the previous heartbeat; None if either lacks it or it
    went back (its counter restarted)."""
    a, b = now.get(name), before.get(name)
    if a is None or b is None or a < b:
        return None
    return a - b


def _evidence(findings: list[Finding]) -> str:
    trig = sorted((f for f in findings if f.signal.trigger), key=lambda f: f.since)
    extra = [f for f in findings if not f.signal.trigger]
    return "; ".join(f.text() for f in [*trig, *extra])


def _fmt(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 10)}Z"


def _duration(seconds: float) -> str:
    return f"{max(0.0, seconds):.0f} s"


EXCLUSION_PENDING_S = 300.0
"""How long an asked-for exclusion blocks the next one unless Spark removes the executor sooner."""


class Exclusions:
    """``spark.arrowbeat.onDegraded=exclude``: which degraded executor to ask Spark to stop using
    and replace, and when. One at a time: the next waits until Spark removed the last one (or
    ``pending_s`` passed), so a cluster-wide slowdown that a comparison got wrong cannot take many
    executors at once; never one without a healthy peer left to take its work; each at most once.
    A refusal of the JVM is logged, never raised: the user's job must not depend on it."""

    def __init__(
        self,
        exclude: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
        pending_s: float = EXCLUSION_PENDING_S,
    ) -> None:
        self._exclude = exclude
        self._clock = clock
        self._pending_s = pending_s
        self._pending: tuple[str, float] | None = None
        self._asked: set[str] = set()

    def consider(self, degraded: Iterable[str], healthy: int) -> str | None:
        """Asks for the first of ``degraded`` (oldest first) not asked for yet, if none is pending
        and ``healthy`` executors remain; the one asked for, else None."""
        now = self._clock.monotonic()
        if self._pending is not None and now - self._pending[1] < self._pending_s:
            return None
        waiting = [e for e in degraded if e not in self._asked]
        if not waiting:
            return None
        if healthy < 1:
            return None
        chosen = waiting[0]
        self._asked.add(chosen)
        self._pending = (chosen, now)
        try:
            self._exclude(chosen)
        except JvmCommandError as exc:
            log.warning("not asking Spark to exclude degraded executor %s: %s", chosen, exc)
            self._pending = None
            return None
        log.warning(
            "asked Spark to stop using degraded executor %s and replace it (onDegraded=exclude)",
            chosen,
        )
        return chosen

    def forget(self, executor_id: str) -> None:
        """Spark removed the executor: the next exclusion may go ahead."""
        if self._pending is not None and self._pending[0] == executor_id:
            self._pending = None
        self._asked.discard(executor_id)
