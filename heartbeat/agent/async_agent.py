"""``AsyncAgent``: an executor's agent over gRPC: registers with the RM, retrying, and serves.

The agent is a heartbeat *receiver* (Flink's TaskExecutor side). Its state and every decision
live in the transport-free ``AgentCore`` (``agent.core``); this module is the transport around
it: it opens a ``Connect`` stream, registers with bounded exponential backoff (``retry``, Flink's
``RetryingRegistration``), serves the registered stream as an ``AgentSession`` until that ends,
then registers again, until ``stop``. While the host is unhealthy it neither answers nor
registers again, so a frozen host process looks dead to the RM; when the RM says a newer
registration of the same executor id replaced ours, the agent stops for good
(``RegistrationReplacedError`` in ``error``).

Registration is a mutual proof of the shared secret (``wire.auth``), never the secret itself: the
RM's challenge comes first, our register answers it, and the RM's answer must prove the RM
before the agent trusts its epoch or sends it anything else. Until then no refusal is final: a
process squatting the RM's port (while the RM restarts) is refused and the agent keeps
registering with its ``RetryPolicy``, so it registers when the real RM is back.

``AsyncAgent`` runs on an asyncio loop (many can share one loop, as the benchmark does);
``AgentThread`` (``agent_thread``) runs one on the shared heartbeat loop for sync callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import grpc
import grpc.aio

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.agent.core import AgentCore, RegisterRequest, Registration, error_for_status
from heartbeat.agent.outage import RmOutage
from heartbeat.agent.session import AgentSession, status_name
from heartbeat.errors import (
    AgentFailedError,
    ClosedError,
    HeartbeatAuthenticationError,
    HeartbeatError,
    HeartbeatRpcError,
    MalformedMessageError,
    ProtocolVersionError,
    RegistrationError,
    RegistrationReplacedError,
)
from heartbeat.payload import PayloadProvider
from heartbeat.retry import RetryPolicy, retry_until_deadline
from heartbeat.scheduler import Scheduler
from heartbeat.services import HeartbeatServices
from heartbeat.wire import auth as _auth
from heartbeat.wire.codec import CONNECT_METHOD
from heartbeat.wire.grpc_compat import EOF
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import MAX_ID_CHARS, check_text, clean_reason, one_line
from heartbeat.wire.transport import ChannelOptions, aio_channel

log = logging.getLogger(__name__)


class _ProvenRefusal(Exception):
    """A registration refusal the RM proved (``AsyncAgent._refusal``): ``error`` is final."""

    def __init__(self, error: HeartbeatError) -> None:
        super().__init__(str(error))
        self.error = error


__all__ = ["AsyncAgent"]


class AsyncAgent:
    """One executor's agent on the current event loop; ``run`` until ``stop``."""

    def __init__(
        self,
        rm_address: str,
        secret: str | _auth.SharedSecret,
        executor_id: str,
        host: str = "127.0.0.1",
        services: HeartbeatServices | None = None,
        payload_providers: Sequence[PayloadProvider] = (),
        is_healthy: Callable[[], bool] = lambda: True,
        retry_policy: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        on_registered: Callable[[Registration], None] | None = None,
        scheduler: Scheduler | None = None,
        channel_credentials: grpc.ChannelCredentials | None = None,
        channel_options: ChannelOptions = (),
        on_rm_unreachable: Callable[[str], None] | None = None,
        on_kill_host: Callable[[str], None] | None = None,
    ) -> None:
        """``on_rm_unreachable(address)``: after each failed registration attempt, with the address
        dialled (the Spark agent asks its JVM whether a restarted RM moved; ``set_rm_address``).
        ``on_kill_host(reason)``: the RM timed our registration out and says the host may be ended
        if it is frozen (``AgentCore.on_kill_host``); the callback decides and acts."""
        self._channel_credentials = channel_credentials  # TLS to the RM when given
        self._channel_options = tuple(channel_options)
        self.core = AgentCore(
            executor_id,
            services=services,
            clock=clock,
            host=host,
            payload_providers=payload_providers,
            is_healthy=is_healthy,
            on_registered=on_registered,
            on_kill_host=on_kill_host,
        )
        self.rm_address = rm_address
        self._on_rm_unreachable = on_rm_unreachable
        self.outage = RmOutage(executor_id, lambda: self.rm_address, clock)
        self.retry_policy = retry_policy or RetryPolicy()
        self.scheduler = scheduler
        self._secret = _auth.SharedSecret(secret)
        self._warned_unproven = False  # one WARNING per stretch of failed proofs, not one per attempt
        self._session: AgentSession | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()  # cuts a backoff sleep short: stop, or a new RM address
        self._stop_reason = "agent stopped"

    def __repr__(self) -> str:
        return (
            f"AsyncAgent(executor_id={self.executor_id!r}, rm_address={self.rm_address!r}, "
            f"registration={self.registration!r})"
        )

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
        """Register, serve, re-register, until ``stop``, a non-retryable registration error, a
        newer registration of our executor id, or an unexpected failure (the error is kept in
        ``error``; ``run`` itself returns)."""
        self._task = asyncio.current_task()
        try:
            while not self._stopping:
                await self._wait_until_healthy()
                self._session = await retry_until_deadline(
                    self._open_session,
                    self.retry_policy,
                    self.core.clock,
                    self.rm_address,
                    self._sleep,
                    on_failure=self._attempt_failed,
                )
                self.outage.registered()
                if self._stopping:
                    await self._session.close(True, 1.0, self._stop_reason)
                    break
                reason = await self._session.serve()
                log.info("agent %s: %s", self.executor_id, one_line(reason))
                final = self.core.final_error
                await self._session.close(self._stopping, 1.0, self._stop_reason)
                self._session = None
                if final is not None and not self._stopping:
                    raise final
                if not self._stopping:
                    self.outage.lost(reason)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        except ClosedError:
            pass
        except (RegistrationError, MalformedMessageError) as exc:
            self.core.give_up(exc)
        except Exception as exc:  # never an unlogged end: the host must learn of it and exit
            failed = AgentFailedError(f"unexpected {type(exc).__name__}: {one_line(str(exc))}")
            failed.__cause__ = exc
            self.core.give_up(failed)
        finally:
            self.core.end_session()
            self._done.set()

    async def stop(self, timeout_s: float = 3.0, reason: str = "agent stopped") -> None:
        """Unregister (best effort) and end ``run``; idempotent.

        ``reason`` becomes the UNREGISTERED event's detail: a host that died ("the JVM exited
        unexpectedly") must read differently from an orderly stop; it is sent escaped to one
        bounded line (the RM refuses anything else). A registration attempt in flight is allowed
        to finish (so the RM gets an unregister, not a timeout) unless that takes longer than
        ``timeout_s``; then it is cancelled.
        """
        if not self._stopping:
            self._stop_reason = clean_reason(reason)
        self._stopping = True
        self._stop_event.set()
        self._wake.set()
        if self._session is not None:
            self._session.end("agent stopping")
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(self._done.wait(), timeout_s)
        except TimeoutError:
            self._task.cancel()
            await self._done.wait()

    def set_rm_address(self, address: str) -> None:
        """The RM is at ``address`` from now on (a restarted RM that could not bind its old port):
        the next registration attempt dials it, at once if the agent is waiting out a backoff. Call
        on the agent's loop."""
        if address == self.rm_address:
            return
        log.warning("agent %s: the RM moved from %s to %s", self.executor_id, self.rm_address, address)
        self.rm_address = address
        self._wake.set()

    def _attempt_failed(self, number: int, error: BaseException) -> None:
        """A registration attempt failed: the outage log, and the host may look for a moved RM."""
        self.outage.failed(number, error)
        if self._on_rm_unreachable is not None:
            try:
                self._on_rm_unreachable(self.rm_address)
            except Exception:  # the host's hook must not end the registration loop
                log.exception("on_rm_unreachable failed")

    async def _sleep(self, seconds: float) -> None:
        """A backoff sleep that ``stop`` (or a new RM address) cuts short."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        if self._stopping:
            raise ClosedError("the agent is stopping")
        self._wake.clear()

    async def _wait_until_healthy(self) -> None:
        """A frozen host process must not re-register; poll until it recovers (no event exists)."""
        while not self.core.healthy():
            await self._sleep(self.core.services.interval_s)

    async def _open_session(self, timeout_s: float) -> AgentSession:
        """One registration attempt: the handshake, within ``timeout_s`` overall."""
        if self._stopping:
            raise ClosedError("the agent is stopping")
        request = self.core.register_request()
        check_text("executor_id", request.executor_id, MAX_ID_CHARS)  # refused here, not by the RM
        check_text("host", request.host, MAX_ID_CHARS, allow_empty=True)
        channel = aio_channel(self.rm_address, self._channel_credentials, self._channel_options)
        connect = channel.stream_stream(
            CONNECT_METHOD,
            request_serializer=pb.AgentMessage.SerializeToString,
            response_deserializer=pb.RmMessage.FromString,
        )
        call = connect(None)
        try:
            async with asyncio.timeout(timeout_s):
                reply = await self._handshake(call, request)
        except BaseException as exc:
            call.cancel()
            await channel.close(None)
            if isinstance(exc, _ProvenRefusal):
                raise exc.error from None
            if isinstance(exc, grpc.aio.AioRpcError):
                raise self._unproven(error_for_status(status_name(exc.code()), exc.details())) from None
            if isinstance(exc, HeartbeatError):
                raise self._unproven(exc) from None
            raise
        self._warned_unproven = False
        registration = self.core.registered(
            reply.epoch, reply.instance_id, reply.interval_ms, reply.timeout_ms
        )
        return AgentSession(self.core, channel, call, registration, self.scheduler)

    async def _handshake(self, call: Any, request: RegisterRequest) -> pb.RegisterResponse:
        """Answer the RM's challenge with our proof; return its answer once its proof checks."""
        challenge = (await self._read_rm_message(call, "challenge")).challenge
        if challenge.protocol_version != _auth.PROTOCOL_VERSION:
            raise ProtocolVersionError(_auth.version_mismatch("RM", challenge.protocol_version, "agent"))
        if not _auth.nonce_ok(challenge.rm_nonce):
            raise HeartbeatAuthenticationError(f"the server at {self.rm_address} sent a malformed challenge")
        agent_nonce = _auth.new_nonce()
        register = pb.RegisterRequest(
            executor_id=request.executor_id,
            host=request.host,
            pid=request.pid,
            resume_epoch=request.resume_epoch,
            resume_instance_id=request.resume_instance_id,
            protocol_version=_auth.PROTOCOL_VERSION,
            agent_nonce=agent_nonce,
        )
        register.proof = _auth.agent_proof(
            self._secret,
            rm_nonce=challenge.rm_nonce,
            agent_nonce=agent_nonce,
            protocol_version=register.protocol_version,
            executor_id=register.executor_id,
            host=register.host,
            pid=register.pid,
            resume_epoch=register.resume_epoch,
            resume_instance_id=register.resume_instance_id,
        )
        await call.write(pb.AgentMessage(register=register))
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as exc:  # refused
            raise self._refusal(
                status_name(exc.code()), exc.details() or "", challenge.rm_nonce, register
            ) from None
        if message is EOF:
            raise self._refusal(
                status_name(await call.code()), await call.details() or "", challenge.rm_nonce, register
            )
        reply = self._expected(cast(pb.RmMessage, message), "registered").registered
        expected = _auth.rm_proof(
            self._secret,
            rm_nonce=challenge.rm_nonce,
            agent_nonce=agent_nonce,
            executor_id=request.executor_id,
            epoch=reply.epoch,
            instance_id=reply.instance_id,
            interval_ms=reply.interval_ms,
            timeout_ms=reply.timeout_ms,
            resumed=reply.resumed,
        )
        if not hmac.compare_digest(expected, reply.proof):
            raise HeartbeatAuthenticationError(
                f"the server at {self.rm_address} did not prove that it knows the application's secret: "
                "it is not this application's RM (another application's, or another process on the RM's "
                "port); it got nothing but a proof bound to its own one-time challenge"
            )
        return reply

    async def _read_rm_message(self, call: Any, expected: str) -> pb.RmMessage:
        message = await call.read()
        if message is EOF:
            raise error_for_status(status_name(await call.code()), await call.details())
        return self._expected(cast(pb.RmMessage, message), expected)

    @staticmethod
    def _expected(rm_message: pb.RmMessage, expected: str) -> pb.RmMessage:
        kind = rm_message.WhichOneof("body")
        if kind != expected:
            raise HeartbeatRpcError(f"expected `{expected}` from the RM, got {kind!r}")
        return rm_message

    def _refusal(
        self, status: str | None, details: str, rm_nonce: bytes, register: pb.RegisterRequest
    ) -> BaseException:
        """The RM's refusal of ``register``: final (``_ProvenRefusal``) only when it says that a
        newer registration replaced the one we resume and proves it (``auth.replaced_proof_ok``);
        any other refusal before the RM proved itself is judged by ``_unproven``."""
        proven, text = _auth.replaced_proof_ok(
            self._secret,
            details,
            rm_nonce=rm_nonce,
            agent_nonce=register.agent_nonce,
            executor_id=register.executor_id,
            resumed=register.resume_instance_id,
        )
        error = error_for_status(status, text)
        if proven and isinstance(error, RegistrationReplacedError):
            return _ProvenRefusal(error)
        return error

    def _unproven(self, error: HeartbeatError) -> HeartbeatError:
        """A refusal before the RM proved itself: never final (a port squatter could send any).

        The kinds that would stop the agent for good are retried as ``HeartbeatRpcError``; a
        failed proof or another protocol version is logged once per stretch of failures.
        """
        if isinstance(error, RegistrationReplacedError | MalformedMessageError):
            error = HeartbeatRpcError(
                f"the server at {self.rm_address} refused the registration before proving it is the RM: "
                f"{error}"
            )
        if (
            isinstance(error, HeartbeatAuthenticationError | ProtocolVersionError)
            and not self._warned_unproven
        ):
            self._warned_unproven = True
            log.warning(
                "agent %s: %s; registering again until the RM proves itself or the registration deadline "
                "passes",
                self.executor_id,
                error,
            )
        return error
