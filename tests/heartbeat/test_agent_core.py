"""The agent core without transport: registration, answers, the RM monitor, stream ends, payload.

Driven by a ``ManualScheduler`` (and its ``ManualClock``) with a fake link: no gRPC, no event
loop, no waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pytest

from heartbeat import (
    AgentCore,
    HeartbeatAuthenticationError,
    HeartbeatError,
    HeartbeatRpcError,
    HeartbeatServices,
    MalformedMessageError,
    ManualScheduler,
    Payload,
    PayloadProvider,
    Registration,
    RegistrationReplacedError,
    RegistrationTimeoutError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
    static_provider,
)
from heartbeat.agent.core import RegisterRequest, error_for_status

from .fakes import FakeRmLink

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=3.0, rpc_failure_threshold=2)
EPOCH, INSTANCE = "epoch-1", "instance-1"


class Agent:
    """A core on a manual scheduler, registered and serving a fake link, unless told otherwise."""

    def __init__(
        self,
        *,
        serve: bool = True,
        services: HeartbeatServices = SERVICES,
        announced_ms: tuple[int, int] = (1000, 3000),
        is_healthy: Callable[[], bool] = lambda: True,
        providers: Sequence[PayloadProvider] = (static_provider({"slots_total": 2, "queue.depth": 3.0}),),
    ) -> None:
        self.scheduler = ManualScheduler()
        self.announced: list[Registration] = []
        self.core = AgentCore(
            "exec-1",
            services=services,
            clock=self.scheduler.clock,
            host="host-a",
            pid=4242,
            payload_providers=providers,
            is_healthy=is_healthy,
            on_registered=self.announced.append,
        )
        self.link = FakeRmLink()
        if serve:
            self.core.registered(EPOCH, INSTANCE, *announced_ms)
            self.core.start_session(self.link, self.scheduler)

    def request(self, seq: int, epoch: str = EPOCH, instance_id: str = INSTANCE) -> None:
        self.core.on_heartbeat_request(epoch, instance_id, seq)


def test_the_first_register_request_names_the_agent_and_resumes_nothing() -> None:
    agent = Agent(serve=False)
    assert agent.core.register_request() == RegisterRequest("exec-1", "host-a", 4242, "", "")
    assert agent.core.registration is None and agent.core.registrations == 0


def test_a_registration_goes_live_with_its_session_and_is_resumed_after_it() -> None:
    agent = Agent(serve=False)
    registration = agent.core.registered(EPOCH, INSTANCE, 1000, 3000)
    assert registration == Registration(EPOCH, INSTANCE)
    assert agent.core.registration is None and agent.announced == [], "accepted is not live yet"
    assert agent.core.register_request().resume_instance_id == INSTANCE, "a reconnect resumes it"

    agent.core.start_session(agent.link, agent.scheduler)
    assert agent.core.registration == registration and agent.core.registrations == 1
    assert agent.announced == [registration]
    agent.core.end_session()
    assert agent.core.registration is None
    request = agent.core.register_request()
    assert (request.resume_epoch, request.resume_instance_id) == (EPOCH, INSTANCE)

    agent.core.registered("epoch-2", "instance-2", 1000, 3000)
    agent.core.start_session(FakeRmLink(), agent.scheduler)
    assert agent.core.registrations == 2 and agent.announced[-1] == Registration("epoch-2", "instance-2")


def test_a_session_needs_an_accepted_registration_and_runs_one_at_a_time() -> None:
    agent = Agent(serve=False)
    with pytest.raises(RuntimeError, match="accepted none"):
        agent.core.start_session(agent.link, agent.scheduler)
    agent.core.registered(EPOCH, INSTANCE, 1000, 3000)
    agent.core.start_session(agent.link, agent.scheduler)
    with pytest.raises(RuntimeError, match="already"):
        agent.core.start_session(FakeRmLink(), agent.scheduler)


def test_requests_are_answered_with_their_seq_our_registration_and_the_payload() -> None:
    agent = Agent()
    agent.request(7)
    agent.request(8)
    assert [(e, i, s) for e, i, s, _ in agent.link.answers] == [(EPOCH, INSTANCE, 7), (EPOCH, INSTANCE, 8)]
    payload = agent.link.answers[0][3]
    assert payload == Payload(slots_total=2, metrics={"queue.depth": 3.0})
    assert agent.link.ended == []


def test_rm_silence_for_its_timeout_ends_the_session_once() -> None:
    agent = Agent()
    agent.scheduler.advance(2.0)
    agent.request(1)
    agent.scheduler.advance(2.9)
    assert agent.link.ended == [], "a request 2.9 s ago is within the 3 s timeout"
    agent.scheduler.advance(0.1)
    assert agent.link.ended == ["no heartbeat request from the RM for 3 s"]
    agent.scheduler.advance(30.0)
    assert len(agent.link.ended) == 1


def test_the_rm_is_watched_with_the_timeout_it_announced() -> None:
    agent = Agent(announced_ms=(2000, 10_000))
    assert agent.core.rm_services == HeartbeatServices(2.0, 10.0, SERVICES.rpc_failure_threshold)
    agent.scheduler.advance(9.9)
    assert agent.link.ended == [], "the RM's 10 s timeout rules, not our own 3 s"
    agent.scheduler.advance(0.1)
    assert agent.link.ended == ["no heartbeat request from the RM for 10 s"]


def test_an_unusable_announcement_leaves_our_own_settings() -> None:
    agent = Agent(announced_ms=(0, 0))
    assert agent.core.rm_services == SERVICES
    agent.scheduler.advance(3.0)
    assert agent.link.ended == ["no heartbeat request from the RM for 3 s"]


def test_a_request_with_a_new_epoch_ends_the_session_unanswered() -> None:
    agent = Agent()
    agent.request(1, epoch="epoch-2")
    assert agent.link.answers == []
    [reason] = agent.link.ended
    assert "restarted" in reason and "epoch-2" in reason and EPOCH in reason


def test_requests_for_an_older_instance_are_ignored_and_do_not_keep_the_session() -> None:
    agent = Agent()
    for second in range(3):
        agent.scheduler.advance(1.0)
        agent.request(second, instance_id="instance-0")
    assert agent.link.answers == []
    assert agent.link.ended == ["no heartbeat request from the RM for 3 s"]


def test_an_unhealthy_host_does_not_answer_until_it_recovers() -> None:
    healthy = [False]
    agent = Agent(is_healthy=lambda: healthy[0])
    agent.request(1)
    assert agent.link.answers == []
    healthy[0] = True
    agent.request(2)
    assert [seq for _, _, seq, _ in agent.link.answers] == [2]


def test_a_raising_health_check_counts_as_unhealthy(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> bool:
        raise RuntimeError("pulse file unreadable")

    agent = Agent(is_healthy=broken)
    with caplog.at_level(logging.WARNING):
        assert not agent.core.healthy()
        agent.request(1)
    assert agent.link.answers == []
    assert any("unhealthy" in r.getMessage() for r in caplog.records)


def test_a_failing_provider_is_skipped_logged_once_and_remembered(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> dict[str, float]:
        raise RuntimeError("metrics backend down")

    agent = Agent(providers=(static_provider({"slots_total": 4}), broken, static_provider({"m": 1.0})))
    with caplog.at_level(logging.WARNING):
        agent.request(1)
        agent.request(2)
    assert [a[3] for a in agent.link.answers] == [Payload(slots_total=4, metrics={"m": 1.0})] * 2
    assert agent.core.failed_providers == frozenset({1})
    assert sum("failed; skipping it" in r.getMessage() for r in caplog.records) == 1


def test_an_answer_that_cannot_be_sent_is_a_failed_rpc() -> None:
    agent = Agent(services=HeartbeatServices(1.0, 3.0, 1))
    agent.link.broken = True
    agent.request(1)
    assert agent.link.ended == ["answers to the RM kept failing"]


def test_each_request_proves_the_rm_alive_so_failures_count_between_requests_only() -> None:
    """A request resets the RM's monitor, failures included: the next failed answer starts at 1."""
    agent = Agent()
    agent.link.broken = True
    for seq in range(5):
        agent.request(seq)
    assert agent.link.ended == [], "threshold 2 is never reached with a request between failures"
    agent.core.stream_broke(OSError("write failed"))
    assert agent.link.ended[0] == "answers to the RM kept failing", "the second failure in a row"


