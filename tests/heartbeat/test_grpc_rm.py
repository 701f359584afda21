"""The RM over real gRPC on 127.0.0.1, in-process: auth, malformed/oversized input, fencing."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import grpc
import pytest

from harness.procs import wait_until
from heartbeat import (
    AgentThread,
    EventKind,
    HeartbeatAuthenticationError,
    RegistrationReplacedError,
    RegistrationTimeoutError,
    ResourceManagerServer,
    RetryPolicy,
)
from heartbeat.agent.async_agent import AsyncAgent
from heartbeat.rm.admin import list_executors
from heartbeat.wire.io_loop import submit
from heartbeat.wire.proto import heartbeat_pb2 as pb

from .conftest import DEADLINE_S, FAST, SECRET, STEADY
from .fakes import Collector, served_rm
from .wire import message, raw_stream, register_frame

pytestmark = pytest.mark.timeout(60)
RETRY = RetryPolicy(min_delay_s=0.02, max_delay_s=0.1, deadline_s=10.0, attempt_timeout_s=1.0)
Rm = tuple[ResourceManagerServer, str, Collector]


def agent(address: str, executor_id: str, secret: str = SECRET, **kwargs: object) -> AgentThread:
    """An agent with STEADY's timeout (``kwargs`` may set its ``services``)."""
    kwargs.setdefault("services", STEADY)
    return AgentThread(address, secret, executor_id, retry_policy=RETRY, **kwargs)  # type: ignore[arg-type]


async def _async_agent(address: str, executor_id: str) -> AsyncAgent:
    """Made on the I/O loop (its events bind to it), to be run there by hand."""
    return AsyncAgent(address, SECRET, executor_id, services=STEADY, retry_policy=RETRY)


@pytest.fixture
def rm() -> Iterator[Rm]:
    """A served RM with STEADY's timeout: these tests assert agents stay RUNNING, which FAST's 0.5 s
    does not promise on a loaded machine (the timeout test uses ``fast_rm``)."""
    with served_rm(STEADY, SECRET) as served:
        yield served


@pytest.fixture
def fast_rm() -> Iterator[Rm]:
    with served_rm(FAST, SECRET) as served:
        yield served


def test_registered_agent_reports_heartbeats_with_rtt_despite_a_raising_subscriber(rm: Rm) -> None:
    server, address, events = rm

    def broken_subscriber(event: object) -> None:
        raise RuntimeError("a subscriber bug must not break the RM")

    server.subscribe(broken_subscriber)
    a = agent(address, "1")
    try:
        a.start()
        assert a.wait_registered(DEADLINE_S)
        assert a.registration is not None and a.registration.epoch == server.epoch
        assert events.wait_for(lambda: len(events.records) >= 3, DEADLINE_S)
        record = events.records[0]
        assert record.executor_id == "1" and 0 < record.rtt_ms < 1000
        [info] = server.executors()
        assert info.state == "RUNNING" and info.instance_id == a.registration.instance_id
    finally:
        a.stop()
    events.wait_event(EventKind.UNREGISTERED, "1", DEADLINE_S)


