"""``ResourceManagerServer``: the RM core served over gRPC (grpc.aio on the shared heartbeat loop).

Each agent opens one long-lived ``Connect`` stream; the RM sends heartbeat requests down it and
reads answers from it. One connection per agent and no RM-to-agent dialling keeps a Python RM
cheap at thousands of executors and works through NAT. A broken stream or a failed send counts
as an RPC failure toward UNREACHABLE; silence counts toward HEARTBEAT_TIMEOUT. The injected
``Clock`` reaches the core (timeouts, RTTs, recorded timestamps) and the rejected-call log's rate
limit; only the I/O deadlines (a register message in time, stopping) are real waits on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import grpc.aio

from ._grpc_compat import EOF
from ._io_loop import submit
from ._proto import heartbeat_pb2 as pb
from ._wire import (
    MAX_MESSAGE_BYTES,
    SECRET_METADATA_KEY,
    SERVICE_NAME,
    message_size_options,
    payload_from_proto,
    status_name_for,
    status_to_proto,
)
from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    ClosedError,
    HeartbeatError,
    HeartbeatProtocolError,
    HeartbeatRpcError,
    MalformedMessageError,
)
from .events import EventBus, Subscriber
from .resource_manager import ExecutorInfo, ResourceManagerCore
from .scheduler import LoopScheduler
from .services import HeartbeatServices

log = logging.getLogger(__name__)

_SEND_QUEUE_LIMIT = 32


class _AuthLog:
    """At most one log line per rejected call, and at most one per ``every_s`` under a flood."""

    def __init__(self, clock: Clock, every_s: float = 10.0) -> None:
        self._clock = clock
        self._every_s = every_s
        self._last = -float("inf")
        self._suppressed = 0

    def rejected(self, peer: str) -> None:
        now = self._clock.monotonic()
        if now - self._last < self._every_s:
            self._suppressed += 1
            return
        self._last = now
        log.warning(
            "rejected heartbeat call from %s: missing or wrong secret (%d more since the last report)",
            peer,
            self._suppressed,
        )
        self._suppressed = 0


class _StreamLink:
    """One agent stream seen from the RM: a bounded send queue drained by a writer task."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context
        self._queue: collections.deque[pb.RmMessage] = collections.deque()
        self._wake = asyncio.Event()
        self.closed = False
        self.ended: asyncio.Future[tuple[str, str] | None] = asyncio.get_running_loop().create_future()
        self.on_send_failure: Callable[[], None] = lambda: None

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        if self.closed:
            raise HeartbeatRpcError("the agent's stream is closed")
        if len(self._queue) >= _SEND_QUEUE_LIMIT:
            raise HeartbeatRpcError("the agent is not reading its stream (send queue full)")
        request = pb.HeartbeatRequest(epoch=epoch, instance_id=instance_id, seq=seq)
        self._queue.append(pb.RmMessage(heartbeat_request=request))
        self._wake.set()

    def close(self, status: str, detail: str) -> None:
        self.finish((status, detail))

    def finish(self, status: tuple[str, str] | None) -> None:
        self.closed = True
        if not self.ended.done():
            self.ended.set_result(status)

    async def write_loop(self) -> None:
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self.closed:
                try:
                    await self._context.write(self._queue.popleft())
                except Exception as exc:
                    log.debug("heartbeat request write failed: %r", exc)
                    self.on_send_failure()
                    self.finish(None)
                    return


