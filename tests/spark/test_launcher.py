"""The JVM launcher under a real spark-submit: processes start, follow their JVMs, and never take
the application down.

A process that follows its dead JVM is asserted to exit on its own, while the application still
runs (or before anything else ends it), under a deadline generous enough for a loaded machine:
how fast is not this test's business."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import sys
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from harness.apps import HOLD_APP
from harness.history_read import events, rows
from harness.procs import ours, wait_until
from harness.submit import HOLD_APP_SUM, SubmittedApp, executor_dirs
from tests.harness.frozen import FrozenRun, Phase, Probe, fast_heartbeats

APPS = Path(__file__).parent / "apps"
pytestmark = pytest.mark.spark
GENEROUS_S = 30.0
"""Seconds a process may take to follow its dead JVM on a loaded machine (it is EOF on a pipe)."""


def exited(proc: psutil.Process) -> bool:
    return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def agent_of(executor_jvm: psutil.Process) -> psutil.Process:
    agents = [
        c for c in executor_jvm.children() if "spark_plugin.processes.executor" in " ".join(c.cmdline())
    ]
    assert len(agents) == 1, f"executor pid {executor_jvm.pid} has agents {agents}"
    return agents[0]


class AgentsProbe(Probe):
    """One agent per executor, each following its JVM, on the shared run: checked at READY, when
    the run SIGKILLs executor ``killed`` (its agent sees EOF on the pipe and exits on its own, while
    the application and the other executor's agent run on) and once the application ended."""

    kills = True

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        app, tables, ready = run.app, run.tables, run.ready
        assert ready["sum"] == sum(range(100_000))
        assert ready["executors"] == 2

        # The driver-side process runs and its RM port answers.
        assert len(ours("spark_plugin.processes.driver", app.marker)) == 1
        with grpc.insecure_channel(ready["rm_address"]) as channel:
            grpc.channel_ready_future(channel).result(timeout=10)

        # One agent per executor JVM, each registered and answering the RM's heartbeat requests.
        executors = ours("CoarseGrainedExecutorBackend", app.marker)
        assert len(executors) == 2
        agents = {jvm.pid: agent_of(jvm) for jvm in executors}
        assert len(ours("spark_plugin.processes.executor", app.marker)) == 2
        assert wait_until(lambda: {e for e, k in events(tables) if k == "REGISTERED"} == {"0", "1"}, 30)
        assert wait_until(lambda: {r["executor_id"] for r in rows(tables, "heartbeats")} == {"0", "1"}, 30)
        beat = rows(tables, "heartbeats")[-1]
        assert beat["slots_total"] == 1 and beat["rss_bytes"] > 0 and beat["jvm_pulse_age_ms"] < 2000
        assert all(r["app_id"].startswith("app-") for r in rows(tables, "executor_events"))

        yield Phase.KILLED
        victim = run.jvms[run.killed]
        victim_agent = agents[victim.pid]
        survivor_agent = next(a for pid, a in agents.items() if pid != victim.pid)
        assert wait_until(lambda: exited(victim_agent), GENEROUS_S), (
            f"the agent outlived its executor JVM by more than {GENEROUS_S:g} s"
        )
        assert app.proc.poll() is None and not exited(survivor_agent)

        # The application runs on (Spark replaces the executor) and ends cleanly.
        yield Phase.ENDED
        assert run.result["sum"] == sum(range(1000))
        assert run.exit_code == 0
        assert wait_until(lambda: not ours(app=app.marker), 30), [p.cmdline() for p in ours(app=app.marker)]


def test_one_agent_per_executor_each_follows_its_jvm(frozen_run: FrozenRun) -> None:
    """See :class:`AgentsProbe`: its checks ran while the application did."""
    AGENTS.verdict()


@pytest.mark.parametrize(
    ("conf", "logged"),
    [
        ({"spark.arrowbeat.python": "/nonexistent/python3"}, "/nonexistent/python3"),
        (
            {"spark.arrowbeat.heartbeat.interval": "soon"},
            "spark.arrowbeat.heartbeat.interval='soon': expected a duration",
        ),
    ],
    ids=["bad-python", "bad-setting"],
)
def test_start_failure_is_logged_and_the_job_runs_on(
    scratch: Path, conf: dict[str, str], logged: str
) -> None:
    go = scratch / f"go-{len(logged)}"
    go.touch()
    app = SubmittedApp(HOLD_APP, "local[1]", scratch, conf=conf, args=[str(go)])
    try:
        ready = app.wait_for("APP-READY ", timeout_s=120)
        assert ready["rm_address"] is None
        assert ready["sum"] == sum(range(100_000))
        assert app.wait_for("APP-RESULT ", timeout_s=120)["sum"] == HOLD_APP_SUM
        assert app.wait(timeout_s=120) == 0
        log = app.log_text()
        assert "arrowbeat is off for this application" in log
        assert logged in log
    finally:
        app.close()


SECRET = "supervision-test-secret-0123456789"
BACKOFF_CAP_S = 2.0
"""The agents' ``heartbeat.registrationBackoff.max`` in the supervision test."""
LOADED_SLACK_S = 1.5
"""Added to interval + backoff cap for the handshake and the polling on a loaded 2-core machine."""


def _states(address: str) -> dict[str, str] | None:
    """Executor id -> state as the RM lists them, or None while it does not answer."""
    from heartbeat.rm.admin import list_executors

    try:
        return {e.executor_id: e.state for e in list_executors(address, SECRET, timeout_s=2.0)}
    except Exception:
        return None


def test_a_dead_or_hung_driver_side_process_is_restarted_and_every_executor_runs_again(scratch: Path) -> None:
    """Issue 24, item 2 (a supervised RM, like a Flink ResourceManager fail-over), on one
    local-cluster application: the driver-side process SIGKILLed six times in a row (each time as
    soon as its successor answers), then frozen (SIGSTOP) past its hang bound. Each time the JVM
    restarts it on the same address (the frozen one it detects, kills by pid and restarts); after
    the last restart answers, every executor is RUNNING again within a heartbeat interval plus the
    agents' registration backoff cap. History is kept across the restarts (the REGISTERED events
    stay, the executors come back REREGISTERED) and ``MONITORING_GAP`` rows say which intervals
    have none, and why. Before the supervision, a sixth death left arrowbeat off and a frozen RM
    was never restarted.

    Issue 36, item 4, on the same application: the RM SIGKILLed once more and its port taken at
    once by another socket. The restart serves on another port, every agent learns it through its
    JVM (agent -> executor plugin -> driver plugin over Spark's RPC) and registers there: every
    executor RUNNING again, listed by the RM at its new address, and a ``MONITORING_GAP`` for the
    outage. Before, every restart failed on the taken port and the agents dialled it for ever."""
    from spark_plugin.history.gaps import describe, parse_gap
    from spark_plugin.settings.config import load

    tables, go = scratch / "supervised-tables", scratch / "supervised-go"
    conf = {
        **fast_heartbeats(tables),
        "spark.arrowbeat.authenticate.secret": SECRET,
        "spark.arrowbeat.heartbeat.registrationBackoff.max": f"{int(BACKOFF_CAP_S * 1000)}ms",
    }
    config = load(conf)
    hang_s, interval_s = config.rm_hang_bound_s(), config.heartbeat_interval_s
    back_within_s = interval_s + BACKOFF_CAP_S + LOADED_SLACK_S
    app = SubmittedApp(HOLD_APP, "local-cluster[2,1,1024]", scratch, conf=conf, args=[str(go)])
    try:
        address = app.wait_for("APP-READY ", timeout_s=180)["rm_address"]
        both = {"0": "RUNNING", "1": "RUNNING"}
        assert wait_until(lambda: _states(address) == both, 30), _states(address)
        assert wait_until(lambda: {e for e, k in events(tables) if k == "REGISTERED"} == {"0", "1"}, 30)
        gone: set[int] = set()
        outages: list[tuple[float, str]] = []  # (wall time the process stopped, "exit" or "hung")

        def successor() -> psutil.Process | None:
            """The restarted process, once the JVM took it as started (its ready line logged) and
            its RM answers: killed earlier, it would be a failed start, which the JVM retries
            after a backoff (not what this test counts)."""
            found = [p for p in ours("spark_plugin.processes.driver", app.marker) if p.pid not in gone]
            if len(found) != 1 or not re.search(
                rf"arrowbeat driver started: .*\bpid={found[0].pid}\b", app.log_text()
            ):
                return None
            return found[0] if _states(address) is not None else None

        for _ in range(6):
            (current,) = [p for p in ours("spark_plugin.processes.driver", app.marker) if p.pid not in gone]
            gone.add(current.pid)
            outages.append((time.time(), "exit"))
            current.send_signal(signal.SIGKILL)
            current.wait(10)
            assert wait_until(lambda: successor() is not None, 60), app.log_tail()
        answered = time.monotonic()
        assert wait_until(lambda: _states(address) == both, back_within_s), (
            f"not every executor RUNNING {back_within_s:g} s after the sixth restart answered: "
            f"{_states(address)}"
        )
        assert time.monotonic() - answered <= back_within_s

        frozen = successor()
        assert frozen is not None
        gone.add(frozen.pid)
        outages.append((time.time(), "hung"))
        stopped = time.monotonic()
        frozen.suspend()
        # Detected after the hang bound (plus one check), killed (SIGKILL works on a stopped process).
        assert wait_until(lambda: exited(frozen), hang_s + 15), app.log_tail()
        assert time.monotonic() - stopped >= hang_s - 0.5, "killed before its hang bound"
        assert wait_until(lambda: successor() is not None, 60), app.log_tail()
        answered = time.monotonic()
        assert wait_until(lambda: _states(address) == both, back_within_s), _states(address)
        assert "is hung: no answer to the pulse" in app.log_text()

        # The port taken while the RM is down: its restart moves, and the agents follow it.
        moved = successor()
        assert moved is not None
        gone.add(moved.pid)
        host, port = address.rsplit(":", 1)
        outages.append((time.time(), "moved"))
        moved.send_signal(signal.SIGKILL)
        moved.wait(10)
        with taken_port(host, int(port)):
            found: list[str] = []

            def moved_to() -> bool:
                found[:] = [a for a in started_addresses(app.log_text()) if a != address]
                return bool(found) and _states(found[-1]) is not None

            assert wait_until(moved_to, 60), app.log_tail()
            answered = time.monotonic()
            new_address = found[-1]
            # Each agent first fails an attempt on the taken port (one heartbeat timeout at most),
            # asks its JVM, which asks the driver, then registers at once at the new address.
            within_s = back_within_s + config.heartbeat_timeout_s + 2 * LOADED_SLACK_S
            assert wait_until(lambda: _states(new_address) == both, within_s), (
                f"not every executor RUNNING at {new_address} {within_s:g} s after the moved RM "
                f"answered: {_states(new_address)}"
            )
            assert time.monotonic() - answered <= within_s
            took_s = time.monotonic() - answered
            print(f"moved RM {address} -> {new_address}: all RUNNING {took_s:.1f} s after it answered")
            assert "could not bind " + address + " again and serves on " + new_address in app.log_text()
            # Each executor's plugin asked the driver and told its agent, which dialled the new one.
            app_id = str(rows(tables, "executor_events")[0]["app_id"])
            for executor in both:
                text = (executor_dirs(app_id) / executor / "stderr").read_text(errors="replace")
                assert f"arrowbeat's RM is at {new_address} now" in text, text[-3000:]
                assert f"the RM moved from {address} to {new_address}" in text, text[-3000:]

        # The history: kept across the restarts, with the gaps named.
        def gaps() -> list[dict[str, Any]]:
            return [r for r in rows(tables, "executor_events") if r["event"] == "MONITORING_GAP"]

        def covered() -> bool:
            spans = [parse_gap(str(r["detail"])) for r in gaps()]
            return all(
                any(g is not None and g.start is not None and g.start <= at <= g.end for g in spans)
                for at, _ in outages
            )

        assert wait_until(covered, 30), [(r["ts"], r["detail"]) for r in gaps()]
        hung = [parse_gap(str(r["detail"])) for r in gaps() if "hung: no answer" in str(r["detail"])]
        assert hung and all(g is not None and g.lost_rows >= 0 and g.seconds for g in hung), hung
        assert all(r["executor_id"] == "" and r["app_id"].startswith("app-") for r in gaps())
        print("\n".join(describe(g) for g in (parse_gap(str(r["detail"])) for r in gaps()) if g))
        assert [k for _, k in events(tables)].count("REGISTERED") == 2, "history was not kept across restarts"
        # The last re-registrations are recorded with the next heartbeat (TaskEvents holds them).
        assert wait_until(lambda: {e for e, k in events(tables) if k == "REREGISTERED"} == {"0", "1"}, 10)
        app.finish_hold(go, timeout_s=180)
    finally:
        app.close()


@contextlib.contextmanager
def taken_port(host: str, port: int, within_s: float = 10.0) -> Iterator[list[socket.socket]]:
    """Listening sockets on ``port`` at every address ``host`` resolves to, and at ::1 for
    ``localhost`` (gRPC's resolver adds it and binds each: one taken leaves the RM on the other),
    which a process that just died held: retried until the kernel let go of it; closed on exit.
    They accept nothing: an agent dialling them times out."""
    deadline = time.monotonic() + within_s
    squatters: list[socket.socket] = []
    addresses = [(f, k, p, w) for f, k, p, _, w in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    if host == "localhost" and socket.has_ipv6:
        addresses.append((socket.AF_INET6, socket.SOCK_STREAM, 0, ("::1", port, 0, 0)))
    try:
        for family, kind, proto, where in dict.fromkeys(addresses):
            while True:
                squatter = socket.socket(family, kind, proto)
                squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    squatter.bind(where)
                    squatter.listen()
                    squatters.append(squatter)
                    break
                except OSError:
                    squatter.close()
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        yield squatters
    finally:
        for squatter in squatters:
            squatter.close()


def started_addresses(log_text: str) -> list[str]:
    """The addresses the driver-side processes announced, in order (the JVM logs each ready line)."""
    return re.findall(r"arrowbeat driver started: \{[^}]*\baddress=([^,} ]+)", log_text)


def test_a_failed_first_start_is_retried_and_every_executor_runs_once_it_does(scratch: Path) -> None:
    """Issue 36, item 4: the RM's pinned port (``spark.arrowbeat.rm.port``) taken when the
    application starts. The first start fails (the process exits: not a refused setting) and the
    driver plugin starts it again, rate-limited as restarts are, while the executors' plugins, told
    the RM is pending, ask the driver for its address and start their agents once it runs: after the
    port is freed, every executor RUNNING, and a ``MONITORING_GAP`` says why nothing was monitored
    before. Before, arrowbeat stayed off for the application's life."""
    from spark_plugin.history.gaps import parse_gap

    tables, go = scratch / "first-start-tables", scratch / "first-start-go"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = {
        **fast_heartbeats(tables),
        "spark.arrowbeat.authenticate.secret": SECRET,
        "spark.arrowbeat.heartbeat.registrationBackoff.max": f"{int(BACKOFF_CAP_S * 1000)}ms",
        "spark.arrowbeat.rm.port": str(port),
    }
    app = SubmittedApp(HOLD_APP, "local-cluster[2,1,1024]", scratch, conf=conf, args=[str(go)])
    try:
        with taken_port("localhost", port):
            ready = app.wait_for("APP-READY ", timeout_s=180)
            assert ready["rm_address"] is None and ready["executors"] == 2  # pending, the jobs run
            failed = "arrowbeat's driver-side process did not start; it is started again"
            assert wait_until(lambda: failed in app.log_text(), 30), app.log_tail()
            assert wait_until(lambda: "could not be started (retried in" in app.log_text(), 30), (
                app.log_tail()
            )
            assert not started_addresses(app.log_text())
        assert wait_until(lambda: bool(started_addresses(app.log_text())), 60), app.log_tail()
        (address,) = started_addresses(app.log_text())
        assert address.endswith(f":{port}")  # a first start keeps the pinned port
        freed = time.monotonic()
        both = {"0": "RUNNING", "1": "RUNNING"}
        assert wait_until(lambda: _states(address) == both, 90), (_states(address), app.log_tail())
        print(
            f"first start retried: every executor RUNNING {time.monotonic() - freed:.1f} s after the RM ran"
        )

        def gap() -> list[Any]:
            found = [r for r in rows(tables, "executor_events") if r["event"] == "MONITORING_GAP"]
            return [parse_gap(str(r["detail"])) for r in found]

        assert wait_until(lambda: any(g and "the first start failed" in g.cause for g in gap()), 30), gap()
        app.finish_hold(go, timeout_s=180)
    finally:
        app.close()


def test_the_driver_side_process_follows_a_killed_driver_jvm(scratch: Path) -> None:
    """The driver JVM SIGKILLed (spark-submit execs the JVM, so that is its pid): the kernel
    closes the driver-side process's stdin and it exits on its own (before ``app.close`` would
    end it), leaving no orphan."""
    go = scratch / "driver-kill-go"
    app = SubmittedApp(HOLD_APP, "local[1]", scratch, args=[str(go)])
    try:
        assert app.wait_for("APP-READY ", timeout_s=120)["rm_address"]
        (driver_side,) = ours("spark_plugin.processes.driver", app.marker)
        jvm = psutil.Process(app.proc.pid)
        assert "SparkSubmit" in " ".join(jvm.cmdline()) and driver_side.ppid() == jvm.pid
        jvm.send_signal(signal.SIGKILL)
        assert wait_until(lambda: exited(driver_side), GENEROUS_S), (
            f"the driver-side process outlived its driver JVM by more than {GENEROUS_S:g} s"
        )
    finally:
        app.close()


def test_an_unwritable_tables_path_is_named_and_monitoring_runs_on(scratch: Path) -> None:
    """History off (one error naming the path), the RM on: the agent registers and heartbeats in
    memory, and the application finishes normally."""
    blocker = scratch / "tables-is-a-file"
    blocker.write_text("not a directory")
    go = scratch / "unwritable-go"
    app = SubmittedApp(
        HOLD_APP,
        "local[1]",
        scratch,
        conf={"spark.arrowbeat.tables.path": str(blocker / "tables")},
        args=[str(go)],
    )
    try:
        ready = app.wait_for("APP-READY ", timeout_s=120)
        assert ready["rm_address"], "the RM must run without its history tables"
        named = [line for line in app.log_text().splitlines() if "history tables off" in line]
        assert len(named) == 1 and str(blocker) in named[0], app.log_tail()
        registered = re.compile(r"executor driver \(.*\): REGISTERED")
        assert wait_until(lambda: registered.search(app.log_text()), 30), app.log_tail()
        app.finish_hold(go, timeout_s=120)
    finally:
        app.close()


def noisy_python(scratch: Path) -> Path:
    """An interpreter for ``spark.arrowbeat.python`` that runs arrowbeat's modules through
    ``apps/noisy_child.py`` (command-like lines on stdout, stderr, in the log and on the channel)."""
    script = scratch / "noisy-python"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -u "{APPS / "noisy_child.py"}" "$@"\n')
    script.chmod(0o700)
    return script


class NoisyProbe(Probe):
    """Issue 13, item 5, on the shared ``onHeartbeatTimeout=kill`` run (the JVM acts on
    ``kill-executor``):

    - the driver-side process writes ``ARROWBEAT-CMD kill-executor 1`` with ``print``,
      ``os.write(1)``, to stderr and in its log once executor 1 has registered, and malformed
      commands straight onto its protocol channel (``apps/noisy_child.py``);
    - each agent writes a well-formed ``kill-executor 1`` onto its own protocol channel;
    - a peer holding the secret registers as executor ``intruder`` and unregisters with the
      reason ``"bye\\nARROWBEAT-CMD kill-executor 1"``, which the RM logs and records.

    Executor 1 must survive all of it, the refusals are logged once (rate-limited), and the
    channel still works: executor 0, frozen by the run, is killed and replaced through the one
    real command. Every injected line is waited for in the JVM's log (so the JVM has read it), and
    a line that had reached the command channel would have been acted on before the real command
    behind it on the same channel."""

    scenario = "kill"

    def __init__(self) -> None:
        super().__init__()
        self.secret = "known-" + uuid.uuid4().hex

    def conf(self) -> dict[str, str]:
        return {
            "spark.arrowbeat.python": str(noisy_python(self.folder)),
            "spark.arrowbeat.authenticate.secret": self.secret,
        }

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        from heartbeat import AgentThread

        app, tables, ready = run.app, run.tables, run.ready
        assert ready["executors"] == 2
        assert wait_until(lambda: "NOISE-DONE" in app.log_text(), 60), app.log_tail()

        intruder = AgentThread(ready["rm_address"], self.secret, executor_id="intruder")
        intruder.start()
        assert intruder.wait_registered(30), intruder.error
        intruder.stop(reason="bye\nARROWBEAT-CMD kill-executor 1")
        assert wait_until(lambda: ("intruder", "UNREGISTERED") in events(tables), 30), events(tables)
        assert wait_until(
            lambda: "kill-executor 1" in app.log_text().rpartition("executor intruder")[2], 30
        ), app.log_tail()

        yield Phase.REMOVED  # the run froze executor 0 and Spark removed it
        assert run.frozen == "0"
        survivor = run.jvms["1"]
        removed = run.removed
        assert removed["executor_id"] == "0", removed

        log = app.log_text().splitlines()
        kills = [line for line in log if "asked Spark to kill and replace executor" in line]
        assert len(kills) == 1 and "executor 0: accepted" in kills[0], kills
        assert survivor.is_running() and survivor.status() != psutil.STATUS_ZOMBIE
        # The stray prints and the log lines are in the log, as log lines of the driver-side process.
        injected = [line for line in log if line.endswith("[arrowbeat driver] ARROWBEAT-CMD kill-executor 1")]
        assert len(injected) >= 3, [line for line in log if "kill-executor" in line]
        # What reached the protocol channel was refused, and said once (rate-limited).
        refused = [line for line in log if "arrowbeat driver wrote" in line and "ignored" in line]
        assert len(refused) == 1, refused
        # The reason is recorded, on one line.
        (bye,) = [
            r["detail"]
            for r in rows(tables, "executor_events")
            if r["executor_id"] == "intruder" and r["event"] == "UNREGISTERED"
        ]
        assert "\n" not in bye and bye.endswith("ARROWBEAT-CMD kill-executor 1"), bye

        yield Phase.ENDED
        assert run.result["sum"] == sum(range(1000))
        assert run.exit_code == 0
        removed_later = [line for line in run.later_stdout if line.startswith("SPARK-EXECUTOR-REMOVED ")]
        assert all('"executor_id": "1"' not in line for line in removed_later), removed_later
        agent_logs = [p.read_text(errors="replace") for p in executor_dirs(run.app_id).glob("*/stderr")]
        # Each agent's kill-executor was refused: by its channel when it came before the executor
        # plugin wired the agent's commands (right after the ready line: a race), else by them.
        refusals = (
            "wrote a command, but it may give none on its protocol channel; ignored",
            "may not give command kill-executor; ignored",
        )
        assert any(refusal in text for text in agent_logs for refusal in refusals), [
            line for text in agent_logs for line in text.splitlines() if "kill-executor" in line
        ]


AGENTS, NOISY = AgentsProbe(), NoisyProbe()
FROZEN_PROBES = (AGENTS, NOISY)


def test_log_lines_and_stray_prints_cannot_command_the_jvm(frozen_kill_run: FrozenRun) -> None:
    """See :class:`NoisyProbe`: its checks ran while the application did."""
    NOISY.verdict()
