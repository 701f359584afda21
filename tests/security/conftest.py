"""A real agent process (data + control ports) and a rendezvous, attacked over loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.procs import wait_until
from tests.security.attack import SECRET


class AgentProcess:
    """``tests.security.agent_proc`` running in its own process; its log is a file."""

    def __init__(self, root: Path, log: Path) -> None:
        self.log = log
        self._log_file = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.security.agent_proc", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(SECRET + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the agent process did not start: {log.read_text()[-2000:]}"
        self.info: dict[str, Any] = json.loads(line)
        self.address = {name: tuple(self.info[name]) for name in ("data", "control", "rendezvous")}

    def refusals(self, port: str) -> dict[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("refusals\n")
        self.proc.stdin.flush()
        counts: dict[str, int] = json.loads(self.proc.stdout.readline())[port]
        return counts

    def refused(self, port: str, cause: str) -> int:
        return self.refusals(port).get(cause, 0)

    def wait_refused(self, port: str, cause: str, at_least: int, timeout_s: float = 30.0) -> bool:
        return wait_until(lambda: self.refused(port, cause) >= at_least, timeout_s, 0.1)

    def log_lines(self, text: str) -> list[str]:
        self._log_file.flush()
        return [line for line in self.log.read_text().splitlines() if text in line]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(18)  # SIGCONT: a stopped process cannot read "quit"
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log_file.close()


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentProcess]:
    folder = tmp_path_factory.mktemp("agent")
    proc = AgentProcess(folder / "root", folder / "agent.log")
    yield proc
    proc.stop()
