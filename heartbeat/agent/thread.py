"""``AgentThread``: runs one ``AsyncAgent`` on the process's shared heartbeat loop, for sync callers.

It is not Flink's TaskExecutor, only a thread-safe handle: ``start`` schedules the agent's
``run`` on the shared grpc.aio loop (``_io_loop``: one loop per process, see there why) and
returns at once; ``wait_registered`` blocks the caller until the first registration (or until
the agent gave up); ``on_ended``/``wait_ended`` tell the host that the agent's ``run`` is over
(given up: see ``error``); ``stop`` unregisters and waits for the agent to end. The Spark executor
wiring and other code without an event loop use it; code on a loop uses ``AsyncAgent`` directly.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from heartbeat.agent.async_agent import AsyncAgent
from heartbeat.agent.core import Registration
from heartbeat.errors import ClosedError
from heartbeat.payload import PayloadProvider
from heartbeat.retry import RetryPolicy
from heartbeat.services import HeartbeatServices
from heartbeat.wire.auth import SharedSecret
from heartbeat.wire.io_loop import submit

if TYPE_CHECKING:
    import grpc

    from heartbeat.wire.transport import ChannelOptions

log = logging.getLogger(__name__)


class AgentThread:
    """A synchronous handle on one ``AsyncAgent`` running on the shared heartbeat I/O loop."""

    def __init__(
        self,
        rm_address: str,
        secret: str | SharedSecret,
        executor_id: str,
        host: str = "127.0.0.1",
        services: HeartbeatServices | None = None,
        payload_providers: Sequence[PayloadProvider] = (),
        is_healthy: Callable[[], bool] = lambda: True,
        retry_policy: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        *,
        channel_credentials: grpc.ChannelCredentials | None = None,
        channel_options: ChannelOptions = (),
        on_rm_unreachable: Callable[[str], None] | None = None,
        on_kill_host: Callable[[str], None] | None = None,
    ) -> None:
        self._cond = threading.Condition()
        self._kwargs: dict[str, Any] = dict(
            rm_address=rm_address,
            secret=SharedSecret(secret),  # held so that no repr of these arguments shows it
            executor_id=executor_id,
            host=host,
            services=services,
            payload_providers=payload_providers,
            is_healthy=is_healthy,
            retry_policy=retry_policy,
            clock=clock,
            on_registered=self._registered,
            channel_credentials=channel_credentials,
            channel_options=channel_options,
            on_rm_unreachable=on_rm_unreachable,
            on_kill_host=on_kill_host,
        )
        self._agent: AsyncAgent | None = None
        self._running: concurrent.futures.Future[None] | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return (
            f"AgentThread(executor_id={self._kwargs['executor_id']!r}, "
            f"rm_address={self._kwargs['rm_address']!r}, registration={self.registration!r})"
        )

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

    @property
    def ended(self) -> bool:
        """True once the agent's ``run`` is over: stopped, or given up (then see ``error``)."""
        return self._running is not None and self._running.done()

    def on_ended(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the loop's thread) once the agent's ``run`` is over, however it
        ended: a process hosting the agent watches it with this, so that an agent that gave up
        ends its process loudly instead of leaving it running unmonitored. Call after ``start``."""
        if self._running is None:
            raise ClosedError("the agent was not started")
        self._running.add_done_callback(lambda _: callback())

    def when_serving(self, callback: Callable[[], None]) -> None:
        """Runs ``callback`` from the loop that serves the agent's heartbeats, soon, without
        waiting: a liveness probe. A wedged loop (a blocking call on it, a deadlock) never runs
        it, so an answer sent from it proves that the agent can still answer the RM; the hosting
        process answers its JVM's pulses this way. A failure is logged."""

        async def run() -> None:
            callback()

        def done(future: concurrent.futures.Future[None]) -> None:
            if not future.cancelled() and future.exception() is not None:
                log.warning("a liveness probe of the agent failed: %r", future.exception())

        submit(run()).add_done_callback(done)

    def set_rm_address(self, address: str) -> None:
        """The RM moved to ``address`` (``AsyncAgent.set_rm_address``); returns at once."""
        agent = self._agent
        if agent is None:
            self._kwargs["rm_address"] = address
            return

        async def move() -> None:
            agent.set_rm_address(address)

        submit(move())

    def wait_ended(self, timeout_s: float) -> bool:
        """True once the agent's ``run`` is over; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self.ended, timeout_s)

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered; False on timeout or if the agent gave up (see ``error``)."""
        with self._cond:
            self._cond.wait_for(self._registered_or_done, timeout_s)
            return self.registration is not None

    def stop(self, timeout_s: float = 5.0, reason: str = "agent stopped") -> None:
        """Unregister best effort, telling the RM ``reason``, and end the agent; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._agent is None or self._running is None:
            return
        try:
            submit(self._agent.stop(timeout_s, reason)).result(timeout_s + 1.0)
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