class ResourceManagerServer:
    """Serves the RM on ``host:port``; see the package README for the protocol."""

    def __init__(
        self,
        services: HeartbeatServices,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        clock: Clock = SYSTEM_CLOCK,
        known_executors: Iterable[str] = (),
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        register_timeout_s: float = 5.0,
        spread: int = 50,
    ) -> None:
        if not secret:
            raise ValueError("a non-empty shared secret is required")
        self.services = services
        self._secret = secret.encode()
        self._host = host
        self._port = port
        self._clock = clock
        self._known = tuple(known_executors)
        self._max_message_bytes = max_message_bytes
        self._register_timeout_s = register_timeout_s
        self._spread = spread
        self._bus = EventBus()
        self._auth_log = _AuthLog(clock)
        self._core: ResourceManagerCore | None = None
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None
        self._stopped = False

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
        server = grpc.aio.server(
            options=[*message_size_options(self._max_message_bytes), ("grpc.so_reuseport", 0)],
        )
        handler = grpc.stream_stream_rpc_method_handler(
            self._connect, request_deserializer=None, response_serializer=pb.RmMessage.SerializeToString
        )
        list_handler = grpc.unary_unary_rpc_method_handler(
            self._list_executors,
            request_deserializer=pb.ListExecutorsRequest.FromString,
            response_serializer=pb.ListExecutorsResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE_NAME, {"Connect": handler, "ListExecutors": list_handler}
                ),
            )
        )
        port = server.add_insecure_port(f"{self._host}:{self._port}")
        if port == 0:
            raise HeartbeatError(f"could not bind {self._host}:{self._port}")
        self._core = ResourceManagerCore(
            self.services,
            self._clock,
            LoopScheduler(asyncio.get_running_loop()),
            self._bus,
            known_executors=self._known,
            spread=self._spread,
        )
        await server.start()
        self._server = server
        self._core.start()
        return f"{self._host}:{port}"

    # ---- admin ----------------------------------------------------------------------------

    async def _list_executors(
        self, _request: pb.ListExecutorsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListExecutorsResponse:
        if not self._authorized(context):
            self._auth_log.rejected(context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {SECRET_METADATA_KEY}")
        core = self._require_core()
        return pb.ListExecutorsResponse(
            epoch=core.epoch, executors=[status_to_proto(e) for e in core.executors()]
        )

    # ---- one agent stream -----------------------------------------------------------------

    def _authorized(self, context: grpc.aio.ServicerContext[Any, Any]) -> bool:
        for key, value in context.invocation_metadata() or ():
            if key == SECRET_METADATA_KEY:
                given = value.encode() if isinstance(value, str) else bytes(value)
                return hmac.compare_digest(given, self._secret)
        return False

    async def _connect(self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if not self._authorized(context):
            self._auth_log.rejected(context.peer())
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"missing or wrong {SECRET_METADATA_KEY}")
        core = self._require_core()
        try:
            raw = await asyncio.wait_for(context.read(), self._register_timeout_s)
        except TimeoutError:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no register message in time")
        if raw is EOF:
            return
        link = _StreamLink(context)
        try:
            first = _parse(raw)
            if first.WhichOneof("body") != "register":
                raise MalformedMessageError("the first message on a stream must be `register`")
            req = first.register
            registered = core.register(
                req.executor_id, req.host, link, req.resume_epoch, req.resume_instance_id, pid=req.pid
            )
        except HeartbeatProtocolError as exc:
            await context.abort(_code(exc), str(exc))
        executor_id = req.executor_id
        link.on_send_failure = lambda: core.report_rpc_failure(executor_id, link)
        response = pb.RegisterResponse(
            epoch=registered.epoch,
            instance_id=registered.instance_id,
            interval_ms=round(self.services.interval_s * 1000),
            timeout_ms=round(self.services.timeout_s * 1000),
            resumed=registered.resumed,
        )
        writer: asyncio.Task[None] | None = None
        reader: asyncio.Task[None] | None = None
        try:
            await context.write(pb.RmMessage(registered=response))
            writer = asyncio.create_task(link.write_loop())
            reader = asyncio.create_task(self._read_loop(context, core, executor_id, link))
            status = await link.ended
        finally:
            # Whatever ended the call (the agent vanished, a failed write, stop), later
            # requests on this link must fail fast so they count toward UNREACHABLE.
            link.finish(None)
            for task in (writer, reader):
                if task is not None:
                    task.cancel()
        if status is not None:
            await context.abort(getattr(grpc.StatusCode, status[0]), status[1])

    async def _read_loop(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        core: ResourceManagerCore,
        executor_id: str,
        link: _StreamLink,
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
            link.finish((_code(exc).name, str(exc)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("agent stream of %s broke: %r", executor_id, exc)
            link.on_send_failure()
            link.finish(None)


def _parse(raw: bytes) -> pb.AgentMessage:
    try:
        return pb.AgentMessage.FromString(raw)
    except Exception as exc:
        raise MalformedMessageError(f"malformed AgentMessage ({len(raw)} bytes): {exc}") from None


def _code(error: HeartbeatProtocolError) -> grpc.StatusCode:
    code: grpc.StatusCode = getattr(grpc.StatusCode, status_name_for(error))
    return code
