"""The TaskExecutor agent: registers with the RM, answers its heartbeat requests, watches it.

``AsyncAgent`` runs on an asyncio loop (many can share one loop, as the benchmark does);
``TaskExecutorAgent`` gives it a thread of its own for synchronous callers.

The agent is a heartbeat *receiver* (Flink's TaskExecutor side): it answers each request with
its payload, and monitors the RM as a target. It re-registers when the RM falls silent for the
timeout, when a request carries a new epoch, or when the RM ends the stream with "unknown
executor" / "stale". While ``is_healthy()`` is False it neither answers nor re-registers, so a
frozen host process looks dead to the RM.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import grpc
import grpc.aio

from ._grpc_compat import EOF
from ._io_loop import submit
from ._proto import heartbeat_pb2 as pb
from ._wire import CONNECT_METHOD, SECRET_METADATA_KEY, message_size_options, payload_to_proto
from .clock import Clock, MonotonicClock
from .errors import (
    AuthenticationError,
    ClosedError,
    HeartbeatRpcError,
    MalformedMessageError,
    RegistrationError,
    StaleEpochError,
    StaleInstanceError,
    UnknownExecutorError,
)
from .manager import HeartbeatManager
from .payload import Payload, PayloadProvider, collect_payload
from .retry import RetryPolicy, retry_until_deadline
from .scheduler import LoopScheduler, Scheduler
from .services import HeartbeatServices

log = logging.getLogger(__name__)

RM_TARGET_ID = "resource-manager"


class Registration(NamedTuple):
    epoch: str
    instance_id: str


def error_for_status(code: grpc.StatusCode | None, details: str | None) -> Exception:
    """Map a gRPC status that ended a stream onto the package's exception tree."""
    text = details or (code.name if code is not None else "stream ended")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return AuthenticationError(f"the RM rejected our secret: {text}")
    if code == grpc.StatusCode.NOT_FOUND:
        return UnknownExecutorError(text)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return StaleEpochError(text) if "epoch" in text else StaleInstanceError(text)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return MalformedMessageError(text)
    return HeartbeatRpcError(text)


