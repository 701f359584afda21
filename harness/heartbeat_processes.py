"""Heartbeat roles as child processes: an agent (``heartbeat.agent.main``) and an RM
(``harness.rm_process``), for the process tests and ``benchmarks/detection_latency.py``.

What a child prints arrives on a reader thread: the agent's lines on a queue, the RM's events
and heartbeat records in a ``Collector``. The caller ends every child it started with ``reap``.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, HeartbeatServices, Payload
from heartbeat.agent.main import SECRET_ENV

REPO = Path(__file__).resolve().parents[1]
LOST = (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE)


class Collector:
    """Subscriber that keeps events and lets tests wait on a condition with a deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[ExecutorEvent] = []
        self.records: list[HeartbeatRecord] = []

    def __call__(self, event: ExecutorEvent | HeartbeatRecord) -> None:
        with self._cond:
            if isinstance(event, HeartbeatRecord):
                self.records.append(event)
            else:
                self.events.append(event)
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(predicate, timeout_s)

    def find(self, kind: EventKind, executor_id: str) -> list[ExecutorEvent]:
        with self._cond:
            return [e for e in self.events if e.kind is kind and e.executor_id == executor_id]

    def wait_event(
        self, kind: EventKind, executor_id: str, timeout_s: float, count: int = 1
    ) -> ExecutorEvent:
        deadline = time.monotonic() + timeout_s
        ok = self.wait_for(
            lambda: len(self.find(kind, executor_id)) >= count, max(0.0, deadline - time.monotonic())
        )
        assert ok, f"no {kind.value} #{count} for {executor_id} within {timeout_s} s; saw {self.events}"
        return self.find(kind, executor_id)[count - 1]


def first_loss(events: Collector, executor_id: str, timeout_s: float) -> ExecutorEvent | None:
    """The earliest event reporting ``executor_id`` lost, waiting up to ``timeout_s`` for one."""
    if not events.wait_for(lambda: any(events.find(k, executor_id) for k in LOST), timeout_s):
        return None
    return min((e for k in LOST for e in events.find(k, executor_id)), key=lambda e: e.ts)


def _collect_lines(proc: subprocess.Popen[str], into: list[str]) -> None:
    """Appends each line of ``proc``'s stderr (its log) to ``into`` until the pipe closes."""
    assert proc.stderr is not None
    for line in proc.stderr:
        into.append(line.rstrip("\n"))


def _timing_args(services: HeartbeatServices) -> list[str]:
    return ["--interval", str(services.interval_s), "--timeout", str(services.timeout_s)]


def _phi_args(services: HeartbeatServices) -> list[str]:
    """The RM's phi detector, if on (its other settings follow from the interval there)."""
    phi = services.phi
    if phi is None:
        return []
    return ["--phi-threshold", str(phi.threshold), "--phi-pause", str(phi.acceptable_pause_s)]


class AgentProcess:
    """One ``python -m heartbeat.agent.main`` child; its stdout lines arrive on a queue."""

    def __init__(
        self,
        rm_address: str,
        executor_id: str,
        services: HeartbeatServices,
        secret: str,
        *,
        secret_file: Path | None = None,
        capture_stderr: bool = False,
    ) -> None:
        """The secret goes in the environment, or only through ``secret_file`` if one is given;
        ``capture_stderr``: the agent's log lines land in ``stderr_lines``."""
        self.executor_id = executor_id
        env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "heartbeat.agent.main",
                *("--rm", rm_address, "--executor-id", executor_id),
                *_timing_args(services),
                *("--retry-min", "0.05", "--retry-max", "0.2", "--retry-deadline", "30"),
                *(("--secret-file", str(secret_file)) if secret_file is not None else ()),
            ],
            cwd=REPO,
            env=env if secret_file is not None else {**env, SECRET_ENV: secret},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if capture_stderr else subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr_lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        if capture_stderr:
            threading.Thread(target=_collect_lines, args=(self.proc, self.stderr_lines), daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(prefix):
                return line
        raise AssertionError(f"agent {self.executor_id} printed no {prefix} line within {timeout_s} s")

    def signal(self, sig: signal.Signals) -> float:
        """Sends ``sig``; returns the wall time taken just *before* it, so anything it causes is later."""
        sent_after = time.time()
        os.kill(self.proc.pid, sig)
        return sent_after

    def reap(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class RmProcess:
    """One ``python -m harness.rm_process`` child; what it prints lands in ``events``.

    Heartbeat records carry the executor, instance, time and RTT the RM printed, not the payload.
    Times are the RM's wall clock, comparable with this process's ``time.time()`` on one machine.
    """

    def __init__(
        self, services: HeartbeatServices, secret: str, port: int = 0, log_level: str | None = None
    ) -> None:
        """``log_level``: capture the RM's log (stderr) at that level in ``stderr_lines``."""
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.rm_process",
                *("--port", str(port), "--rpc-failure-threshold", str(services.rpc_failure_threshold)),
                *_timing_args(services),
                *_phi_args(services),
                *(("--log-level", log_level) if log_level else ()),
            ],
            cwd=REPO,
            env={**os.environ, SECRET_ENV: secret},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if log_level else None,
            text=True,
        )
        self.events = Collector()
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._ready: queue.Queue[list[str]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        if log_level:
            threading.Thread(target=_collect_lines, args=(self.proc, self.stderr_lines), daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout_lines.append(line.rstrip("\n"))
            word, *fields = line.rstrip("\n").split(" ", 6)
            if word == "READY":
                self._ready.put(fields)
            elif word == "EVENT":
                kind, executor_id, instance_id, ts, host, detail = fields
                self.events(ExecutorEvent(EventKind(kind), executor_id, host, instance_id, float(ts), detail))
            elif word == "HEARTBEAT":
                executor_id, instance_id, ts, rtt_ms = fields
                self.events(
                    HeartbeatRecord(executor_id, "", instance_id, float(ts), float(rtt_ms), Payload())
                )

    def wait_ready(self, timeout_s: float) -> RmProcess:
        """Sets ``address``, ``epoch`` and ``started_at`` (the RM's wall clock once it served)."""
        try:
            self.address, self.epoch, started_at = self._ready.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"the RM process printed no READY within {timeout_s} s") from None
        self.started_at = float(started_at)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def reap(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
