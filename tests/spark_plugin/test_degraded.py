"""Gray failures named (issue 37, item 3), without Spark: ``monitoring.driver_degraded`` on a
manual clock, fed heartbeats as agents running ``monitoring.executor_pace`` would send them.

A duty-cycled executor (its JVM stopped 150 ms of every 300 ms: each pulse line about 50 ms late)
is recorded DEGRADED with its evidence and RECOVERED once it is back; an executor that is merely
busier (more tasks, a skewed partition, more GC) is never named; nor one whose only peer is idle.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from arrowbeat_base.clock import ManualClock
from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, Payload
from spark_plugin.monitoring.driver_degraded import ENTER_S, LEAVE_S, DegradedWatch
from spark_plugin.monitoring.executor_pace import JvmPace
from spark_plugin.monitoring.executor_task_lines import JvmSample, TaskSample

INTERVAL_S = 0.5
PULSE_S = INTERVAL_S / 2


@dataclass
class Agent:
    """One executor's agent as the driver hears it: cumulative pace, GC and per-stage task CPU."""

    executor_id: str
    late_ms: Callable[[float], float] = lambda t: 3.0
    """Mean lateness of a pulse line at time t."""
    gc_share: float = 0.02
    tasks: Callable[[float], dict[str, tuple[int, float]]] = lambda t: {}
    """Stage -> (running tasks, CPU share of each) at time t."""
    rtt_ms: float = 2.0
    instance: str = "i1"
    figures: dict[str, float] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def beat(self, t: float, clock: ManualClock) -> HeartbeatRecord:
        lines = INTERVAL_S / PULSE_S
        f = self.figures
        f["jvm_pace_lines"] = f.get("jvm_pace_lines", 0.0) + lines
        late = max(0.0, self.late_ms(t) * self.rng.uniform(0.5, 1.5))
        f["jvm_pace_late_ms"] = f.get("jvm_pace_late_ms", 0.0) + lines * late
        f["jvm_gc_s"] = f.get("jvm_gc_s", 0.0) + INTERVAL_S * self.gc_share
        for stage, (count, share) in self.tasks(t).items():
            wall = count * INTERVAL_S
            f[f"task_wall_s.{stage}"] = f.get(f"task_wall_s.{stage}", 0.0) + wall
            cpu = wall * share * self.rng.uniform(0.9, 1.1)
            f[f"task_cpu_s.{stage}"] = f.get(f"task_cpu_s.{stage}", 0.0) + cpu
        rtt = self.rtt_ms * self.rng.uniform(0.5, 2.0)
        return HeartbeatRecord(
            self.executor_id, "h", self.instance, clock.time(), rtt, Payload(metrics=dict(f))
        )


def run(
    agents: list[Agent], seconds: float, clock: ManualClock, watch: DegradedWatch
) -> list[tuple[float, ExecutorEvent]]:
    """Heartbeats of every agent each interval for ``seconds``; the events with their times."""
    out = []
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        clock.jump(INTERVAL_S)
        for agent in agents:
            for event in watch.on_heartbeat(agent.beat(clock.monotonic(), clock)):
                out.append((clock.monotonic(), event))
    return out


def kinds(events: list[tuple[float, ExecutorEvent]]) -> list[tuple[str, str]]:
    return [(e.kind.value, e.executor_id) for _, e in events]


def steady(ms: float) -> Callable[[float], float]:
    return lambda t: ms


def duty_cycled(from_s: float, until_s: float = float("inf")) -> Callable[[float], float]:
    """Each pulse about 50 ms late while its JVM is stopped 150 ms of every 300 ms (pulses of
    250 ms lock onto the cycle: each wakes 50 ms into a stop), 3 ms otherwise."""
    return lambda t: 50.0 if from_s <= t < until_s else 3.0


