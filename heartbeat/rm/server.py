"""``ResourceManagerServer``: the RM core served over gRPC (grpc.aio on the shared heartbeat loop).

Each agent opens one long-lived ``Connect`` stream; the RM sends heartbeat requests down it and
reads answers from it. One connection per agent and no RM-to-agent dialling keeps a Python RM
cheap at thousands of executors and works through NAT. A broken stream or a failed send counts
as an RPC failure toward UNREACHABLE; silence counts toward HEARTBEAT_TIMEOUT. The injected
``Clock`` reaches the core (timeouts, RTTs, recorded timestamps), the unary calls' challenges and
the refusal log's rate limit; only the I/O deadlines (the handshake, stopping) are real waits.

No secret on the wire (``_auth``): a stream starts with the RM's challenge and is registered
only once the agent's proof checks, and the RM's answer proves the RM; a unary call carries a
single-use token over a challenge this RM instance issued (``Hello``), and its reply the RM's
proof. The handshake has one overall deadline, and at most ``max_pending_handshakes`` streams
may be in it at once. Text from the wire is checked before it is recorded (``_text``), and every
refusal is logged by cause, once, then at most once per cause every 10 s.

After the handshake, messages on the stream carry no MAC: heartbeats cost what they did. A peer
can only speak on a stream it authenticated itself, but without TLS (``_transport``) a
man-in-the-middle on the path could read the stream and inject into it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import Future
from typing import Any, NoReturn

import grpc
import grpc.aio

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog
from heartbeat.errors import (
    ClosedError,
    HeartbeatError,
    HeartbeatProtocolError,
    MalformedMessageError,
    ProtocolVersionError,
    StaleInstanceError,
)
from heartbeat.events import EventBus, EventKind, Subscriber
from heartbeat.executor_info import ExecutorInfo
from heartbeat.rm.resource_manager import ResourceManagerCore
from heartbeat.rm.stream_link import StreamLink
from heartbeat.scheduler import LoopScheduler
from heartbeat.services import HeartbeatServices
from heartbeat.wire import auth as _auth
from heartbeat.wire.codec import (
    CALL_PROOF_KEY,
    CALL_TOKEN_KEY,
    LIST_EXECUTORS_METHOD,
    MAX_MESSAGE_BYTES,
    SERVICE_NAME,
    payload_from_proto,
    status_name_for,
    status_to_proto,
)
from heartbeat.wire.grpc_compat import EOF
from heartbeat.wire.io_loop import submit
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import one_line
from heartbeat.wire.transport import bind_server, server_options

log = logging.getLogger(__name__)

_REFUSAL_LOG_S = 10.0


def _log_refusal(rates: RateLog, cause: str, peer: str, detail: str = "") -> None:
    """One WARNING per cause of refusal, then at most one per cause every ``_REFUSAL_LOG_S`` (with
    how many were not reported meanwhile): a flood cannot fill the log, nor one cause hide another.

    Causes are fixed phrases (a bounded table); what came from the peer is escaped to one line.
    """
    unreported = rates.admit(cause)
    if unreported is None:
        return
    log.warning(
        "refused a heartbeat call from %s: %s%s (%d more refused for this cause since the last report)",
        one_line(peer, 100),
        cause,
        f" ({one_line(detail)})" if detail else "",
        unreported,
    )


class ResourceManagerServer:
    """Serves the RM on ``host:port``; see the module doc and the package README for the protocol."""

    def __init__(
        self,
        services: HeartbeatServices,
        secret: str | _auth.SharedSecret,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: Clock = SYSTEM_CLOCK,
        known_executors: Iterable[str] = (),
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        register_timeout_s: float = 5.0,
        spread: int = 50,
        max_pending_handshakes: int = 1024,
        call_window_s: float = 60.0,
        server_credentials: grpc.ServerCredentials | None = None,
        any_port_if_taken: bool = False,
        kill_frozen_hosts: bool = False,
    ) -> None:
        """``any_port_if_taken``: if ``port`` cannot be bound, serve on a free one instead (a
        restarted RM whose port another process took meanwhile; its agents learn the new address
        from their hosts). Without it, a taken port fails ``start``. ``kill_frozen_hosts``: see
        ``ResourceManagerCore``."""
        self._kill_frozen_hosts = kill_frozen_hosts
        self.services = services
        self._any_port_if_taken = any_port_if_taken
        self.moved_from: int | None = None
        """The port asked for, when it was taken and another is served (``any_port_if_taken``)."""
        self._server_credentials = server_credentials  # TLS when given (plaintext when None)
        self._secret = _auth.SharedSecret(secret)  # refuses an empty one
        self._host = host
        self._port = port
        self._clock = clock
        self._known = tuple(known_executors)
        self._max_message_bytes = max_message_bytes
        self._register_timeout_s = register_timeout_s
        self._spread = spread
        self._max_pending_handshakes = max_pending_handshakes
        self._pending_handshakes = 0
        self._challenges = _auth.ChallengeIssuer(clock, call_window_s)
        self._used_challenges = _auth.ReplayCache(clock)
        self._bus = EventBus()
        self._refusals = RateLog(log, _REFUSAL_LOG_S, clock)
        self._core: ResourceManagerCore | None = None
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None
        self._stopped = False

    def __repr__(self) -> str:
        epoch = None if self._core is None else self._core.epoch
        return f"ResourceManagerServer(address={self._address!r}, epoch={epoch!r}, stopped={self._stopped})"

    # ---- public API -----------------------------------------------------------------------

    @property
    def epoch(self) -> str:
        return self._require_core().epoch

    @property
    def address(self) -> str | None:
        return self._address

    def start(self) -> str:
        """Bind and serve on the shared heartbeat I/O loop; returns ``"host:port"``."""
        if self._stopped:
            raise ClosedError("this ResourceManagerServer was stopped; create a new one")
        if self._address is None:
            try:
                self._address = submit(self._start()).result()
            except Exception as exc:
                raise HeartbeatError(f"could not start the ResourceManager: {exc}") from exc
        return self._address

    def subscribe(self, callback: Subscriber) -> None:
        """``callback(ExecutorEvent | HeartbeatRecord)`` on the RM's event thread; exceptions are logged."""
        self._bus.subscribe(callback)

    def executors(self) -> list[ExecutorInfo]:
        return [] if self._core is None else self._core.executors()

    # ---- the cluster manager's view: from any thread, applied in order on the RM's loop ----

    def executor_started(self, executor_id: str, host: str, within_s: float) -> None:
        """The cluster manager started ``executor_id``; see ``ResourceManagerCore.expect``."""
        self._on_loop("an executor start", lambda core: core.expect(executor_id, host, within_s))

    def agent_not_started(self, executor_id: str, reason: str) -> None:
        """``executor_id``'s agent could not start; see ``ResourceManagerCore.agent_not_started``."""
        self._on_loop("an agent's failed start", lambda core: core.agent_not_started(executor_id, reason))

    def agent_down(self, executor_id: str, pid: int, detail: str) -> None:
        """``executor_id``'s agent process ``pid`` exited; see ``ResourceManagerCore.agent_down``."""
        self._on_loop("an agent's exit", lambda core: core.agent_down(executor_id, pid, detail))

    def executor_removed(self, executor_id: str, kind: EventKind, detail: str) -> None:
        """The cluster manager removed ``executor_id``; see ``ResourceManagerCore.cluster_removed``."""
        self._on_loop("an executor removal", lambda core: core.cluster_removed(executor_id, kind, detail))

    def when_serving(self, callback: Callable[[], None]) -> None:
        """Runs ``callback`` from the RM's serving loop, soon, without waiting: a liveness probe.
        A wedged loop never runs it, so an answer sent from it proves that the RM serves (the
        driver-side process answers the JVM's pulses this way). A failure is logged."""

        async def run() -> None:
            callback()

        def done(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                log.warning("a liveness probe of the RM failed: %s", one_line(repr(future.exception())))

        submit(run()).add_done_callback(done)

    def _on_loop(self, what: str, apply: Callable[[ResourceManagerCore], None]) -> None:
        """Runs ``apply`` on the core from the loop, without waiting; a failure is logged."""

        async def run() -> None:
            apply(self._require_core())

        def done(future: Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                log.warning("the RM did not take %s: %s", what, one_line(repr(future.exception())))

        submit(run()).add_done_callback(done)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving; idempotent. Events published before are delivered, none after."""
        if self._stopped:
            return
        self._stopped = True
        if self._core is not None:
            self._core.stop()
        if self._server is not None:
            server, self._server = self._server, None
            try:
                submit(server.stop(grace_s)).result(grace_s + 10.0)
            except Exception as exc:
                log.warning("stopping the ResourceManager server: %r", exc)
        self._bus.close()

    # ---- serving --------------------------------------------------------------------------

    def _require_core(self) -> ResourceManagerCore:
        if self._core is None:
            raise ClosedError("the ResourceManager is not started")
        return self._core

    async def _start(self) -> str:
        server = grpc.aio.server(options=server_options(self._max_message_bytes))
        # Unary requests and replies stay bytes here: tokens and proofs cover the exact bytes.
        handlers = {
            "Connect": grpc.stream_stream_rpc_method_handler(
                self._connect, request_deserializer=None, response_serializer=pb.RmMessage.SerializeToString
            ),
            "Hello": grpc.unary_unary_rpc_method_handler(self._hello),
            "ListExecutors": grpc.unary_unary_rpc_method_handler(
                self._authenticated(LIST_EXECUTORS_METHOD, self._list_executors)
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
        try:
            port = bind_server(server, self._host, self._port, self._server_credentials)
        except RuntimeError as exc:  # grpc raises where it used to return 0
            log.debug("binding %s:%d failed: %s", self._host, self._port, exc)
            port = 0
        if port == 0 and self._any_port_if_taken and self._port != 0:
            port = bind_server(server, self._host, 0, self._server_credentials)
            if port != 0:
                self.moved_from = self._port
                log.warning(
                    "the RM's port %s:%d is taken (by another process since the RM last ran there); "
                    "serving on port %d instead",
                    self._host,
                    self._port,
                    port,
                )
        if port == 0:
            raise HeartbeatError(f"could not bind {self._host}:{self._port}")
        self._core = ResourceManagerCore(
            self.services,
            self._clock,
            LoopScheduler(asyncio.get_running_loop()),
            self._bus,
            known_executors=self._known,
            spread=self._spread,
            kill_frozen_hosts=self._kill_frozen_hosts,
        )
        await server.start()
        self._server = server
        self._core.start()
        return f"{self._host}:{port}"

    async def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], cause: str, code: grpc.StatusCode, details: str
    ) -> NoReturn:
        """End the call with ``code``, logging the refusal (by ``cause``, rate-limited)."""
        _log_refusal(self._refusals, cause, context.peer(), details)
        await context.abort(code, details)

    # ---- unary calls ----------------------------------------------------------------------

    async def _hello(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        """A single-use challenge for one unary call; costs the RM no state (``ChallengeIssuer``)."""
        try:
            request = pb.HelloRequest.FromString(raw)
        except Exception:
            invalid = grpc.StatusCode.INVALID_ARGUMENT
            await self._refuse(context, "malformed message", invalid, "malformed Hello")
        if request.protocol_version != _auth.PROTOCOL_VERSION:
            details = _auth.version_mismatch("client", request.protocol_version, "RM")
            failed = grpc.StatusCode.FAILED_PRECONDITION
            await self._refuse(context, "protocol version mismatch", failed, details)
        reply = pb.HelloResponse(challenge=self._challenges.issue(), protocol_version=_auth.PROTOCOL_VERSION)
        return reply.SerializeToString()

    def _authenticated(
        self, method: str, handler: Callable[[bytes], Awaitable[bytes]]
    ) -> Callable[[bytes, grpc.aio.ServicerContext[Any, Any]], Awaitable[bytes]]:
        """``handler`` behind a call token, its reply with the RM's proof (trailing metadata)."""

        async def serve(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            challenge, client_nonce = await self._check_call_token(method, raw, context)
            reply = await handler(raw)
            proof = _auth.reply_proof(self._secret, method, challenge, client_nonce, reply)
            context.set_trailing_metadata(((CALL_PROOF_KEY, proof.hex()),))
            return reply

        return serve

    async def _check_call_token(
        self, method: str, body: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[bytes, bytes]:
        """``(challenge, client_nonce)`` of a valid, fresh, first-used token; else the call ends."""
        token = next(
            (v for k, v in context.invocation_metadata() or () if k == CALL_TOKEN_KEY and isinstance(v, str)),
            "",
        )
        parsed = _auth.parse_call_token(token)
        unauthenticated = grpc.StatusCode.UNAUTHENTICATED
        if parsed is None:
            await self._refuse(
                context,
                "no valid proof of the secret",
                unauthenticated,
                f"a call token ({CALL_TOKEN_KEY}) proving the application's secret over a Hello challenge "
                "is required",
            )
        challenge, client_nonce, tag = parsed
        if not _auth.call_token_ok(self._secret, method, challenge, client_nonce, tag, body):
            await self._refuse(
                context,
                "no valid proof of the secret",
                unauthenticated,
                "the call token does not prove knowledge of the application's secret",
            )
        problem = self._challenges.check(challenge)
        if problem is not None:  # a fixed phrase: stale, or not issued by this RM instance
            await self._refuse(context, problem, unauthenticated, f"{problem}: ask Hello for a new one")
        expires_at = self._challenges.issued_at(challenge) + self._challenges.max_age_s
        try:
            first = self._used_challenges.first_use(challenge, expires_at)
        except _auth.ReplayCacheFull:
            await self._refuse(
                context, "too many calls", grpc.StatusCode.RESOURCE_EXHAUSTED, "too many calls; try again"
            )
        if not first:
            await self._refuse(
                context, "replayed call token", unauthenticated, "this call token was used already"
            )
        return challenge, client_nonce

    async def _list_executors(self, raw: bytes) -> bytes:
        pb.ListExecutorsRequest.FromString(raw)  # no fields; the token checked its bytes already
        core = self._require_core()
        reply = pb.ListExecutorsResponse(
            epoch=core.epoch, executors=[status_to_proto(e) for e in core.executors()]
        )
        return reply.SerializeToString()

    # ---- one agent stream -----------------------------------------------------------------

    async def _connect(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        core = self._require_core()
        if self._pending_handshakes >= self._max_pending_handshakes:
            await self._refuse(
                context,
                "too many registrations in progress",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many registrations in progress; try again",
            )
        # The handshake: our challenge out, the agent's register in, one deadline for both.
        self._pending_handshakes += 1
        rm_nonce = _auth.new_nonce()
        raw: object = None
        try:
            async with asyncio.timeout(self._register_timeout_s):
                challenge = pb.Challenge(rm_nonce=rm_nonce, protocol_version=_auth.PROTOCOL_VERSION)
                await context.write(pb.RmMessage(challenge=challenge))
                raw = await context.read()
        except TimeoutError:
            pass
        except Exception as exc:  # the peer went away mid-handshake
            log.debug("agent stream ended during the handshake: %s", one_line(repr(exc)))
            return
        finally:
            self._pending_handshakes -= 1
        if raw is None:
            await self._refuse(
                context,
                "no register message within the handshake deadline",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "no register message in time",
            )
        if raw is EOF or not isinstance(raw, bytes):
            return
        link = StreamLink(context)
        try:
            first = _parse(raw)
            if first.WhichOneof("body") != "register":
                raise MalformedMessageError("the first message on a stream must be `register`")
            req = first.register
            if req.protocol_version != _auth.PROTOCOL_VERSION:
                raise ProtocolVersionError(_auth.version_mismatch("agent", req.protocol_version, "RM"))
            if not self._register_proof_ok(req, rm_nonce):
                await self._refuse(
                    context,
                    "no valid proof of the secret",
                    grpc.StatusCode.UNAUTHENTICATED,
                    "the registration does not prove knowledge of the application's secret",
                )
            registered = core.register(
                req.executor_id, req.host, link, req.resume_epoch, req.resume_instance_id, pid=req.pid
            )
        except StaleInstanceError as exc:  # it resumes a replaced instance: proven, so it is final
            details = _auth.with_replaced_proof(
                self._secret,
                str(exc),
                rm_nonce=rm_nonce,
                agent_nonce=req.agent_nonce,
                executor_id=req.executor_id,
                resumed=req.resume_instance_id,
            )
            await self._refuse(context, _cause(exc), _code(exc), details)
        except HeartbeatProtocolError as exc:
            await self._refuse(context, _cause(exc), _code(exc), str(exc))
        executor_id = req.executor_id
        link.on_send_failure = lambda: core.report_rpc_failure(executor_id, link)
        response = pb.RegisterResponse(
            epoch=registered.epoch,
            instance_id=registered.instance_id,
            interval_ms=round(self.services.interval_s * 1000),
            timeout_ms=round(self.services.timeout_s * 1000),
            resumed=registered.resumed,
        )
        response.proof = _auth.rm_proof(
            self._secret,
            rm_nonce=rm_nonce,
            agent_nonce=req.agent_nonce,
            executor_id=executor_id,
            epoch=response.epoch,
            instance_id=response.instance_id,
            interval_ms=response.interval_ms,
            timeout_ms=response.timeout_ms,
            resumed=response.resumed,
        )
        writer: asyncio.Task[None] | None = None
        reader: asyncio.Task[None] | None = None
        status: tuple[str, str] | None = None
        try:
            try:
                await context.write(pb.RmMessage(registered=response))
            except Exception as exc:  # the agent went away right after registering: not a handler error
                log.debug("answering the registration of %s failed: %s", executor_id, one_line(repr(exc)))
                link.on_send_failure()
                return
            writer = asyncio.create_task(link.write_loop())
            reader = asyncio.create_task(self._read_loop(context, core, executor_id, link))
            status = await link.ended
        finally:
            # Whatever ended the call (the agent vanished, a failed write, stop), later
            # requests on this link must fail fast so they count toward UNREACHABLE.
            link.finish(None)
            if reader is not None:
                reader.cancel()
            if status is None:
                link.last_words = None  # said only before an end with a status
            await link.wind_up(writer)  # the agent may end its frozen host: said before the end
        if status is not None:
            await context.abort(getattr(grpc.StatusCode, status[0]), status[1])

    def _register_proof_ok(self, req: pb.RegisterRequest, rm_nonce: bytes) -> bool:
        if not _auth.nonce_ok(req.agent_nonce):
            return False
        expected = _auth.agent_proof(
            self._secret,
            rm_nonce=rm_nonce,
            agent_nonce=req.agent_nonce,
            protocol_version=req.protocol_version,
            executor_id=req.executor_id,
            host=req.host,
            pid=req.pid,
            resume_epoch=req.resume_epoch,
            resume_instance_id=req.resume_instance_id,
        )
        return hmac.compare_digest(expected, req.proof)

    async def _read_loop(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        core: ResourceManagerCore,
        executor_id: str,
        link: StreamLink,
    ) -> None:
        try:
            while not link.closed:
                raw = await context.read()
                if raw is EOF:
                    link.finish(None)
                    return
                message = _parse(raw)
                kind = message.WhichOneof("body")
                if kind == "heartbeat":
                    hb = message.heartbeat
                    payload = payload_from_proto(hb.payload)
                    core.receive_heartbeat(executor_id, hb.epoch, hb.instance_id, hb.seq, payload)
                elif kind == "unregister":
                    un = message.unregister
                    core.unregister(executor_id, un.epoch, un.instance_id, un.reason)
                    link.finish(None)
                    return
                else:
                    raise MalformedMessageError(f"unexpected message {kind!r} after registration")
        except HeartbeatProtocolError as exc:
            if isinstance(exc, MalformedMessageError):  # the rest is the protocol at work
                _log_refusal(self._refusals, _cause(exc), context.peer(), f"executor {executor_id}: {exc}")
            link.finish((_code(exc).name, str(exc)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("agent stream of %s broke: %s", executor_id, one_line(repr(exc)))
            link.on_send_failure()
            link.finish(None)


def _parse(raw: bytes) -> pb.AgentMessage:
    try:
        return pb.AgentMessage.FromString(raw)
    except Exception as exc:
        raise MalformedMessageError(f"malformed AgentMessage ({len(raw)} bytes): {exc}") from None


def _cause(error: HeartbeatProtocolError) -> str:
    """The refusal log's cause for ``error``: a fixed phrase per kind."""
    if isinstance(error, MalformedMessageError):
        return "malformed message"
    if isinstance(error, ProtocolVersionError):
        return "protocol version mismatch"
    return "refused registration"


def _code(error: HeartbeatProtocolError) -> grpc.StatusCode:
    code: grpc.StatusCode = getattr(grpc.StatusCode, status_name_for(error))
    return code