@pytest.mark.parametrize("secret", [None, "wrong", ""])
def test_missing_or_wrong_proof_is_unauthenticated_and_logged_once(
    rm: Rm, secret: str | None, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    server, address, events = rm
    with caplog.at_level(logging.WARNING):  # the root logger: grpc's and asyncio's records too
        first = raw_stream(address, [register_frame("x", secret=secret)])
        second = raw_stream(address, [register_frame("y", secret=secret)])
        # An authorised call served after both refusals on the same loop: whatever handling
        # them logged is in by the time it is answered.
        assert list_executors(address, SECRET) == []
    assert first.code == second.code == grpc.StatusCode.UNAUTHENTICATED
    assert "secret" in first.details and first.kinds == ["challenge"], "nothing but the challenge"
    assert server.executors() == [] and events.events == []
    [line] = caplog.records  # every WARNING+ record of any logger: one line for both refusals
    assert line.name.startswith("heartbeat") and "refused" in line.getMessage()
    assert "no valid proof of the secret" in line.getMessage()
    assert line.exc_info is None and line.exc_text is None and line.stack_info is None
    assert "\n" not in line.getMessage()
    assert "Traceback" not in capfd.readouterr().err, "no stack trace on stderr either (gRPC core)"


def test_agent_with_wrong_secret_keeps_trying_then_gives_up_at_its_deadline(
    rm: Rm, caplog: pytest.LogCaptureFixture
) -> None:
    """It cannot tell an RM given another secret from a port squatter: it retries, warns once."""
    _, address, _ = rm
    policy = RetryPolicy(min_delay_s=0.02, max_delay_s=0.05, deadline_s=1.0, attempt_timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="heartbeat"):
        a = AgentThread(address, "nope", "1", services=FAST, retry_policy=policy)
        try:
            a.start()
            assert not a.wait_registered(DEADLINE_S)
            assert isinstance(a.error, RegistrationTimeoutError) and a.error.attempts > 2
            assert isinstance(a.error.last_error, HeartbeatAuthenticationError)
        finally:
            a.stop()
    warned = [
        r for r in caplog.records if r.name == "heartbeat.agent.async_agent" and r.module == "async_agent"
    ]
    assert len(warned) == 1 and "prove" in warned[0].getMessage(), "one warning for all attempts"
    # Besides it, the outage's own line (agent_outage): once, as the second minute never came.
    outage = [r.getMessage() for r in caplog.records if r.module == "outage"]
    assert len(outage) == 1 and outage[0].startswith("agent 1 has had no RM for 0 s"), outage


def test_malformed_and_oversized_messages_get_a_status_and_others_keep_working(rm: Rm) -> None:
    _server, address, events = rm
    garbage = raw_stream(address, [b"\xff\xff\xff\xff garbage"])
    assert garbage.code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in garbage.details
    assert raw_stream(address, [b"\x00" * (2 << 20)]).code == grpc.StatusCode.RESOURCE_EXHAUSTED
    bad_first = raw_stream(address, [message(unregister=pb.UnregisterRequest(epoch="e"))])
    assert bad_first.code == grpc.StatusCode.INVALID_ARGUMENT and "register" in bad_first.details
    empty_id = raw_stream(address, [register_frame("")])
    assert empty_id.code == grpc.StatusCode.INVALID_ARGUMENT and "executor_id" in empty_id.details
    a = agent(address, "good")
    try:
        a.start()
        assert a.wait_registered(DEADLINE_S)
        events.wait_event(EventKind.REGISTERED, "good", DEADLINE_S)
    finally:
        a.stop()
    assert [e.executor_id for e in events.events if e.kind is EventKind.REGISTERED] == ["good"]


def test_stale_epoch_on_the_wire_is_failed_precondition(rm: Rm) -> None:
    _, address, events = rm
    stale = message(heartbeat=pb.HeartbeatResponse(epoch="old", instance_id="i", seq=1, payload=pb.Payload()))
    result = raw_stream(address, [register_frame("9"), stale])
    assert result.code == grpc.StatusCode.FAILED_PRECONDITION and "epoch" in result.details
    assert "registered" in result.kinds, "the registration itself was answered"
    assert events.records == []


def test_unhealthy_host_times_out_then_reregisters_when_healthy(fast_rm: Rm) -> None:
    server, address, events = fast_rm
    healthy = [True]
    polls = [0]

    def is_healthy() -> bool:
        polls[0] += 1
        return healthy[0]

    a = agent(address, "2", is_healthy=is_healthy, services=FAST)
    try:
        a.start()
        assert a.wait_registered(DEADLINE_S)
        healthy[0] = False
        events.wait_event(EventKind.HEARTBEAT_TIMEOUT, "2", DEADLINE_S)
        # Out of its session, the agent asks is_healthy() once per interval before it may register
        # again. Four more asks (one may still come from the closing session) span >= 2 intervals.
        assert wait_until(lambda: a.registration is None, DEADLINE_S)
        seen = polls[0]
        assert wait_until(lambda: polls[0] >= seen + 4, DEADLINE_S)
        assert events.find(EventKind.REREGISTERED, "2") == [] and a.registrations == 1
        assert [i.state for i in server.executors()] == ["TIMEOUT"]
        healthy[0] = True
        events.wait_event(EventKind.REREGISTERED, "2", DEADLINE_S)
        assert a.wait_registered(DEADLINE_S)
    finally:
        a.stop()


def test_rm_restart_on_the_same_port_is_followed_by_reregistration() -> None:
    first = ResourceManagerServer(FAST, secret=SECRET)
    address = first.start()
    port = int(address.rsplit(":", 1)[1])
    a = agent(address, "3")
    second: ResourceManagerServer | None = None
    try:
        a.start()
        assert a.wait_registered(DEADLINE_S)
        old = a.registration
        first.stop(grace_s=0.1)
        second = ResourceManagerServer(FAST, secret=SECRET, port=port, known_executors=["3"])
        events = Collector()
        second.subscribe(events)
        assert second.start() == address
        event = events.wait_event(EventKind.REREGISTERED, "3", DEADLINE_S)
        assert a.wait_registered(DEADLINE_S)
        assert a.registration is not None and old is not None
        assert a.registration.epoch == second.epoch != old.epoch
        assert event.instance_id == a.registration.instance_id
    finally:
        a.stop()
        first.stop()
        if second is not None:
            second.stop(grace_s=0.1)


def test_registration_deadline_without_an_rm() -> None:
    probe = ResourceManagerServer(FAST, secret=SECRET)
    address = probe.start()
    probe.stop(grace_s=0.0)
    policy = RetryPolicy(min_delay_s=0.02, max_delay_s=0.05, deadline_s=0.5, attempt_timeout_s=0.2)
    a = AgentThread(address, SECRET, "4", services=FAST, retry_policy=policy)
    try:
        a.start()
        assert not a.wait_registered(5.0)
        assert isinstance(a.error, RegistrationTimeoutError)
        assert address in str(a.error)
    finally:
        a.stop()


def test_list_executors_shows_the_rm_view_to_secret_holders_only(rm: Rm) -> None:
    import os

    _server, address, events = rm
    a = agent(address, "7")
    try:
        a.start()
        assert a.wait_registered(DEADLINE_S)
        assert events.wait_for(lambda: len(events.records) >= 1, DEADLINE_S)
        (status,) = list_executors(address, SECRET)
        assert status.executor_id == "7" and status.state == "RUNNING"
        assert status.pid == os.getpid()  # the agent runs in this process here
        assert a.registration is not None and status.instance_id == a.registration.instance_id
        assert status.last_rtt_ms is not None and status.last_heartbeat is not None
        with pytest.raises(HeartbeatAuthenticationError):
            list_executors(address, "not-the-secret")
    finally:
        a.stop()
    assert [s.state for s in list_executors(address, SECRET)] == ["UNREGISTERED"]


def test_a_newer_registration_of_the_same_id_stops_the_older_agent_for_good(
    rm: Rm, caplog: pytest.LogCaptureFixture
) -> None:
    server, address, events = rm
    older, newer = agent(address, "dup"), agent(address, "dup")
    try:
        with caplog.at_level(logging.WARNING):
            older.start()
            assert older.wait_registered(DEADLINE_S)
            events.wait_event(EventKind.REGISTERED, "dup", DEADLINE_S)
            newer.start()
            assert newer.wait_registered(DEADLINE_S)
            assert wait_until(lambda: older.error is not None, DEADLINE_S), "the replaced agent did not stop"
            assert not older.wait_registered(5.0), "it gave up instead of registering again"
            assert newer.registration is not None
            instance = newer.registration.instance_id
            replaced = events.wait_event(EventKind.REREGISTERED, "dup", DEADLINE_S)
            assert replaced.instance_id == instance

            # Several intervals later, counted by the new registration's answered heartbeats:
            # 4 more answers span >= 3 intervals, and nothing changed hands meanwhile.
            def answered() -> int:
                return sum(1 for r in events.records if r.instance_id == instance)

            seen = answered()
            assert events.wait_for(lambda: answered() >= seen + 4, DEADLINE_S)
            assert [e.kind for e in events.events] == [EventKind.REGISTERED, EventKind.REREGISTERED]
            assert older.registrations == newer.registrations == 1
            [info] = server.executors()
            assert info.state == "RUNNING" and info.instance_id == instance
            assert newer.registration is not None and newer.registration.instance_id == instance
        assert isinstance(older.error, RegistrationReplacedError)
        # Every ERROR of any logger. (gRPC's client can report the RM's ALREADY_EXISTS as INTERNAL
        # when an answer's write races it: the older then logs a lost RM at WARNING, and the RM
        # refuses its resumption with the same words, proven: see the next test.)
        [line] = [r for r in caplog.records if r.levelno >= logging.ERROR]
        message = line.getMessage()
        assert line.levelno == logging.ERROR and line.name == "heartbeat.agent.core"
        assert "agent dup stops" in message and "replaced by a newer one" in message and instance in message
        assert "same executor id" in message and "\n" not in message and line.exc_info is None
    finally:
        older.stop()
        newer.stop()
    events.wait_event(EventKind.UNREGISTERED, "dup", DEADLINE_S)
    assert [s.state for s in list_executors(address, SECRET)] == ["UNREGISTERED"]


def test_an_agent_resuming_a_replaced_registration_is_refused_for_good_and_the_newer_one_runs_on(
    rm: Rm,
) -> None:
    """The replaced agent that did not hear why (its stream ended with another status) registers
    again, resuming its instance: the RM refuses it with ALREADY_EXISTS and a proof, which the agent
    takes as final at once (not retried until its deadline), and the newer registration is kept."""
    server, address, events = rm
    older, newer = agent(address, "dup"), agent(address, "dup")
    try:
        older.start()
        assert older.wait_registered(DEADLINE_S)
        replaced = older.registration
        assert replaced is not None
        newer.start()
        assert newer.wait_registered(DEADLINE_S)
        assert wait_until(lambda: older.error is not None, DEADLINE_S)
        assert newer.registration is not None
        instance = newer.registration.instance_id
        events.wait_event(EventKind.REREGISTERED, "dup", DEADLINE_S)

        # The older agent as it would be had it read INTERNAL instead: its last registration kept.
        late = submit(_async_agent(address, "dup")).result()
        late.core.registered(replaced.epoch, replaced.instance_id, 1000, 5000)
        started = time.monotonic()
        running = submit(late.run())
        try:
            running.result(DEADLINE_S)
        finally:
            submit(late.stop()).result(DEADLINE_S)  # a late run must not outlive the test
        assert isinstance(late.error, RegistrationReplacedError), late.error
        assert time.monotonic() - started < (RETRY.deadline_s or 0.0)  # final, not retried to the deadline
        assert "replaced by a newer one" in str(late.error) and "rm-proof" not in str(late.error)
        assert late.registrations == 0
        [info] = server.executors()
        assert info.state == "RUNNING" and info.instance_id == instance
        assert [e.kind for e in events.events] == [EventKind.REGISTERED, EventKind.REREGISTERED]
    finally:
        older.stop()
        newer.stop()