def test_a_duty_cycled_executor_is_degraded_with_evidence_and_the_healthy_one_never() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    slow = Agent("1", late_ms=duty_cycled(5.0))
    healthy = Agent("2")
    events = run([slow, healthy], 60.0, clock, watch)
    assert kinds(events) == [("DEGRADED", "1")]
    at, event = events[0]
    assert at - 5.0 <= ENTER_S + 6.0  # the window turns, then the hysteresis: well within 30 s
    assert event.detail.startswith("slower than its peers: JVM pulse lateness (GC pauses excluded) ")
    assert "vs the peers' " in event.detail and "(1 peer)" not in event.detail and "1 peer)" in event.detail
    assert " since 2023-11-14T" in event.detail  # ManualClock's wall start
    now = watch.degraded()  # the evidence as it stands now
    assert list(now) == ["1"] and now["1"].startswith("JVM pulse lateness (GC pauses excluded) ")


def test_back_to_normal_is_recovered_after_the_leave_time_and_not_before() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    slow = Agent("1", late_ms=duty_cycled(0.0, until_s=30.0))
    events = run([slow, Agent("2"), Agent("3")], 80.0, clock, watch)
    assert kinds(events) == [("DEGRADED", "1"), ("RECOVERED", "1")]
    recovered_at, recovered = events[1]
    assert 30.0 + LEAVE_S <= recovered_at <= 30.0 + LEAVE_S + 8.0
    assert recovered.detail.startswith(f"back in line with its peers for {LEAVE_S:g} s")
    assert "was: JVM pulse lateness" in recovered.detail
    assert watch.degraded() == {}


def test_a_busier_executor_with_a_skewed_partition_and_more_gc_is_never_named() -> None:
    """Four tasks of stage 3 where its peers run one (more task-seconds, a skewed partition),
    ten times their GC; the same CPU share per task and a JVM that wakes on time."""
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    busy = Agent("1", gc_share=0.3, tasks=lambda t: {"3": (4, 0.9)} if t < 50 else {"3": (1, 0.9)})
    others = [Agent(str(i), tasks=lambda t: {"3": (1, 0.9)} if t < 20 else {}) for i in (2, 3)]
    events = run([busy, *others], 90.0, clock, watch)
    assert events == []


def test_a_task_cpu_share_is_evidence_within_one_stage_never_a_trigger_alone() -> None:
    """Executor 1's tasks of stage 7 get half the peers' CPU share (a skewed partition waiting on
    its reads could): nothing. Then its JVM is duty-cycled: DEGRADED, the share shown beside the
    lateness. Executor 4 runs another stage (5% CPU, waiting) beside them: never compared."""
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    one = Agent("1", late_ms=duty_cycled(30.0), tasks=lambda t: {"7": (1, 0.45)})
    peers = [Agent(str(i), tasks=lambda t: {"7": (1, 0.95)}) for i in (2, 3)]
    other = Agent("4", tasks=lambda t: {"4": (1, 0.05)})
    events = run([one, *peers, other], 60.0, clock, watch)
    assert kinds(events) == [("DEGRADED", "1")]
    at, event = events[0]
    assert at > 30.0
    assert event.detail.startswith("slower than its peers: JVM pulse lateness")
    assert "; task CPU share in stage 7 0.4" in event.detail and "stage 4" not in event.detail


def test_idle_peers_and_a_lone_executor_give_no_verdict() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    # A lone executor, however late: nobody to compare with.
    assert run([Agent("1", late_ms=lambda t: 80.0)], 30.0, clock, watch) == []
    # A busy task where the only peer's tasks wait (below the floor): the share says nothing.
    waiting = Agent("3", tasks=lambda t: {"2": (1, 0.05)})
    assert run([Agent("2", tasks=lambda t: {"2": (1, 0.1)}), waiting], 30.0, clock, watch) == []


