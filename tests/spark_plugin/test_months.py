"""Months, not minutes (issue 24, item 5): 90 simulated days of dynamic-allocation churn, an
executor added and removed every minute, against the ResourceManager's core and the driver-side
consumers of its events, all on one ``ManualClock`` and without gRPC, sockets or Spark.

What runs is what the driver-side process wires (``processes.driver``): Spark's view of its
executors (``SparkView`` on the JVM's ``executor-*`` lines) drives the RM core's cluster view;
agents register, answer heartbeat requests, unregister or fall silent; the core's events go, in
order, to the ``EventRouter`` (task events, gap explanations, history rows), the live page's
view and the metrics tally. The history writer runs its own buffering and flushing; only the
Delta commit is a fake sink that counts rows.

Every minute an executor goes one of six ways (a clean idle removal; a removal whose agent then
falls silent; a crash seen by both the RM and Spark; a flap: timeout, re-registration, then
removal; an agent that never starts; a stuck task at removal). Every structure that holds per-
executor state or events is measured at day 30 (the default bounds on remembered departed
executors, 10,000 each, fill within about two weeks of this churn) and at day 90: the sizes must
be equal, and so, within a few blocks, the interpreter's allocated memory blocks
(``sys.getallocatedblocks``: every live object and container table, whatever allocated it). A
leak of one small object per departed executor would add 86,400 blocks over those 60 days.

Not tracemalloc: what it reports as held drifts up by ~30 KB a simulated day here while the
live blocks stay flat, since blocks re-used from the interpreter's free lists (dicts, their
tables) keep the attribution of their first allocation, traced or not."""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from heartbeat import EventKind, HeartbeatServices, ManualScheduler, Payload, WorkProgress
from heartbeat.events import Event
from heartbeat.rm.resource_manager import ResourceManagerCore
from spark_plugin.history import EXECUTOR_EVENTS, HEARTBEATS, HistoryWriter
from spark_plugin.jvm.plugin_metrics import LivenessTally
from spark_plugin.monitoring.driver_lost_outputs import LostOutputs
from spark_plugin.monitoring.driver_spark_view import SparkView
from spark_plugin.monitoring.driver_tasks import TaskEvents
from spark_plugin.processes.driver import EventRouter
from spark_plugin.tools.live_page import LiveView

DAY_S = 86_400.0
MINUTE_S = 60.0
STEP_S = 30.0
"""One heartbeat interval: the simulation moves the clock by this much, then the agents answer
(a long interval keeps 129,600 executor lives within the test's time; the structures under test
hold per executor, not per heartbeat)."""
SERVICES = HeartbeatServices(interval_s=STEP_S, timeout_s=70.0, rpc_failure_threshold=2)
REGISTER_WITHIN_S = 20.0
FLUSH_S = 600.0
WAYS = 6
SLACK = 8
"""Executors in flight differ by the moment of the minute a day ends at: a few entries."""


@dataclass
class Link:
    """An agent's stream as the RM sees it: requests it was sent, whether it was closed."""

    requests: list[tuple[str, str, int]] = field(default_factory=list)
    closed: bool = False

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        self.requests.append((epoch, instance_id, seq))

    def close(self, status: str, detail: str) -> None:
        self.closed = True

    def ask_kill_host(self, epoch: str, instance_id: str, reason: str) -> None:
        """Never asked: these RMs do not kill frozen hosts."""


@dataclass
class Agent:
    executor_id: str
    way: int
    born: float
    link: Link = field(default_factory=Link)
    instance_id: str = ""
    answering: bool = True
    gaps: float = 0.0


class Cluster:
    """``SparkView``'s ``ClusterView``, applied to the core at once (the server's loop does the
    same, one call at a time)."""

    def __init__(self, core: ResourceManagerCore) -> None:
        self._core = core

    def executor_started(self, executor_id: str, host: str, within_s: float) -> None:
        self._core.expect(executor_id, host, within_s)

    def agent_not_started(self, executor_id: str, reason: str) -> None:
        self._core.agent_not_started(executor_id, reason)

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None:
        self._core.agent_down(executor_id, pid, detail)

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None:
        self._core.cluster_removed(executor_id, kind, detail)


class Fanout:
    """The RM's bus, synchronously: each event to every subscriber, in order."""

    def __init__(self) -> None:
        self.subscribers: list[Callable[[Event], None]] = []
        self.published = 0

    def publish(self, event: Event) -> None:
        self.published += 1
        for subscriber in self.subscribers:
            subscriber(event)


