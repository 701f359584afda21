"""One registered stream seen from the agent (Flink's ``RegisteredRpcConnection`` + RM monitor).

The session answers the RM's heartbeat requests through a receiver ``HeartbeatManager`` that
monitors the RM as its target, and ends (returning why) when the RM falls silent for the
timeout, a request carries a new epoch, or the RM ends the stream (its status is kept in
``rm_error``: ``RegistrationReplacedError`` there means the agent must stop, not re-register).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc
import grpc.aio

from ._grpc_compat import EOF
from ._proto import heartbeat_pb2 as pb
from ._wire import payload_to_proto
from .errors import (
    HeartbeatAuthenticationError,
    HeartbeatRpcError,
    MalformedMessageError,
    RegistrationReplacedError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from .manager import HeartbeatManager
from .payload import Payload, collect_payload
from .scheduler import LoopScheduler
from .services import HeartbeatServices

if TYPE_CHECKING:
    from .agent import AsyncAgent

log = logging.getLogger(__name__)

RM_TARGET_ID = "resource-manager"


class Registration(NamedTuple):
    epoch: str
    instance_id: str


def error_for_status(code: grpc.StatusCode | None, details: str | None) -> Exception:
    """Map a gRPC status that ended a stream onto the package's exception tree."""
    text = details or (code.name if code is not None else "stream ended")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return HeartbeatAuthenticationError(f"the RM rejected our secret: {text}")
    if code == grpc.StatusCode.NOT_FOUND:
        return UnknownExecutorError(text)
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return RegistrationReplacedError(
            f"{text}: another live agent registered with the same executor id and the newer one wins; "
            "this agent stops instead of replacing it back (give every agent its own executor id)"
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return StaleEpochError(text) if "epoch" in text else StaleInstanceError(text)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return MalformedMessageError(text)
    return HeartbeatRpcError(text)


class AgentSession:
    """One registered stream; ``serve`` returns why it ended. Also the RM-monitor's listener."""

    def __init__(
        self,
        agent: AsyncAgent,
        channel: grpc.aio.Channel,
        call: Any,
        registration: Registration,
        services: HeartbeatServices | None = None,
    ) -> None:
        self.services = services or agent.services
        self.agent = agent
        self.channel = channel
        self.call = call
        self.registration = registration
        self.rm_error: Exception | None = None  # the status the RM ended the stream with, if it did
        self._outbox: collections.deque[pb.AgentMessage] = collections.deque()
        self._seq = 0
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.manager: HeartbeatManager[None, Payload] = self.services.create_heartbeat_manager(
            agent.executor_id, self, agent.scheduler or LoopScheduler(asyncio.get_running_loop()), agent.clock
        )

    def end(self, reason: str) -> None:
        if not self._ended.done():
            self._ended.set_result(reason)

    async def serve(self) -> str:
        self.manager.monitor_target(RM_TARGET_ID, self)
        self._reader = asyncio.create_task(self._read_loop())
        try:
            return await self._ended
        finally:
            self.manager.stop()

    async def close(self, unregister: bool, timeout_s: float, reason: str = "agent stopped") -> None:
        """Drop the stream and its channel; first tell the RM we leave, and why, if ``unregister``.

        The reader keeps running until the RM ends the stream: cancelling a pending grpc.aio
        read cancels the whole call, which would lose the unregister message.
        """
        try:
            if unregister:
                epoch, instance_id = self.registration
                bye = pb.UnregisterRequest(epoch=epoch, instance_id=instance_id, reason=reason)
                await asyncio.wait_for(self._write(pb.AgentMessage(unregister=bye)), timeout_s)
                await asyncio.wait_for(self.call.done_writing(), timeout_s)
                await asyncio.wait_for(self.call.code(), timeout_s)
        except Exception as exc:
            log.debug("unregister of %s failed: %r", self.agent.executor_id, exc)
        finally:
            self.call.cancel()
            if self._reader is not None:
                self._reader.cancel()
                await asyncio.gather(self._reader, return_exceptions=True)
            await self.channel.close(None)

    async def _write(self, message: pb.AgentMessage) -> None:
        async with self._write_lock:
            await self.call.write(message)

    async def _read_loop(self) -> None:
        epoch, instance_id = self.registration
        try:
            while True:
                message = await self.call.read()
                if message is EOF:
                    self.rm_error = error_for_status(await self.call.code(), await self.call.details())
                    self.end(f"the RM ended the stream: {self.rm_error!r}")
                    return
                if message.WhichOneof("body") != "heartbeat_request" or self._ended.done():
                    continue
                request = message.heartbeat_request
                if request.epoch != epoch:
                    self.end(f"the RM restarted (epoch {request.epoch} replaces {epoch})")
                    return
                if request.instance_id != instance_id or not self.agent.healthy():
                    continue
                self._seq = request.seq
                self.manager.request_heartbeat(RM_TARGET_ID, None)
                while self._outbox:
                    await self._write(self._outbox.popleft())
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:  # the stream ended with a non-OK status
            self.rm_error = error_for_status(exc.code(), exc.details())
            self.manager.report_rpc_failure(RM_TARGET_ID)
            self.end(f"the stream to the RM ended: {self.rm_error!r}")
        except Exception as exc:
            self.manager.report_rpc_failure(RM_TARGET_ID)
            self.end(f"the stream to the RM broke: {exc!r}")

    # HeartbeatTarget: the RM as seen from the agent.
    def receive_heartbeat(self, heartbeat_origin: str, payload: Payload) -> None:
        epoch, instance_id = self.registration
        answer = pb.HeartbeatResponse(
            epoch=epoch, instance_id=instance_id, seq=self._seq, payload=payload_to_proto(payload)
        )
        self._outbox.append(pb.AgentMessage(heartbeat=answer))

    def request_heartbeat(self, request_origin: str, payload: Payload) -> None:
        """The agent never requests; the RM is the sender."""

    # HeartbeatListener for the RM target.
    def notify_heartbeat_timeout(self, target_id: str) -> None:
        self.end(f"no heartbeat request from the RM for {self.services.timeout_s:g} s")

    def notify_target_unreachable(self, target_id: str) -> None:
        self.end("answers to the RM kept failing")

    def report_payload(self, target_id: str, payload: None) -> None:
        """Requests carry no payload."""

    def retrieve_payload(self, target_id: str) -> Payload:
        return collect_payload(self.agent.payload_providers, self.agent.failed_providers)