def test_one_slow_executor_among_five_is_named_alone_and_does_not_raise_the_bar() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    agents = [Agent(str(i), late_ms=steady(2.0 + i)) for i in range(1, 6)]
    agents[0].late_ms = duty_cycled(0.0)
    agents[3].late_ms = lambda t: 40.0 if t >= 40 else 5.0  # a second one, later
    events = run(agents, 70.0, clock, watch)
    assert kinds(events) == [("DEGRADED", "1"), ("DEGRADED", "4")]


def test_a_short_slow_spell_is_not_enough() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    blip = Agent("1", late_ms=duty_cycled(10.0, until_s=10.0 + ENTER_S / 2))
    assert run([blip, Agent("2")], 60.0, clock, watch) == []


def test_a_restarted_agents_counters_and_a_forgotten_executor_bring_no_false_sample() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    a, b = Agent("1"), Agent("2")
    run([a, b], 10.0, clock, watch)
    a.figures.clear()  # a new agent process: its cumulative figures start at zero
    a.instance = "i2"
    assert run([a, b], 30.0, clock, watch) == []
    watch.forget("1")
    assert watch.tracked() == 1


def test_a_degraded_executor_that_goes_is_forgotten_without_an_event() -> None:
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    slow, healthy = Agent("1", late_ms=duty_cycled(0.0)), Agent("2")
    assert kinds(run([slow, healthy], 25.0, clock, watch)) == [("DEGRADED", "1")]
    watch.forget("1")
    assert watch.degraded() == {} and run([healthy], 20.0, clock, watch) == []


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        DegradedWatch(0.0)
    with pytest.raises(ValueError):
        JvmPace(0.0)


# -- the agent's side ------------------------------------------------------------------------


def sample(jvm_s: float, gc_s: float = 0.0, *tasks: tuple[int, int, float]) -> JvmSample:
    return JvmSample(
        0, gc_s, -1.0, jvm_s, tuple(TaskSample(tid, stage, 0, tid, 0, cpu, 1.0) for tid, stage, cpu in tasks)
    )


def test_pace_counts_lateness_beyond_the_interval_without_gc_and_at_most_one_interval() -> None:
    pace = JvmPace(0.25)
    assert pace.metrics() == {}
    pace.on_sample(sample(10.0))
    pace.on_sample(sample(10.30))  # 50 ms late
    pace.on_sample(sample(10.55, 0.0))  # on time
    pace.on_sample(sample(10.90, 0.08))  # 100 ms late, 80 ms of it a collection: 20 ms
    pace.on_sample(sample(12.00, 0.08))  # a long pause: at most one interval (250 ms)
    figures = pace.metrics()
    assert figures["jvm_pace_lines"] == 4
    assert figures["jvm_pace_late_ms"] == pytest.approx(50 + 0 + 20 + 250, abs=0.01)


def test_pace_sums_task_cpu_and_running_time_per_stage_for_the_newest_stages() -> None:
    pace = JvmPace(0.25, max_stages=2)
    pace.on_sample(sample(1.0, 0.0, (1, 5, 0.0), (2, 5, 1.0)))
    pace.on_sample(sample(1.25, 0.0, (1, 5, 0.2), (2, 5, 1.05), (3, 6, 0.0)))  # task 3 new: no delta
    pace.on_sample(sample(1.50, 0.0, (3, 6, 0.25), (4, 7, 0.0)))
    pace.on_sample(sample(1.75, 0.0, (3, 6, 0.30), (4, 7, 0.2)))
    figures = pace.metrics()
    assert "task_cpu_s.5" not in figures  # the oldest stage went (at most two)
    assert figures["task_cpu_s.6"] == pytest.approx(0.30) and figures["task_wall_s.6"] == pytest.approx(0.5)
    assert figures["task_cpu_s.7"] == pytest.approx(0.2) and figures["task_wall_s.7"] == pytest.approx(0.25)