class _Session:
    """One registered stream; ``serve`` returns why it ended. Also the RM-monitor's listener."""

    def __init__(
        self, agent: AsyncAgent, channel: grpc.aio.Channel, call: Any, registration: Registration
    ) -> None:
        self.agent = agent
        self.channel = channel
        self.call = call
        self.registration = registration
        self._outbox: collections.deque[pb.AgentMessage] = collections.deque()
        self._seq = 0
        self._ended: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self.manager: HeartbeatManager[None, Payload] = agent.services.create_heartbeat_manager(
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

    async def close(self, unregister: bool, timeout_s: float) -> None:
        """Drop the stream and its channel; first tell the RM we leave if ``unregister``.

        The reader keeps running until the RM ends the stream: cancelling a pending grpc.aio
        read cancels the whole call, which would lose the unregister message.
        """
        try:
            if unregister:
                epoch, instance_id = self.registration
                bye = pb.UnregisterRequest(epoch=epoch, instance_id=instance_id, reason="agent stopped")
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
                    error = error_for_status(await self.call.code(), await self.call.details())
                    self.end(f"the RM ended the stream: {error!r}")
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
        self.end(f"no heartbeat request from the RM for {self.agent.services.timeout_s:g} s")

    def notify_target_unreachable(self, target_id: str) -> None:
        self.end("answers to the RM kept failing")

    def report_payload(self, target_id: str, payload: None) -> None:
        """Requests carry no payload."""

    def retrieve_payload(self, target_id: str) -> Payload:
        return collect_payload(self.agent.payload_providers, self.agent.failed_providers)


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
        self.clock = clock or MonotonicClock()
        self._secret = secret
        self._is_healthy = is_healthy
        self._on_registered = on_registered
        self._session: _Session | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._stop_event = asyncio.Event()
        self.registration: Registration | None = None
        self.error: BaseException | None = None
        self.registrations = 0

    def healthy(self) -> bool:
        try:
            return bool(self._is_healthy())
        except Exception:
            log.warning("is_healthy() raised; treating the executor as unhealthy", exc_info=True)
            return False

    async def run(self) -> None:
        """Register, serve, re-register, until ``stop`` or a non-retryable registration error."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping:
                await self._wait_until_healthy()
                self._session = await retry_until_deadline(
                    self._open_session, self.retry_policy, self.clock, self.rm_address, self._sleep
                )
                if self._stopping:
                    await self._session.close(unregister=True, timeout_s=1.0)
                    break
                self.registration = self._session.registration
                self.registrations += 1
                if self._on_registered is not None:
                    self._on_registered(self.registration)
                reason = await self._session.serve()
                self.registration = None
                log.info("agent %s: %s", self.executor_id, reason)
                await self._session.close(unregister=self._stopping, timeout_s=1.0)
                self._session = None
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except ClosedError:
            pass
        except RegistrationError as exc:
            self.error = exc
            log.error("agent %s gives up: %s", self.executor_id, exc)
        except MalformedMessageError as exc:
            self.error = exc
            log.error("agent %s was refused by the RM: %s", self.executor_id, exc)
        finally:
            self.registration = None
            self._done.set()

    async def stop(self, timeout_s: float = 3.0) -> None:
        """Unregister (best effort) and end ``run``; idempotent.

        A registration attempt in flight is allowed to finish (so the RM gets an unregister,
        not a timeout) unless that takes longer than ``timeout_s``; then it is cancelled.
        """
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

    async def _open_session(self, timeout_s: float) -> _Session:
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
        return _Session(self, channel, call, registration)

    _last_registration: Registration | None = None


class TaskExecutorAgent:
    """``AsyncAgent`` on the shared heartbeat I/O loop, for the Spark wiring and other sync callers."""

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
    ) -> None:
        self._cond = threading.Condition()
        self._kwargs: dict[str, Any] = dict(
            rm_address=rm_address,
            secret=secret,
            executor_id=executor_id,
            host=host,
            services=services,
            payload_providers=payload_providers,
            is_healthy=is_healthy,
            retry_policy=retry_policy,
            clock=clock,
            on_registered=self._registered,
        )
        self._agent: AsyncAgent | None = None
        self._running: concurrent.futures.Future[None] | None = None
        self._stopped = False

    @property
    def registration(self) -> Registration | None:
        """``(epoch, instance_id)`` of the live registration, or None."""
        return None if self._agent is None else self._agent.registration

    @property
    def error(self) -> BaseException | None:
        """The sticky error that ended the agent (e.g. ``RegistrationTimeoutError``), if any."""
        return None if self._agent is None else self._agent.error

    @property
    def registrations(self) -> int:
        """How many times the agent registered (re-registrations included)."""
        return 0 if self._agent is None else self._agent.registrations

    def start(self) -> None:
        """Start registering in the background; returns at once."""
        if self._stopped:
            raise ClosedError("this agent was stopped; create a new one")
        if self._running is not None:
            return
        self._agent = submit(_make_agent(self._kwargs)).result()
        self._running = submit(self._agent.run())
        self._running.add_done_callback(lambda _: self._registered(None))

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered; False on timeout or if the agent gave up (see ``error``)."""
        with self._cond:
            self._cond.wait_for(self._registered_or_done, timeout_s)
            return self.registration is not None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Unregister best effort and end the agent; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._agent is None or self._running is None:
            return
        try:
            submit(self._agent.stop(timeout_s)).result(timeout_s + 1.0)
            self._running.result(timeout_s)
        except Exception as exc:
            log.debug("agent stop: %r", exc)
            self._running.cancel()

    def _registered_or_done(self) -> bool:
        return self.registration is not None or (self._running is not None and self._running.done())

    def _registered(self, registration: Registration | None) -> None:
        with self._cond:
            self._cond.notify_all()


async def _make_agent(kwargs: dict[str, Any]) -> AsyncAgent:
    """Construct on the loop so the agent's futures and events bind to it."""
    return AsyncAgent(**kwargs)
