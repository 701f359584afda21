"""Finding and ending the processes a test run started, and only those.

Every process of the run inherits ``ARROWBEAT_TEST_RUN`` (set by ``harness.env.prepare``):
Spark JVMs, executors launched by the local-cluster Worker, and arrowbeat's Python processes under
them. That marker finds them even after they are re-parented to init, without touching anyone
else's; ``ARROWBEAT_TEST_APP`` narrows it to one spark-submit application.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

import psutil

MARKER = "ARROWBEAT_TEST_RUN"


APP_MARKER = "ARROWBEAT_TEST_APP"


def ours(role: str = "", app: str | None = None) -> list[psutil.Process]:
    """Live processes of this run whose command line contains ``role`` (of one app, if given)."""
    token = os.environ.get(MARKER, "")
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.pid == me:
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            if not token or env.get(MARKER) != token or role not in " ".join(proc.cmdline()):
                continue
            if app is None or env.get(APP_MARKER) == app:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def executor_jvms(app: str | None = None) -> dict[str, psutil.Process]:
    """Executor id -> executor JVM (of one app, if given), from their command lines
    (``CoarseGrainedExecutorBackend ... --executor-id N``): the processes a test freezes or kills."""
    found = {}
    for proc in ours("CoarseGrainedExecutorBackend", app):
        with contextlib.suppress(psutil.Error, ValueError, IndexError):
            args = proc.cmdline()
            found[args[args.index("--executor-id") + 1]] = proc
    return found


POLL_S, POLL_MAX_S = 0.05, 1.0


def wait_until(condition: Callable[[], object], timeout_s: float, interval_s: float | None = None) -> bool:
    """Polls ``condition`` until it is truthy or ``timeout_s`` passes; returns whether it held.

    With ``interval_s`` given, it polls at that fixed pace. Otherwise every ``POLL_S`` (50 ms), but
    never sooner than twice what the last poll took (up to ``POLL_MAX_S``): many conditions read a
    whole Delta table, and polled back to back through a minute-long scenario they kept one of the
    machine's two cores busy. A cheap condition (a file, a process state) is still seen within
    50 ms, which tests that act the moment a state appears (kill an executor while a task holds)
    rely on."""
    deadline = time.monotonic() + timeout_s
    while True:
        started = time.monotonic()
        if condition():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        if interval_s is None:
            time.sleep(min(max(POLL_S, 2 * (now - started)), POLL_MAX_S, deadline - now))
        else:
            time.sleep(interval_s)


def freeze(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOPs ``pid`` and returns once the kernel shows it stopped: the signal is delivered
    asynchronously, and a call made in between would still be answered."""
    os.kill(pid, signal.SIGSTOP)
    stopped = wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, timeout_s, 0.005)
    if not stopped:
        raise AssertionError(f"process {pid} not stopped {timeout_s}s after SIGSTOP")


def end(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGCONT (a stopped process ignores SIGTERM), SIGTERM, then SIGKILL what is left."""
    for proc in procs:
        try:
            proc.resume()
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
