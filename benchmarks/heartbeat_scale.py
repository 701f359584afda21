"""How many executors can one heartbeat RM serve at interval 1 s with p99 RTT < 100 ms?

Runs the RM in one process and simulated executors in ``--clients`` load processes (each hosting
many ``AsyncAgent``s on one grpc.aio loop, one TCP connection per agent). Steps the executor count
up; each step runs for ``--step-seconds`` after all agents registered and reports p99 RTT (as the
RM measures it), lost executors (false timeouts) and RM CPU per heartbeat. Stops at the first
failing step. Ends with ``RESULT`` lines. Note the load generator shares the machine's cores.

    .venv/bin/python -m benchmarks.heartbeat_scale [--steps 250,500,1000,2000,3000] [--step-seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

SECRET_ENV = "ARROWBEAT_SECRET"


# ---- RM role -------------------------------------------------------------------------------


def run_rm(args: argparse.Namespace) -> None:
    from heartbeat import EventKind, ExecutorEvent, HeartbeatRecord, HeartbeatServices, ResourceManagerServer

    lock = threading.Lock()
    rtts: list[float] = []
    lost: list[str] = []

    def on_event(event: ExecutorEvent | HeartbeatRecord) -> None:
        with lock:
            if isinstance(event, HeartbeatRecord):
                rtts.append(event.rtt_ms)
            elif event.kind in (EventKind.HEARTBEAT_TIMEOUT, EventKind.UNREACHABLE):
                lost.append(event.executor_id)

    services = HeartbeatServices(args.interval, args.timeout, 2)
    rm = ResourceManagerServer(services, secret=os.environ[SECRET_ENV], host="127.0.0.1", port=0)
    rm.subscribe(on_event)
    print(f"ADDRESS {rm.start()}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "RESET":
            with lock:
                rtts.clear()
            print("OK", flush=True)
        elif command == "STATS":
            times = os.times()
            with lock:
                sample = sorted(rtts)
                lost_count = len(lost)
            running = sum(1 for e in rm.executors() if e.state == "RUNNING")
            stats = {
                "running": running,
                "count": len(sample),
                "p50": _percentile(sample, 0.50),
                "p99": _percentile(sample, 0.99),
                "max": sample[-1] if sample else 0.0,
                "lost": lost_count,
                "cpu_s": times.user + times.system,
            }
            print(json.dumps(stats), flush=True)
        elif command == "QUIT":
            break
    rm.stop(grace_s=0.5)


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


# ---- load role -----------------------------------------------------------------------------


def run_load(args: argparse.Namespace) -> None:
    asyncio.run(_load_main(args))


async def _load_main(args: argparse.Namespace) -> None:
    from heartbeat import AsyncAgent, HeartbeatServices, RetryPolicy, static_provider

    services = HeartbeatServices(args.interval, args.timeout, 2)
    policy = RetryPolicy(min_delay_s=0.2, max_delay_s=2.0, deadline_s=120.0, attempt_timeout_s=10.0)
    provider = static_provider(
        {"slots_total": 4, "slots_busy": 1, "running_tasks": 1, "shuffle.pool.used": 3.0}
    )
    agents: list[AsyncAgent] = []
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode().strip():
        if line.startswith("SCALE "):
            target = int(line.split()[1])
            while len(agents) < target:
                agent = AsyncAgent(
                    args.rm,
                    os.environ[SECRET_ENV],
                    f"{args.prefix}-{len(agents)}",
                    services=services,
                    payload_providers=[provider],
                    retry_policy=policy,
                )
                agents.append(agent)
                tasks.append(asyncio.create_task(agent.run()))
                if len(agents) % 50 == 0:
                    await asyncio.sleep(0.05)  # spread the registration burst
            deadline = loop.time() + 90.0
            while loop.time() < deadline and sum(a.registration is not None for a in agents) < target:
                await asyncio.sleep(0.1)
            registered = sum(a.registration is not None for a in agents)
            print(f"OK {registered} {sum(a.error is not None for a in agents)}", flush=True)
        elif line == "CPU":
            times = os.times()
            print(f"CPU {times.user + times.system}", flush=True)
        elif line == "QUIT":
            break
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---- coordinator ---------------------------------------------------------------------------


@dataclass
class Child:
    """A role process we talk to line by line over its stdin/stdout."""

    proc: subprocess.Popen[str]

    @classmethod
    def start(cls, *role_args: str) -> Child:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.heartbeat_scale", *role_args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        return cls(proc)

    def send(self, line: str) -> None:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    def read(self) -> str:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"child {self.proc.args!r} exited with {self.proc.poll()}")
        return line.strip()

    def ask(self, line: str) -> str:
        self.send(line)
        return self.read()

    def end(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("QUIT")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


def coordinate(args: argparse.Namespace) -> int:
    os.environ[SECRET_ENV] = secrets.token_hex(16)
    common = ["--interval", str(args.interval), "--timeout", str(args.timeout)]
    rm = Child.start("rm", *common)
    clients: list[Child] = []
    best: dict[str, Any] | None = None
    capped = False  # True: the time budget ended the climb, so max_executors is a lower bound
    started = time.monotonic()
    try:
        address = rm.read().split()[1]
        clients = [
            Child.start("load", "--rm", address, "--prefix", f"c{i}", *common) for i in range(args.clients)
        ]
        for count in [int(s) for s in args.steps.split(",")]:
            if time.monotonic() - started > args.budget_s:
                print(f"step {count}: skipped, time budget of {args.budget_s:.0f} s used up", flush=True)
                capped = True
                break
            result = run_step(rm, clients, count, args)
            for _ in range(args.repeat_failed):
                if result["ok"] or result["lost"] or result["running"] != count:
                    break
                print(f"step executors={count}: p99 {result['p99']:.1f} ms, measuring again", flush=True)
                result = run_step(rm, clients, count, args)
            print(
                f"step executors={count} registered={result['running']} heartbeats={result['count']} "
                f"p50={result['p50']:.1f}ms p99={result['p99']:.1f}ms max={result['max']:.1f}ms "
                f"lost={result['lost']} rm_cpu_us/hb={result['rm_cpu_us']:.0f} "
                f"load_cpu={result['load_cpu']:.2f}cores ok={result['ok']}",
                flush=True,
            )
            if not result["ok"]:
                break
            best = {**result, "executors": count}
    finally:
        for child in [*clients, rm]:
            child.end()
    print(f"RESULT max_executors={best['executors'] if best else 0}")
    print(f"RESULT p99_rtt_ms={best['p99'] if best else float('nan'):.2f}")
    print(f"RESULT rm_cpu_us_per_heartbeat={best['rm_cpu_us'] if best else float('nan'):.1f}")
    print(f"RESULT capped_by_time_budget={int(capped)}")
    return 0


def run_step(rm: Child, clients: list[Child], count: int, args: argparse.Namespace) -> dict[str, Any]:
    share = [count // len(clients) + (1 if i < count % len(clients) else 0) for i in range(len(clients))]
    for client, n in zip(clients, share, strict=True):
        client.send(f"SCALE {n}")
    replies = [client.read() for client in clients]
    registered = sum(int(r.split()[1]) for r in replies)
    lost_before = json.loads(rm.ask("STATS"))["lost"]
    time.sleep(args.warmup_s)  # let the registration burst settle before measuring
    rm.ask("RESET")
    cpu0 = json.loads(rm.ask("STATS"))["cpu_s"]
    load0 = sum(float(c.ask("CPU").split()[1]) for c in clients)
    t0 = time.monotonic()
    time.sleep(args.step_seconds)
    stats = json.loads(rm.ask("STATS"))
    elapsed = time.monotonic() - t0
    load1 = sum(float(c.ask("CPU").split()[1]) for c in clients)
    expected = count * elapsed / args.interval
    stats["rm_cpu_us"] = (stats["cpu_s"] - cpu0) / max(1, stats["count"]) * 1e6
    stats["load_cpu"] = (load1 - load0) / elapsed
    stats["ok"] = (
        registered == count
        and stats["running"] == count
        and stats["lost"] == 0  # cumulative since the RM started: any false timeout fails
        and lost_before == 0
        and stats["p99"] < args.p99_limit_ms
        and stats["count"] >= 0.9 * expected
    )
    return dict(stats)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("role", nargs="?", default="coordinate", choices=["coordinate", "rm", "load"])
    parser.add_argument("--steps", default="250,500,1000,2000,3000,3500,4000")
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--p99-limit-ms", type=float, default=100.0)
    parser.add_argument("--budget-s", type=float, default=200.0, help="start no new step after this")
    parser.add_argument(
        "--repeat-failed",
        type=int,
        default=1,
        help="re-measure a step that failed only on latency (other tenants share the cores)",
    )
    parser.add_argument("--rm", help="(load role) RM address")
    parser.add_argument("--prefix", default="c0", help="(load role) executor id prefix")
    args = parser.parse_args()
    if args.role == "rm":
        run_rm(args)
        return 0
    if args.role == "load":
        run_load(args)
        return 0
    return coordinate(args)


if __name__ == "__main__":
    sys.exit(main())