@pytest.mark.parametrize(
    ("status", "details", "error"),
    [
        ("UNAUTHENTICATED", "missing or wrong secret", HeartbeatAuthenticationError),
        ("NOT_FOUND", "heartbeat timeout: register again", UnknownExecutorError),
        ("ALREADY_EXISTS", "registration i-1 was replaced", RegistrationReplacedError),
        ("FAILED_PRECONDITION", "epoch 'e0' is not the RM's current epoch", StaleEpochError),
        ("FAILED_PRECONDITION", "this stream was replaced by a resumed one", StaleInstanceError),
        ("INVALID_ARGUMENT", "malformed AgentMessage", MalformedMessageError),
        ("RESOURCE_EXHAUSTED", "message larger than max", MalformedMessageError),
        ("UNAVAILABLE", "connection refused", HeartbeatRpcError),
        ("OK", "", HeartbeatRpcError),
        (None, None, HeartbeatRpcError),
    ],
)
def test_a_status_maps_onto_the_exception_tree(
    status: str | None, details: str | None, error: type[HeartbeatError]
) -> None:
    mapped = error_for_status(status, details)
    assert type(mapped) is error
    assert (details or status or "stream ended") in str(mapped)


def test_the_replaced_error_tells_the_operator_what_to_do() -> None:
    assert "give every agent its own executor id" in str(error_for_status("ALREADY_EXISTS", "x"))


