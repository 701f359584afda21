"""One registered stream seen from the agent (Flink's ``RegisteredRpcConnection``), over grpc.aio.

The session is transport only: it hands each heartbeat request of the RM to the ``AgentCore``,
writes the answers the core sends down its ``RmLink`` (this object), and reports how the stream
ended. The core decides everything else (answer or not, when the session ends and what the RM's
status means). ``serve`` returns why the session ended; ``close`` leaves, telling the RM why.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

import grpc
import grpc.aio

from heartbeat.agent.core import AgentCore, Registration
from heartbeat.payload import Payload
from heartbeat.scheduler import LoopScheduler, Scheduler
from heartbeat.wire.codec import payload_to_proto
from heartbeat.wire.grpc_compat import EOF
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import clean_reason

log = logging.getLogger(__name__)


def status_name(code: grpc.StatusCode | None) -> str | None:
    """A gRPC status by name, the form ``AgentCore`` reads."""
    return None if code is None else code.name


class AgentSession:
    """One registered stream; ``serve`` returns why it ended. The core's ``RmLink`` for it."""

    def __init__(
        self,
        core: AgentCore,
        channel: grpc.aio.Channel,
        call: Any,
        registration: Registration,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.core = core
        self.channel = channel
        self.call = call
        self.registration = registration
        loop = asyncio.get_running_loop()
        self._scheduler = scheduler or LoopScheduler(loop)
        self._outbox: collections.deque[pb.AgentMessage] = collections.deque()
        self._ended: asyncio.Future[str] = loop.create_future()
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    # ---- RmLink ---------------------------------------------------------------------------

    def send_heartbeat(self, epoch: str, instance_id: str, seq: int, payload: Payload) -> None:
        answer = pb.HeartbeatResponse(
            epoch=epoch, instance_id=instance_id, seq=seq, payload=payload_to_proto(payload)
        )
        self._outbox.append(pb.AgentMessage(heartbeat=answer))

    def end(self, reason: str) -> None:
        if not self._ended.done():
            self._ended.set_result(reason)

    # ---- serving --------------------------------------------------------------------------

    async def serve(self) -> str:
        self.core.start_session(self, self._scheduler)
        self._reader = asyncio.create_task(self._read_loop())
        try:
            return await self._ended
        finally:
            self.core.end_session()

    async def close(self, unregister: bool, timeout_s: float, reason: str = "agent stopped") -> None:
        """Drop the stream and its channel; first tell the RM we leave, and why, if ``unregister``.

        The reader keeps running until the RM ends the stream: cancelling a pending grpc.aio
        read cancels the whole call, which would lose the unregister message.
        """
        try:
            if unregister:
                epoch, instance_id = self.registration
                bye = pb.UnregisterRequest(epoch=epoch, instance_id=instance_id, reason=clean_reason(reason))
                await asyncio.wait_for(self._write(pb.AgentMessage(unregister=bye)), timeout_s)
                await asyncio.wait_for(self.call.done_writing(), timeout_s)
                await asyncio.wait_for(self.call.code(), timeout_s)
        except Exception as exc:
            log.debug("unregister of %s failed: %r", self.core.executor_id, exc)
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
        try:
            while True:
                message = await self.call.read()
                if message is EOF:
                    self.core.rm_closed_stream(status_name(await self.call.code()), await self.call.details())
                    return
                body = message.WhichOneof("body")
                if body == "kill_host" and not self._ended.done():  # the RM's last word
                    kill = message.kill_host
                    self.core.on_kill_host(kill.epoch, kill.instance_id, kill.reason)
                    continue
                if body != "heartbeat_request" or self._ended.done():
                    continue
                request = message.heartbeat_request
                self.core.on_heartbeat_request(request.epoch, request.instance_id, request.seq)
                if self._ended.done():  # the request came from a restarted RM
                    return
                while self._outbox:
                    await self._write(self._outbox.popleft())
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:  # the stream ended with a non-OK status
            self.core.rm_closed_stream(status_name(exc.code()), exc.details(), failed=True)
        except Exception as exc:
            self.core.stream_broke(exc)
