"""The TaskExecutor agent: registers with the RM, answers its heartbeat requests, watches it.

``AsyncAgent`` runs on an asyncio loop (many can share one loop, as the benchmark does);
``AgentThread`` (``agent_thread``) runs one on the shared heartbeat loop for sync callers.

The agent is a heartbeat *receiver* (Flink's TaskExecutor side): it answers each request with
its payload, and monitors the RM as a target (``agent_session``). It re-registers when the RM
falls silent for the timeout, when a request carries a new epoch, or when the RM ends the stream
with "unknown executor" / "stale". While ``is_healthy()`` is False it neither answers nor
re-registers, so a frozen host process looks dead to the RM. When the RM says a newer
registration of the same executor id replaced ours, the agent stops for good
(``RegistrationReplacedError``): registering again would replace the newer agent in turn, and
two live agents given one id would replace each other forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from typing import cast

import grpc
import grpc.aio

from ._grpc_compat import EOF
from ._proto import heartbeat_pb2 as pb
from ._wire import CONNECT_METHOD, SECRET_METADATA_KEY, message_size_options
from .agent_session import AgentSession, Registration, error_for_status
from .clock import Clock, SystemClock
from .errors import (
    ClosedError,
    HeartbeatRpcError,
    MalformedMessageError,
    RegistrationError,
    RegistrationReplacedError,
)
from .payload import PayloadProvider
from .retry import RetryPolicy, retry_until_deadline
from .scheduler import Scheduler
from .services import HeartbeatServices

log = logging.getLogger(__name__)

__all__ = ["AsyncAgent", "Registration"]


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
        clock: Clock | None = None,
        on_registered: Callable[[Registration], None] | None = None,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.rm_address = rm_address
        self.scheduler = scheduler
        self.executor_id = executor_id
        self.host = host
        self.services = services or HeartbeatServices()
        self.payload_providers = list(payload_providers)
        self.failed_providers: set[int] = set()
        self.retry_policy = retry_policy or RetryPolicy()
        self.clock = clock or SystemClock()
        self._secret = secret
        self._is_healthy = is_healthy
        self._on_registered = on_registered
        self._session: AgentSession | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._stop_event = asyncio.Event()
        self.registration: Registration | None = None
        self.error: BaseException | None = None
        self.registrations = 0
        self._stop_reason = "agent stopped"

    def healthy(self) -> bool:
        try:
            return bool(self._is_healthy())
        except Exception:
            log.warning("is_healthy() raised; treating the executor as unhealthy", exc_info=True)
            return False

    async def run(self) -> None:
        """Register, serve, re-register, until ``stop``, a non-retryable registration error, or a
        newer registration of our executor id (the error is kept in ``error``)."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping:
                await self._wait_until_healthy()
                self._session = await retry_until_deadline(
                    self._open_session, self.retry_policy, self.clock, self.rm_address, self._sleep
                )
                if self._stopping:
                    await self._session.close(True, 1.0, self._stop_reason)
                    break
                self.registration = self._session.registration
                self.registrations += 1
                if self._on_registered is not None:
                    self._on_registered(self.registration)
                reason = await self._session.serve()
                self.registration = None
                log.info("agent %s: %s", self.executor_id, reason)
                rm_error = self._session.rm_error
                await self._session.close(self._stopping, 1.0, self._stop_reason)
                self._session = None
                if isinstance(rm_error, RegistrationReplacedError) and not self._stopping:
                    raise rm_error
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except ClosedError:
            pass
        except RegistrationReplacedError as exc:
            self.error = exc
            log.error("agent %s stops: %s", self.executor_id, exc)
        except RegistrationError as exc:
            self.error = exc
            log.error("agent %s gives up: %s", self.executor_id, exc)
        except MalformedMessageError as exc:
            self.error = exc
            log.error("agent %s was refused by the RM: %s", self.executor_id, exc)
        finally:
            self.registration = None
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
        while not self.healthy():
            await self._sleep(self.services.interval_s)

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
        previous = self._last_registration
        register = pb.RegisterRequest(
            executor_id=self.executor_id,
            host=self.host,
            pid=os.getpid(),
            resume_epoch=previous.epoch if previous else "",
            resume_instance_id=previous.instance_id if previous else "",
        )
        try:
            await asyncio.wait_for(call.write(pb.AgentMessage(register=register)), timeout_s)
            first = await asyncio.wait_for(call.read(), timeout_s)
            if first is EOF:
                raise error_for_status(await call.code(), await call.details())
            kind = cast(pb.RmMessage, first).WhichOneof("body")
            if kind != "registered":
                raise HeartbeatRpcError(f"expected `registered`, got {kind!r}")
        except grpc.aio.AioRpcError as exc:
            call.cancel()
            await channel.close(None)
            raise error_for_status(exc.code(), exc.details()) from exc
        except BaseException:
            call.cancel()
            await channel.close(None)
            raise
        reply = cast(pb.RmMessage, first).registered
        registration = Registration(reply.epoch, reply.instance_id)
        self._last_registration = registration
        return AgentSession(self, channel, call, registration, self._rm_services(reply))

    def _rm_services(self, reply: pb.RegisterResponse) -> HeartbeatServices:
        """Watch the RM with the interval/timeout it announced: they are the RM's, not ours."""
        try:
            return HeartbeatServices(
                reply.interval_ms / 1000.0, reply.timeout_ms / 1000.0, self.services.rpc_failure_threshold
            )
        except ValueError:
            return self.services

    _last_registration: Registration | None = None
