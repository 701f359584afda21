"""The RM's word that the agent may end its frozen host reaches the host's judge only for the
registration being served and only while the host is unhealthy (issue 37)."""

from __future__ import annotations

import asyncio
import threading

from heartbeat import AgentCore, AgentThread, EventKind, HeartbeatServices, ManualScheduler
from heartbeat.rm.stream_link import StreamLink
from heartbeat.wire.proto import heartbeat_pb2 as pb

from .fakes import FakeRmLink, served_rm

EPOCH, INSTANCE = "epoch-1", "instance-1"


def serving(healthy: list[bool], asked: list[str]) -> AgentCore:
    scheduler = ManualScheduler()
    core = AgentCore(
        "exec-1",
        services=HeartbeatServices(interval_s=0.5, timeout_s=2.0),
        clock=scheduler.clock,
        is_healthy=lambda: healthy[0],
        on_kill_host=asked.append,
    )
    core.registered(EPOCH, INSTANCE, 500, 2000)
    core.start_session(FakeRmLink(), scheduler)
    return core


def test_the_kill_goes_to_the_judge_for_our_registration_of_an_unhealthy_host() -> None:
    healthy: list[bool] = [False]
    asked: list[str] = []
    core = serving(healthy, asked)
    assert core.on_kill_host(EPOCH, INSTANCE, "no heartbeat for 2 s\nforged")
    assert asked == ["no heartbeat for 2 s\\nforged"], "one line, escaped"


def test_a_kill_for_another_registration_a_healthy_host_or_no_session_is_ignored() -> None:
    healthy: list[bool] = [False]
    asked: list[str] = []
    core = serving(healthy, asked)
    assert not core.on_kill_host("epoch-0", INSTANCE, "stale epoch")
    assert not core.on_kill_host(EPOCH, "instance-0", "an older registration")
    healthy[0] = True  # the JVM pulses again: the RM's verdict is stale
    assert not core.on_kill_host(EPOCH, INSTANCE, "late")
    core.end_session()
    healthy[0] = False
    assert not core.on_kill_host(EPOCH, INSTANCE, "after the session")
    assert asked == []


def test_an_unhealthy_agent_stays_silent_but_keeps_its_session_while_the_rm_asks() -> None:
    """The RM's last word (``kill_host``) comes on the session: an agent whose host froze must
    not end it first for want of requests it chose not to answer (both timeouts are 2 s)."""
    scheduler = ManualScheduler()
    link = FakeRmLink()
    core = AgentCore(
        "exec-1",
        services=HeartbeatServices(interval_s=0.5, timeout_s=2.0),
        clock=scheduler.clock,
        is_healthy=lambda: False,
    )
    core.registered(EPOCH, INSTANCE, 500, 2000)
    core.start_session(link, scheduler)
    for seq in range(1, 11):  # 5 s of requests, every 0.5 s
        scheduler.advance(0.5)
        core.on_heartbeat_request(EPOCH, INSTANCE, seq)
    assert link.answers == [] and link.ended == [] and core.registration is not None


def test_over_grpc_the_rms_last_word_reaches_a_frozen_agents_judge() -> None:
    """A timeout carries the RM's last word to the frozen host's judge. On a loaded machine the
    RM's own loop may stall past its bound (``rm.trust``): that silence judges nothing and counts
    again from then, so the timeout comes later, but it comes, and the registration stays."""
    svc = HeartbeatServices(interval_s=0.2, timeout_s=1.0)
    with served_rm(svc, "s" * 32, kill_frozen_hosts=True) as (_, address, events):
        healthy, asked = [True], Collected()
        agent = AgentThread(
            address,
            "s" * 32,
            executor_id="1",
            services=svc,
            is_healthy=lambda: healthy[0],
            on_kill_host=asked.add,
        )
        try:
            agent.start()
            assert events.wait_for(lambda: bool(events.find(EventKind.REGISTERED, "1")), 10), agent.error
            healthy[0] = False
            events.wait_event(EventKind.HEARTBEAT_TIMEOUT, "1", 10)
            assert asked.wait(10) == ["no heartbeat for 1 s"]
        finally:
            agent.stop(timeout_s=1.0)


class Collected:
    """What the judge was handed, waited for with a deadline."""

    def __init__(self) -> None:
        self._items: list[str] = []
        self._done = threading.Event()

    def add(self, item: str) -> None:
        self._items.append(item)
        self._done.set()

    def wait(self, timeout_s: float) -> list[str]:
        self._done.wait(timeout_s)
        return self._items


class OneWriteAtATime:
    """A servicer context's writes as gRPC's core takes them: a write started while another is in
    flight fails, and a write cancelled in flight stays in flight (both measured on grpcio: the
    later write fails with GRPC_CALL_ERROR_TOO_MANY_OPERATIONS). A reading peer completes each
    write after ``takes_s``; one that stopped reading completes none."""

    def __init__(self, *, reading: bool, takes_s: float = 0.01) -> None:
        self.written: list[pb.RmMessage] = []
        self.in_flight: asyncio.Future[None] | None = None
        self._reading, self._takes_s = reading, takes_s

    async def write(self, message: pb.RmMessage) -> None:
        if self.in_flight is not None and not self.in_flight.done():
            raise RuntimeError("too many operations: a write is in flight")
        in_flight = self.in_flight = asyncio.get_running_loop().create_future()
        if self._reading:
            asyncio.get_running_loop().call_later(self._takes_s, in_flight.set_result, None)
        await asyncio.shield(in_flight)  # a cancelled await leaves the write in flight
        self.written.append(message)


def _timed_out_mid_write(context: OneWriteAtATime, bound_s: float) -> float:
    """A heartbeat request is being written when the RM times the registration out and winds
    the stream up; how long the wind-up took."""

    async def run() -> float:
        link = StreamLink(context)  # type: ignore[arg-type]
        writer = asyncio.create_task(link.write_loop())
        link.send_heartbeat_request(EPOCH, INSTANCE, 7)
        while context.in_flight is None:
            await asyncio.sleep(0)
        link.ask_kill_host(EPOCH, INSTANCE, "no heartbeat for 1 s")
        link.finish(("NOT_FOUND", "heartbeat timeout"))
        loop = asyncio.get_running_loop()
        start = loop.time()
        await link.wind_up(writer, bound_s=bound_s)
        return loop.time() - start

    return asyncio.run(run())


def test_a_timeout_during_a_request_write_still_says_the_last_word_after_it() -> None:
    context = OneWriteAtATime(reading=True)
    _timed_out_mid_write(context, bound_s=5.0)
    kinds = [m.WhichOneof("body") for m in context.written]
    assert kinds == ["heartbeat_request", "kill_host"], kinds
    assert context.written[1].kill_host.reason == "no heartbeat for 1 s"


def test_a_writer_stuck_on_a_peer_that_stopped_reading_ends_at_the_bound_without_the_last_word() -> None:
    context = OneWriteAtATime(reading=False)
    took = _timed_out_mid_write(context, bound_s=0.05)
    assert context.written == [] and took < 5.0, (context.written, took)