def test_pace_reads_the_jvms_tasks_lines_and_ignores_others() -> None:
    pace = JvmPace(0.25)
    pace.on_line("tasks 100 5000 G1%20Young%20Generation:1:10 7:2:0:3:0:40:900")
    pace.on_line("stack 7 -")
    pace.on_line("tasks 150 5300 G1%20Young%20Generation:1:10 7:2:0:3:0:240:1200")
    figures = pace.metrics()
    assert figures["jvm_pace_lines"] == 1 and figures["jvm_pace_late_ms"] == pytest.approx(50.0)
    assert figures["task_cpu_s.2"] == pytest.approx(0.2) and figures["task_wall_s.2"] == pytest.approx(0.3)


def test_a_busier_agents_slower_answers_are_not_enough_a_starved_ones_are() -> None:
    """An agent serving much of the shuffle answers in 40 ms where its peers take 2: not named. One
    whose answers take 400 ms (a lossy link, a starved host) is, on the RTT."""
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    assert run([Agent("1", rtt_ms=40.0), Agent("2")], 40.0, clock, watch) == []
    events = run([Agent("3", rtt_ms=400.0), Agent("4")], 40.0, clock, watch)
    assert kinds(events) == [("DEGRADED", "3")]
    assert events[0][1].detail.startswith("slower than its peers: heartbeat RTT ")


# -- onDegraded=exclude and the driver's router ------------------------------------------------


def test_exclusions_go_one_at_a_time_never_without_a_healthy_peer_and_survive_a_refusal() -> None:
    from spark_plugin.errors import JvmCommandError
    from spark_plugin.monitoring.driver_degraded import Exclusions

    clock = ManualClock()
    asked: list[str] = []
    refuse = {"9"}

    def exclude(executor_id: str) -> None:
        if executor_id in refuse:
            raise JvmCommandError("not a Spark id")
        asked.append(executor_id)

    ex = Exclusions(exclude, clock, pending_s=60.0)
    assert ex.consider(["1"], healthy=0) is None and asked == []  # its work would have nowhere to go
    assert ex.consider(["1", "2"], healthy=2) == "1"
    assert ex.consider(["1", "2"], healthy=2) is None  # "1" is pending: "2" waits
    ex.forget("1")  # Spark removed it
    assert ex.consider(["2"], healthy=2) == "2"
    clock.jump(61.0)  # "2" never went: after the pending time the next may go, "2" is not asked twice
    assert ex.consider(["2", "9"], healthy=2) is None and asked == ["1", "2"]
    assert ex.consider(["3"], healthy=2) == "3"


def test_the_router_records_degraded_and_asks_for_the_exclusion_once() -> None:
    from spark_plugin.history import EXECUTOR_EVENTS
    from spark_plugin.monitoring.driver_degraded import Exclusions
    from spark_plugin.processes.driver import EventRouter

    class History:
        def __init__(self) -> None:
            self.rows: list[tuple[str, dict[str, object]]] = []

        def append(self, table: str, row: dict[str, object]) -> None:
            self.rows.append((table, row))

    clock = ManualClock()
    history = History()
    asked: list[str] = []
    shown: list[ExecutorEvent] = []
    router = EventRouter(
        lambda: "app-1",
        history,
        clock=clock,
        degraded=DegradedWatch(INTERVAL_S, clock),
        exclusions=Exclusions(asked.append, clock),
    )
    router.watch_derived(shown.append)
    slow, healthy = Agent("1", late_ms=duty_cycled(0.0)), Agent("2")
    for _ in range(60):
        clock.jump(INTERVAL_S)
        for agent in (slow, healthy):
            router(agent.beat(clock.monotonic(), clock))
    events = [(r["event"], r["executor_id"]) for t, r in history.rows if t == EXECUTOR_EVENTS.name]
    assert events == [("DEGRADED", "1")] and asked == ["1"]
    assert [e.kind.value for e in shown] == ["DEGRADED"]  # the live page and the gauges get it
    router(ExecutorEvent(EventKind.SPARK_REMOVED, "1", "h", "i1", clock.time(), "replaced"))
    clock.jump(INTERVAL_S)
    router(healthy.beat(clock.monotonic(), clock))
    assert asked == ["1"]