class CountingWriter(HistoryWriter):
    """The history writer with its buffers, batches and flush schedule, committing to a fake sink:
    a batch is counted, not made an Arrow table (its schema is another test's)."""

    committed_rows = 0

    def _to_table(self, pending: Any, rows: list[dict[str, Any]]) -> Any:
        self.committed_rows += len(rows)
        return _Batch(len(rows))


@dataclass(frozen=True)
class _Batch:
    num_rows: int


class World:
    def __init__(self, tables: Path) -> None:
        self.scheduler = ManualScheduler()
        self.clock = self.scheduler.clock
        self.bus = Fanout()
        self.core = ResourceManagerCore(SERVICES, self.clock, self.scheduler, self.bus, spread=1)
        self.tasks = TaskEvents(hold_s=5 * STEP_S)
        self.history = CountingWriter(tables, FLUSH_S, compact_interval_s=1e12, clock=self.clock)
        self.history.open()
        self.router = EventRouter(lambda: "app-months", self.history, tasks=self.tasks, clock=self.clock)
        self.live = LiveView(self.core.executors, STEP_S, SERVICES.timeout_s, clock=self.clock)
        self.tally = LivenessTally()
        self.lost = LostOutputs(lambda _executor_id: None, clock=self.clock)
        self.spark = SparkView(Cluster(self.core), REGISTER_WITHIN_S, True, self.lost)
        self.bus.subscribers += [self.router, self.live, self.tally]
        self.core.start()
        self.agents: dict[str, Agent] = {}
        self.next_id = 1
        self.minutes = 0

    # ---- one agent's life ----------------------------------------------------------------

    def _register(self, agent: Agent) -> None:
        agent.link = Link()
        agent.instance_id = self.core.register(agent.executor_id, "host-a", agent.link, pid=4242).instance_id
        agent.answering = True

    def _answer(self, agent: Agent) -> None:
        stuck = agent.way == 5 and self.clock.monotonic() - agent.born >= STEP_S
        work = (
            WorkProgress("7", "stage 1.0 partition 7 attempt 0 (task 7)", 30.0, 25.0, True, "Python: wait")
            if stuck
            else WorkProgress("7", "stage 1.0 partition 7 attempt 0 (task 7)", 5.0, 0.1)
        )
        payload = Payload(
            slots_total=2,
            slots_busy=1,
            running_tasks=1,
            rss_bytes=300 << 20,
            metrics={"jvm_gc_s": 0.5, "jvm_gaps": agent.gaps, "jvm_gap_s": 41.0, "jvm_gap_gc_s": 40.0},
            work=(work,),
        )
        for epoch, instance_id, seq in agent.link.requests:
            self.core.receive_heartbeat(agent.executor_id, epoch, instance_id, seq, payload)
        agent.link.requests.clear()

    def _leave(self, agent: Agent) -> None:
        """Unregisters (its JVM stops) unless the RM already dropped it."""
        if not agent.link.closed:
            self.core.unregister(agent.executor_id, self.core.epoch, agent.instance_id, "executor stopping")
        del self.agents[agent.executor_id]

    def _step(self, agent: Agent, age: float) -> None:
        """What ``agent`` does ``age`` seconds after Spark added its executor, by its way."""
        eid, way = agent.executor_id, agent.way
        if age == 0:
            self.spark(f"executor-added {eid} host-a")
            if way != 4:
                self._register(agent)
            return
        if way == 0 and age == 30:  # idle: Spark removes it, then its agent unregisters
            self.spark(f"executor-removed {eid} spark Executor killed by driver.")
            self._leave(agent)
        elif way == 1:  # removed; its agent dies with the JVM without a word: a timeout follows
            if age == 30:
                self.spark(f"executor-removed {eid} spark Executor killed by driver.")
                agent.answering = False
            elif age >= 150:
                del self.agents[eid]
        elif way == 2:  # crash: the RM's timeout, then Spark's loss
            if age == 30:
                agent.answering = False
            elif age == 90:
                self.spark(f"executor-removed {eid} spark Command exited with code 137")
                del self.agents[eid]
        elif way == 3:  # a long pause: timeout, re-registration (held, explained), removal
            if age == 30:
                agent.answering = False
            elif not agent.answering and agent.link.closed:
                agent.gaps += 1
                self._register(agent)
            elif age >= 180:
                self.spark(f"executor-removed {eid} spark Executor killed by driver.")
                self._leave(agent)
        elif way == 4 and age == 30:  # no agent ever: UNMONITORED, then removed
            self.spark(f"executor-removed {eid} spark Executor killed by driver.")
            del self.agents[eid]
        elif way == 5 and age == 60:  # removed while a task of it is stuck
            self.spark(f"executor-removed {eid} spark Executor killed by driver.")
            self._leave(agent)

    # ---- time ----------------------------------------------------------------------------

    def run_minutes(self, minutes: int) -> None:
        for _ in range(minutes):
            eid = str(self.next_id)
            self.next_id += 1
            self.agents[eid] = Agent(eid, self.minutes % WAYS, self.clock.monotonic())
            for _ in range(int(MINUTE_S / STEP_S)):
                for agent in list(self.agents.values()):
                    self._step(agent, self.clock.monotonic() - agent.born)
                self.scheduler.advance(STEP_S)
                for agent in self.agents.values():
                    if agent.answering and not agent.link.closed:
                        self._answer(agent)
                self.history.run_due()
            self.minutes += 1

    def sizes(self) -> dict[str, int]:
        """Every per-executor or per-event structure of the pieces above."""
        core, sender = self.core, self.core._sender
        return {
            "rm.table": len(core._registrations),
            "rm.seen": len(core._seen) + len(core._forgotten),
            "rm.ended": len(core._ended),
            "rm.expected": len(core._expected),
            "rm.removed_on_purpose": len(core._removed_on_purpose),
            "rm.cluster_gone": len(core._cluster_gone),
            "rm.monitors": len(sender.targets()),
            "rm.slices": sum(len(s) for s in sender._slices) + len(sender._slice_of),
            "scheduler.timers": len(self.scheduler._heap),
            "tasks.executors": self.tasks.tracked(),
            "tasks.departed": len(self.tasks._departed),
            "router.last_beat": len(self.router._last_beat),
            "live.series": len(self.live._rtts),
            "live.points": sum(len(s) for s in self.live._rtts.values()),
            "live.events": len(self.live._events),
            "tally.gone": len(self.tally._gone),
            "lost.taken": len(self.lost._taken),
            "history.buffered": sum(self.history.buffered(t.name) for t in (HEARTBEATS, EXECUTOR_EVENTS)),
        }


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


