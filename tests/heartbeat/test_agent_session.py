"""The agent's transport for one registered stream, over a fake call and a manual clock.

The decisions themselves are the core's (``test_agent_core.py``); these tests check that the
session carries requests in, answers and unregisters out, and reports how the stream ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import pytest

from heartbeat import (
    AgentCore,
    HeartbeatRpcError,
    HeartbeatServices,
    ManualScheduler,
    Registration,
    RegistrationReplacedError,
    UnknownExecutorError,
    static_provider,
)
from heartbeat.agent.session import AgentSession
from heartbeat.wire.grpc_compat import EOF
from heartbeat.wire.proto import heartbeat_pb2 as pb

SERVICES = HeartbeatServices(interval_s=1.0, timeout_s=3.0, rpc_failure_threshold=2)
REG = Registration("epoch-1", "instance-1")


class FakeCall:
    """Stands in for a grpc.aio stream call: the test feeds reads and inspects writes."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[object] = asyncio.Queue()
        self.written: list[pb.AgentMessage] = []
        self.status: tuple[grpc.StatusCode, str] = (grpc.StatusCode.OK, "")
        self.done_writing_called = False
        self.cancelled = False

    async def done_writing(self) -> None:
        self.done_writing_called = True

    def cancel(self) -> None:
        self.cancelled = True

    async def read(self) -> object:
        item = await self.inbox.get()
        if isinstance(item, BaseException):
            raise item
        return item

    async def write(self, message: pb.AgentMessage) -> None:
        self.written.append(message)

    async def code(self) -> grpc.StatusCode:
        return self.status[0]

    async def details(self) -> str:
        return self.status[1]

    def request(self, seq: int, epoch: str = REG.epoch, instance_id: str = REG.instance_id) -> None:
        req = pb.HeartbeatRequest(epoch=epoch, instance_id=instance_id, seq=seq)
        self.inbox.put_nowait(pb.RmMessage(heartbeat_request=req))

    def end(self, code: grpc.StatusCode, details: str) -> None:
        self.status = (code, details)
        self.inbox.put_nowait(EOF)

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """End with a non-OK status the way grpc.aio reports it: ``read`` raises."""
        self.status = (code, details)
        empty = grpc.aio.Metadata()
        self.inbox.put_nowait(grpc.aio.AioRpcError(code, empty, empty, details, None))


class FakeChannel:
    def __init__(self) -> None:
        self.closed = False

    async def close(self, grace: float | None) -> None:
        self.closed = True


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop (no real waiting) until ``condition`` holds."""
    for _ in range(100):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def run_session(
    scenario: Callable[[FakeCall, ManualScheduler, AgentSession, Any], Any],
    healthy: Callable[[], bool] = lambda: True,
    sessions: list[AgentSession] | None = None,
) -> str:
    async def main() -> str:
        scheduler = ManualScheduler()
        core = AgentCore(
            "exec-1",
            services=SERVICES,
            clock=scheduler.clock,
            payload_providers=[static_provider({"slots_total": 2, "queue.depth": 3.0})],
            is_healthy=healthy,
        )
        interval_ms, timeout_ms = round(SERVICES.interval_s * 1000), round(SERVICES.timeout_s * 1000)
        assert core.registered(REG.epoch, REG.instance_id, interval_ms, timeout_ms) == REG
        call = FakeCall()
        session = AgentSession(core, FakeChannel(), call, REG, scheduler)  # type: ignore[arg-type]
        if sessions is not None:
            sessions.append(session)
        task = asyncio.create_task(session.serve())
        await scenario(call, scheduler, session, task)
        return await asyncio.wait_for(task, 5.0)

    return asyncio.run(main())


def test_requests_are_answered_with_seq_and_payload() -> None:
    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        call.request(1)
        call.request(2)
        await until(lambda: len(call.written) == 2)
        answers = [m.heartbeat for m in call.written]
        assert [a.seq for a in answers] == [1, 2]
        assert answers[0].epoch == REG.epoch and answers[0].instance_id == REG.instance_id
        assert answers[0].payload.slots_total == 2 and answers[0].payload.metrics["queue.depth"] == 3.0
        assert answers[0].payload.rss_bytes == -1
        session.end("done")

    assert run_session(scenario) == "done"


def test_rm_silence_for_the_timeout_ends_the_session() -> None:
    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        await until(lambda: scheduler.pending() > 0)
        scheduler.advance(2.0)
        call.request(1)
        await until(lambda: len(call.written) == 1)
        scheduler.advance(2.9)
        await asyncio.sleep(0)
        assert not task.done(), "a request 2.9 s ago is within the 3 s timeout"
        scheduler.advance(0.1)

    assert "no heartbeat request from the RM" in run_session(scenario)


def test_a_new_rm_epoch_ends_the_session_for_re_registration() -> None:
    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        call.request(1, epoch="epoch-2")

    reason = run_session(scenario)
    assert "restarted" in reason and "epoch-2" in reason


def test_unknown_executor_status_ends_the_session() -> None:
    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        call.end(grpc.StatusCode.NOT_FOUND, "unknown executor; register again")

    assert "UnknownExecutorError" in run_session(scenario)


def test_unhealthy_host_process_means_no_answers_and_stale_requests_are_ignored() -> None:
    healthy = [False]

    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        call.request(1)
        call.request(2, instance_id="instance-0")
        await until(lambda: call.inbox.empty())
        await asyncio.sleep(0)
        assert call.written == []
        healthy[0] = True
        call.request(3)
        await until(lambda: len(call.written) == 1)
        assert call.written[0].heartbeat.seq == 3
        session.end("done")

    assert run_session(scenario, healthy=lambda: healthy[0]) == "done"


@pytest.mark.parametrize("how", ["read raises", "read returns EOF"])
@pytest.mark.parametrize(
    ("code", "error"),
    [
        (grpc.StatusCode.ALREADY_EXISTS, RegistrationReplacedError),
        (grpc.StatusCode.NOT_FOUND, UnknownExecutorError),
        (grpc.StatusCode.UNAVAILABLE, HeartbeatRpcError),
    ],
)
def test_the_status_that_ended_the_stream_is_kept_typed(
    how: str, code: grpc.StatusCode, error: type[Exception]
) -> None:
    sessions: list[AgentSession] = []

    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        (call.fail if how == "read raises" else call.end)(
            code, "registration i-1 was replaced by a newer one"
        )

    reason = run_session(scenario, sessions=sessions)
    [session] = sessions
    assert type(session.core.rm_error) is error and error.__name__ in reason
    assert error is not RegistrationReplacedError or "own executor id" in str(session.core.rm_error)
    assert (session.core.final_error is not None) == (error is RegistrationReplacedError)
    assert session.core.registration is None, "nothing is live once the session ended"


@pytest.mark.parametrize("unregister", [True, False])
def test_close_tells_the_rm_why_we_leave_only_when_unregistering(unregister: bool) -> None:
    sessions: list[AgentSession] = []

    async def scenario(call: FakeCall, scheduler: ManualScheduler, session: AgentSession, task: Any) -> None:
        session.end("agent stopping")
        await task
        await session.close(unregister, 1.0, "the JVM exited unexpectedly")
        assert call.cancelled and session.channel.closed  # type: ignore[attr-defined]
        assert call.done_writing_called is unregister

    assert run_session(scenario, sessions=sessions) == "agent stopping"
    [session] = sessions
    written = session.call.written
    if unregister:
        [message] = written
        bye = message.unregister
        assert (bye.epoch, bye.instance_id, bye.reason) == (*REG, "the JVM exited unexpectedly")
    else:
        assert written == []