def test_a_restarted_driver_takes_back_the_degraded_and_records_their_recovery_not_a_second_degraded() -> (
    None
):
    from spark_plugin.monitoring.driver_degraded import still_degraded

    recorded = [
        ("REGISTERED", "1"),
        ("DEGRADED", "1"),
        ("DEGRADED", "2"),
        ("SPARK_REMOVED", "2"),
        ("DEGRADED", "3"),
    ]
    assert still_degraded(recorded) == ["1", "3"]
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    watch.adopt(["1"])
    assert list(watch.degraded()) == ["1"]
    events = run([Agent("1"), Agent("2")], 40.0, clock, watch)
    assert kinds(events) == [("RECOVERED", "1")]
    assert "recorded DEGRADED before the driver-side process restarted" in events[0][1].detail


def test_pace_takes_task_cpu_from_the_task_watch_when_told_to() -> None:
    pace = JvmPace(0.25, task_cpu_from_lines=False)
    pace.on_sample(sample(1.0, 0.0, (1, 5, 0.0)))
    pace.on_sample(sample(1.25, 0.0, (1, 5, 0.01)))  # the JVM thread waits on its Python worker
    pace.add_task_cpu(5, 0.24, 0.25)  # the task watch: JVM thread + labelled Python worker
    pace.add_task_cpu(5, 0.1, 0.0)  # no time: nothing
    figures = pace.metrics()
    assert figures["task_cpu_s.5"] == pytest.approx(0.24) and figures["task_wall_s.5"] == pytest.approx(0.25)
    assert figures["jvm_pace_lines"] == 1


def test_exclude_decommissions_where_sparks_decommissioning_is_on_else_kills_and_replaces() -> None:
    import io

    from spark_plugin.jvm.sidecar import JvmChannel
    from spark_plugin.processes.driver import exclude_action

    out = io.BytesIO()
    channel = JvmChannel(out)
    exclude_action({"spark.decommission.enabled": "true"}, channel)("4")
    exclude_action({"spark.decommission.enabled": "false"}, channel)("5")
    exclude_action({}, channel)("6")  # a launcher that hands nothing over: the kill it knows
    assert out.getvalue().decode().splitlines() == [
        "ARROWBEAT-CMD decommission-executor 4",
        "ARROWBEAT-CMD kill-executor 5",
        "ARROWBEAT-CMD kill-executor 6",
    ]


def test_an_adopted_verdict_is_recorded_but_never_excluded_on() -> None:
    """Review finding: a restarted driver-side process took back DEGRADED executors and, within a
    second of their next heartbeat, asked Spark to exclude them on its predecessor's verdict."""
    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    watch.adopt(["1"])
    assert list(watch.degraded()) == ["1"] and watch.excludable() == {}


def test_an_executor_that_timed_out_is_neither_a_peer_nor_healthy() -> None:
    """Review finding: a timed-out executor still counted as healthy for the window, so exclude
    could take the last executor that really answered."""
    from spark_plugin.monitoring.driver_degraded import Exclusions
    from spark_plugin.processes.driver import EventRouter

    clock = ManualClock()
    watch = DegradedWatch(INTERVAL_S, clock)
    asked: list[str] = []
    router = EventRouter(
        lambda: "app-1", None, clock=clock, degraded=watch, exclusions=Exclusions(asked.append, clock)
    )
    slow, healthy = Agent("1", late_ms=duty_cycled(0.0)), Agent("2")
    for _ in range(10):
        clock.jump(INTERVAL_S)
        for agent in (slow, healthy):
            router(agent.beat(clock.monotonic(), clock))
    assert watch.healthy() == 2
    router(ExecutorEvent(EventKind.HEARTBEAT_TIMEOUT, "2", "h", "i2", clock.time(), "silent"))
    assert watch.healthy() == 1 and watch.tracked() == 1
