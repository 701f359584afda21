"""``StreamLink``: one agent's ``Connect`` stream seen from the RM (``rm.server``): heartbeat
requests go into a bounded queue a writer task drains, and the stream's end is one future; the
RM's last word (``kill_host``) is written after the write in flight, within a bound.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

import grpc.aio

from heartbeat.errors import HeartbeatRpcError
from heartbeat.wire.proto import heartbeat_pb2 as pb
from heartbeat.wire.text import clean_reason, one_line

log = logging.getLogger(__name__)

SEND_QUEUE_LIMIT = 32
LAST_WORDS_DEADLINE_S = 1.0
"""How long the RM's last word to an agent (``kill_host``) may take to write before the stream
ends without it. A live agent reads it at once; the bound is for one that stopped reading, and
it does not shrink with the heartbeat interval, so a loaded RM still delivers it."""


class StreamLink:
    """One agent stream seen from the RM: a bounded send queue drained by a writer task."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context
        self._queue: collections.deque[pb.RmMessage] = collections.deque()
        self._wake = asyncio.Event()
        self.closed = False
        self.last_words: pb.RmMessage | None = None
        """Written just before the stream ends with a status (``ask_kill_host``)."""
        self.ended: asyncio.Future[tuple[str, str] | None] = asyncio.get_running_loop().create_future()
        self.on_send_failure: Callable[[], None] = lambda: None

    def send_heartbeat_request(self, epoch: str, instance_id: str, seq: int) -> None:
        if self.closed:
            raise HeartbeatRpcError("the agent's stream is closed")
        if len(self._queue) >= SEND_QUEUE_LIMIT:
            raise HeartbeatRpcError("the agent is not reading its stream (send queue full)")
        request = pb.HeartbeatRequest(epoch=epoch, instance_id=instance_id, seq=seq)
        self._queue.append(pb.RmMessage(heartbeat_request=request))
        self._wake.set()

    def close(self, status: str, detail: str) -> None:
        self.finish((status, detail))

    def ask_kill_host(self, epoch: str, instance_id: str, reason: str) -> None:
        if not self.closed:
            kill = pb.KillHost(epoch=epoch, instance_id=instance_id, reason=clean_reason(reason))
            self.last_words = pb.RmMessage(kill_host=kill)

    def finish(self, status: tuple[str, str] | None) -> None:
        self.closed = True
        self._wake.set()  # the writer ends after the write in flight, if any
        if not self.ended.done():
            self.ended.set_result(status)

    async def wind_up(
        self, writer: asyncio.Task[None] | None, *, bound_s: float = LAST_WORDS_DEADLINE_S
    ) -> None:
        """After ``finish``: wait for the writer to end, then write the last word, if any, all
        within ``bound_s``.

        The writer is not cancelled mid-write: gRPC's core keeps a write cancelled in flight
        pending, and every later write on the call then fails (too many operations), which lost
        the last word when a timeout fell while a heartbeat request was being written. Only a
        writer stuck on a peer that stopped reading is cancelled, at the bound.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        if writer is not None:
            await asyncio.wait({writer}, timeout=bound_s)
            if not writer.done():
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
                return  # a write is still pending in gRPC: no other can follow it
        if self.last_words is not None:
            try:
                await asyncio.wait_for(self._context.write(self.last_words), max(0.0, deadline - loop.time()))
            except Exception as exc:  # bounded for a peer that stopped reading
                log.debug("the last word to an agent was not written: %s", one_line(repr(exc)))

    async def write_loop(self) -> None:
        while not self.closed:
            await self._wake.wait()
            self._wake.clear()
            while self._queue and not self.closed:
                try:
                    await self._context.write(self._queue.popleft())
                except Exception as exc:
                    log.debug("heartbeat request write failed: %s", one_line(repr(exc)))
                    self.on_send_failure()
                    self.finish(None)
                    return
