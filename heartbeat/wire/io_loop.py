"""The process's one asyncio loop for heartbeat I/O.

grpc.aio drives its completion queue from a single event loop per process: a second loop in
another thread makes it log ``BlockingIOError`` from its poller and can lose wake-ups. So the RM
server and every ``AgentThread`` in a process share this loop, started lazily on a daemon
thread. Nothing needs to initialise it; other grpc.aio users in the process should use it too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def io_loop() -> asyncio.AbstractEventLoop:
    """The shared loop, started on first use (and again if its thread died)."""
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            _thread = threading.Thread(target=run, name="heartbeat-io", daemon=True)
            _thread.start()
            ready.wait()
            _loop = loop
        return _loop


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Run ``coro`` on the shared loop; refuses to be called from that loop (it would deadlock)."""
    loop = io_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise RuntimeError("blocking heartbeat call made from the heartbeat I/O loop itself")
    return asyncio.run_coroutine_threadsafe(coro, loop)
