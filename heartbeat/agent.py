"""``AsyncAgent``: an executor's agent over gRPC: registers with the RM, retrying, and serves.

The agent is a heartbeat *receiver* (Flink's TaskExecutor side). Its state and every decision
live in the transport-free ``AgentCore`` (``agent_core``); this module is the transport around
it: it opens a ``Connect`` stream, registers with bounded exponential backoff (``retry``, Flink's
``RetryingRegistration``), serves the registered stream as an ``AgentSession`` until that ends,
then registers again, until ``stop``. While the host is unhealthy it neither answers nor
registers again, so a frozen host process looks dead to the RM; when the RM says a newer
registration of the same executor id replaced ours, the agent stops for good
(``RegistrationReplacedError`` in ``error``).

``AsyncAgent`` runs on an asyncio loop (many can share one loop, as the benchmark does);
``AgentThread`` (``agent_thread``) runs one on the shared heartbeat loop for sync callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import cast

import grpc
import grpc.aio

from ._grpc_compat import EOF
from ._proto import heartbeat_pb2 as pb
from ._wire import CONNECT_METHOD, SECRET_METADATA_KEY, message_size_options
from .agent_core import AgentCore, Registration, error_for_status
from .agent_session import AgentSession, status_name
from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    ClosedError,
    HeartbeatError,
    HeartbeatRpcError,
    MalformedMessageError,
    RegistrationError,
)
from .payload import PayloadProvider
from .retry import RetryPolicy, retry_until_deadline
from .scheduler import Scheduler
from .services import HeartbeatServices

log = logging.getLogger(__name__)

__all__ = ["AsyncAgent"]


class AsyncAgent:
    """One executor's agent on the current event loop; ``run`` until ``stop``."""

    def __init__(
        self,
        rm_address: str,
        secret: str,
        executor_id: str,
        host: str = "127.0.0.1",
        services: HeartbeatServices | None = None,
        payload_providers: Sequence[PayloadProvider] = (),
        is_healthy: Callable[[], bool] = lambda: True,
        retry_policy: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        on_registered: Callable[[Registration], None] | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.core = AgentCore(
            executor_id,
            services=services,
            clock=clock,
            host=host,
            payload_providers=payload_providers,
            is_healthy=is_healthy,
            on_registered=on_registered,
        )
        self.rm_address = rm_address
        self.retry_policy = retry_policy or RetryPolicy()
        self.scheduler = scheduler
        self._secret = secret
        self._session: AgentSession | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stop_reason = "agent stopped"

    @property
    def executor_id(self) -> str:
        return self.core.executor_id

    @property
    def registration(self) -> Registration | None:
        """``(epoch, instance_id)`` of the live registration, or None."""
        return self.core.registration

    @property
    def registrations(self) -> int:
        """How many times the agent registered (re-registrations included)."""
        return self.core.registrations

    @property
    def error(self) -> HeartbeatError | None:
        """The sticky error that ended ``run`` (e.g. ``RegistrationTimeoutError``), if any."""
        return self.core.error

    async def run(self) -> None:
        """Register, serve, re-register, until ``stop``, a non-retryable registration error, or a
        newer registration of our executor id (the error is kept in ``error``)."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping:
                await self._wait_until_healthy()
                self._session = await retry_until_deadline(
                    self._open_session, self.retry_policy, self.core.clock, self.rm_address, self._sleep
                )
                if self._stopping:
                    await self._session.close(True, 1.0, self._stop_reason)
                    break
                reason = await self._session.serve()
                log.info("agent %s: %s", self.executor_id, reason)
                final = self.core.final_error
                await self._session.close(self._stopping, 1.0, self._stop_reason)
                self._session = None
                if final is not None and not self._stopping:
                    raise final
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except ClosedError:
            pass
        except (RegistrationError, MalformedMessageError) as exc:
            self.core.give_up(exc)
        finally:
            self.core.end_session()
            self._done.set()

    async def stop(self, timeout_s: float = 3.0, reason: str = "agent stopped") -> None:
        """Unregister (best effort) and end ``run``; idempotent.

        ``reason`` becomes the UNREGISTERED event's detail: a host that died ("the JVM exited
        unexpectedly") must read differently from an orderly stop. A registration attempt in
        flight is allowed to finish (so the RM gets an unregister, not a timeout) unless that
        takes longer than ``timeout_s``; then it is cancelled.
        """
        if not self._stopping:
            self._stop_reason = reason
        self._stopping = True
        self._stop_event.set()
        if self._session is not None:
            self._session.end("agent stopping")
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(self._done.wait(), timeout_s)
        except TimeoutError:
            self._task.cancel()
            await self._done.wait()

    async def _sleep(self, seconds: float) -> None:
        """A backoff sleep that ``stop`` cuts short."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), seconds)
        if self._stopping:
            raise ClosedError("the agent is stopping")

    async def _wait_until_healthy(self) -> None:
        """A frozen host process must not re-register; poll until it recovers (no event exists)."""
        while not self.core.healthy():
            await self._sleep(self.core.services.interval_s)

    async def _open_session(self, timeout_s: float) -> AgentSession:
        if self._stopping:
            raise ClosedError("the agent is stopping")
        channel = grpc.aio.insecure_channel(
            self.rm_address, options=[*message_size_options(), ("grpc.use_local_subchannel_pool", 1)]
        )
        connect = channel.stream_stream(
            CONNECT_METHOD,
            request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.RmMessage.FromString,
        )
        call = connect(None, metadata=((SECRET_METADATA_KEY, self._secret),))
        request = self.core.register_request()
        register = pb.RegisterRequest(
            executor_id=request.executor_id,
            host=request.host,
            pid=request.pid,
            resume_epoch=request.resume_epoch,
            resume_instance_id=request.resume_instance_id,
        )
        try:
            await asyncio.wait_for(call.write(pb.AgentMessage(register=register)), timeout_s)
            first = await asyncio.wait_for(call.read(), timeout_s)
            if first is EOF:
                raise error_for_status(status_name(await call.code()), await call.details())
            kind = cast(pb.RmMessage, first).WhichOneof("body")
            if kind != "registered":
                raise HeartbeatRpcError(f"expected `registered`, got {kind!r}")
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            await channel.close(None)
            raise error_for_status(status_name(exc.code()), exc.details()) from exc
        except BaseException:
            call.cancel()
            await channel.close(None)
            raise
        reply = cast(pb.RmMessage, first).registered
        registration = self.core.registered(
            reply.epoch, reply.instance_id, reply.interval_ms, reply.timeout_ms
        )
        return AgentSession(self.core, channel, call, registration, self.scheduler)