@pytest.mark.parametrize("failed", [False, True])
@pytest.mark.parametrize(
    ("status", "final"), [("ALREADY_EXISTS", True), ("NOT_FOUND", False), ("UNAVAILABLE", False)]
)
def test_how_the_rm_ended_the_stream_decides_between_registering_again_and_stopping(
    status: str, final: bool, failed: bool
) -> None:
    agent = Agent()
    agent.core.rm_closed_stream(status, "the RM says so", failed=failed)
    [reason] = agent.link.ended
    assert type(agent.core.rm_error).__name__ in reason
    assert ("ended: " if failed else "the RM ended the stream") in reason
    agent.core.end_session()
    assert (agent.core.final_error is agent.core.rm_error) if final else agent.core.final_error is None


@pytest.mark.parametrize("failed", [False, True])
def test_only_a_failed_stream_end_counts_as_a_failed_answer(failed: bool) -> None:
    """A non-OK status raised by a read is a failed RPC too (threshold 1: UNREACHABLE at once);
    a stream the RM ended in order is not."""
    agent = Agent(services=HeartbeatServices(1.0, 3.0, 1))
    agent.core.rm_closed_stream("UNAVAILABLE", "gone", failed=failed)
    unreachable = agent.link.ended[0] == "answers to the RM kept failing"
    assert unreachable is failed


def test_a_broken_stream_ends_the_session() -> None:
    agent = Agent()
    agent.core.stream_broke(ConnectionResetError("reset by peer"))
    [reason] = agent.link.ended
    assert "broke" in reason and "reset by peer" in reason
    assert agent.core.rm_error is None and agent.core.final_error is None


def test_after_the_session_ended_nothing_reaches_the_old_link() -> None:
    agent = Agent()
    agent.core.end_session()
    agent.core.end_session()  # idempotent
    agent.request(1)
    agent.core.rm_closed_stream("ALREADY_EXISTS", "late")
    agent.core.stream_broke(OSError("late"))
    agent.scheduler.advance(60.0)
    assert agent.link.answers == [] and agent.link.ended == []
    assert agent.core.rm_error is None and agent.core.final_error is None


def test_a_new_session_forgets_the_previous_ones_rm_error() -> None:
    agent = Agent()
    agent.core.rm_closed_stream("NOT_FOUND", "timed out")
    agent.core.end_session()
    assert isinstance(agent.core.rm_error, UnknownExecutorError)
    agent.core.registered(EPOCH, "instance-2", 1000, 3000)
    agent.core.start_session(FakeRmLink(), agent.scheduler)
    assert agent.core.rm_error is None


@pytest.mark.parametrize(
    ("error", "words"),
    [
        (RegistrationReplacedError("replaced by a newer one"), "stops"),
        (RegistrationTimeoutError("rm:1", 1.0, 3, None), "gives up"),
        (MalformedMessageError("executor_id must be printable"), "was refused by the RM"),
    ],
)
def test_giving_up_keeps_a_sticky_error_and_says_why_in_one_line(
    error: HeartbeatError, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = Agent(serve=False)
    with caplog.at_level(logging.WARNING):
        agent.core.give_up(error)
    assert agent.core.error is error
    [line] = caplog.records
    assert line.levelno == logging.ERROR and f"agent exec-1 {words}" in line.getMessage()
    assert "\n" not in line.getMessage()
