"""Running a real ``spark-submit`` application with the flags ``python -m spark_plugin conf`` prints."""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from harness.env import local_cluster_work
from harness.procs import APP_MARKER, end, ours
from harness.session import DELTA_SNAPSHOT_PARTITIONS

SPARK_SUBMIT = str(Path(sys.executable).parent / "spark-submit")
HOLD_APP_SUM = sum(range(1000))
"""What ``harness/apps/hold_app.py`` reports as its last job's ``sum``."""


def executor_dirs(app_id: str) -> Path:
    """Where the application's executors wrote their stdout and stderr: local-cluster's Workers
    use ``$SPARK_HOME/work`` (the run's own, ``harness.env``), a stand-alone Worker
    ``SPARK_WORKER_DIR``."""
    for base in (os.environ.get("SPARK_WORKER_DIR", ""), str(local_cluster_work())):
        if base and (Path(base) / app_id).is_dir():
            return Path(base) / app_id
    raise AssertionError(f"no executor directory of {app_id}")


_printed: dict[frozenset[tuple[str, str]], str] = {}


def printed_flags() -> list[str]:
    """Exactly what a user copies: the output of ``python -m spark_plugin conf``, run once per
    environment it could depend on (some twenty applications of a test session ask for it)."""
    key = frozenset(os.environ.items())
    if key not in _printed:
        _printed[key] = subprocess.run(
            [sys.executable, "-m", "spark_plugin", "conf"], check=True, capture_output=True, text=True
        ).stdout
    return shlex.split(_printed[key])


class SubmittedApp:
    """One spark-submit process; its stdout is read line by line on a thread. ``env`` adds to
    this process's environment (e.g. ``SPARK_CONF_DIR``)."""

    def __init__(
        self,
        app: Path,
        master: str,
        scratch: Path,
        conf: dict[str, str] | None = None,
        args: list[str] | None = None,
        main_class: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.marker = uuid.uuid4().hex
        self.log_path = scratch / f"spark-submit-{self.marker[:8]}.log"
        base = {
            "spark.executor.memory": "512m",
            "spark.driver.memory": "512m",
            "spark.ui.enabled": "false",
            # Spark's 200 would be 200 tasks per aggregation (and 200 state stores per streaming
            # one, as in the jobs' executor_health) on one or two test cores; build_session's 4.
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.warehouse.dir": str(scratch / "warehouse"),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={scratch / 'derby'}",
            DELTA_SNAPSHOT_PARTITIONS[0]: DELTA_SNAPSHOT_PARTITIONS[1],
        }
        base.update(conf or {})
        command = [SPARK_SUBMIT, "--master", master, *printed_flags()]
        for key, value in base.items():
            command += ["--conf", f"{key}={value}"]
        if main_class:  # ``app`` is then a jar (standalone cluster mode takes no .py file)
            command += ["--class", main_class]
        command += [str(app), *(args or [])]
        process_env = {**os.environ, **(env or {}), APP_MARKER: self.marker}
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=process_env,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, prefix: str, timeout_s: float) -> dict[str, Any]:
        """The JSON after the first stdout line starting with ``prefix``."""
        try:
            while True:
                line = self._lines.get(timeout=timeout_s)
                if line is None:
                    raise AssertionError(f"application exited before {prefix!r}:\n{self.log_tail()}")
                if line.startswith(prefix):
                    return json.loads(line[len(prefix) :])  # type: ignore[no-any-return]
        except queue.Empty:
            raise AssertionError(f"no {prefix!r} within {timeout_s}s:\n{self.log_tail()}") from None

    def finish_hold(self, go: Path, timeout_s: float = 180) -> None:
        """Ends a ``hold_app.py`` application's hold: touches ``go``, then asserts its last job's
        result (``APP-RESULT``, the sum of 0..999) and its exit status 0."""
        go.touch()
        assert self.wait_for("APP-RESULT ", timeout_s=timeout_s)["sum"] == HOLD_APP_SUM
        assert self.wait(timeout_s=120) == 0

    def stdout_lines(self) -> list[str]:
        """Every stdout line not consumed by ``wait_for``; call after the application exited."""
        lines = []
        while (line := self._lines.get(timeout=30)) is not None:
            lines.append(line)
        return lines

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def close(self) -> None:
        """Ends the application and everything it started, by pid."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        end(ours(app=self.marker))
        self._log.close()