@pytest.mark.slow
def test_ninety_days_of_executor_churn_stay_flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import deltalake

    monkeypatch.setattr(deltalake, "write_deltalake", lambda *_args, **_options: None)  # the commit
    world = World(tmp_path / "tables")
    started, cpu_started = time.monotonic(), time.process_time()
    day = int(DAY_S / MINUTE_S)
    world.run_minutes(day)
    at_day_1 = world.sizes()
    world.run_minutes(29 * day)
    at_day_30, blocks_30 = world.sizes(), _blocks()
    world.run_minutes(30 * day)
    blocks_60 = _blocks()
    world.run_minutes(30 * day)
    at_day_90, blocks_90 = world.sizes(), _blocks()
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu_started
    print(f"\nday 1: {at_day_1}\nday 30: {at_day_30}\nday 90: {at_day_90}")
    print(
        f"allocated blocks at days 30, 60, 90: {blocks_30}, {blocks_60}, {blocks_90}; events "
        f"{world.bus.published}, rows committed {world.history.committed_rows}; "
        f"{elapsed:.1f} s ({cpu:.1f} s CPU)"
    )

    assert world.minutes == 90 * day and world.clock.monotonic() == pytest.approx(90 * DAY_S)
    for name, size in at_day_90.items():
        assert abs(size - at_day_30[name]) <= SLACK, (name, at_day_30[name], size)
    assert at_day_90["rm.table"] <= 10_000 + SLACK and at_day_90["rm.monitors"] <= SLACK
    assert at_day_90["rm.seen"] <= at_day_90["rm.table"] + 10_000
    assert at_day_90["tasks.executors"] <= SLACK and at_day_90["router.last_beat"] <= SLACK
    for blocks in (blocks_60, blocks_90):
        assert abs(blocks - blocks_30) < 2_000, ("allocated blocks changed", blocks_30, blocks_60, blocks_90)
    stats = world.history.stats()
    assert all(s["dropped"] == 0 and s["rejected"] == 0 for s in stats.values()), stats
    kinds = {e["kind"] for e in world.live.events_json()["events"]}
    assert kinds >= {"SPARK_REMOVED", "UNREGISTERED", "HEARTBEAT_TIMEOUT", "SPARK_LOST", "UNMONITORED"}
