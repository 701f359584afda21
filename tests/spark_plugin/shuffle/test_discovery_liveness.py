"""Issue 24: an agent's discovery file names a live agent or is ignored. The file names the agent
process (pid and start time); once that process is gone (killed, before its JVM restarts it) or
its pid belongs to another process, a worker does not trust the file: it waits for the restarted
agent's own, and a driver listing the agents leaves it out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arrow_shuffle.errors import ShuffleConfigError
from arrow_shuffle.private_files import write_private_atomic
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import agent_file, app_dir, names_live_agent
from spark_plugin.shuffle.worker.agent_client import (
    StaleAgentFileError,
    announced_agents,
    find_agent,
    read_agent_file,
)

SECRET = "a-secret-of-the-application-0123456789"
APP = "app-liveness"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MapOutputService]:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    # This process's parent plays the executor JVM: this process is then one of its "workers".
    agent = MapOutputService(APP, "3", SECRET, str(root), jvm_pid=os.getppid())
    try:
        yield agent
    finally:
        agent.close()


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)
    return child.pid


def rewrite(service: MapOutputService, **identity: object) -> str:
    path = agent_file(service.root, APP, os.getppid())
    data = json.loads(Path(path).read_text())
    data.update(identity)
    write_private_atomic(path, json.dumps(data).encode())
    return path


def test_the_file_of_a_running_agent_is_trusted(service: MapOutputService) -> None:
    path = agent_file(service.root, APP, os.getppid())
    data = json.loads(Path(path).read_text())
    assert data["pid"] == os.getpid() and names_live_agent(data)
    assert read_agent_file(path, app_dir(service.root, APP)).executor_id == "3"
    assert find_agent(service.root, APP, wait_s=1.0).executor_id == "3"


@pytest.mark.parametrize("case", ["dead-pid", "reused-pid", "no-identity"])
def test_a_file_naming_no_running_agent_is_ignored(service: MapOutputService, case: str) -> None:
    started = json.loads(Path(agent_file(service.root, APP, os.getppid())).read_text())["started"]
    if case == "dead-pid":
        path = rewrite(service, pid=dead_pid())
    elif case == "reused-pid":  # the pid now names another process: not the one started then
        path = rewrite(service, started=started - 3600.0)
    else:  # an announcement that names no process at all
        path = rewrite(service, pid=None, started=None)
    with pytest.raises(StaleAgentFileError, match="not running"):
        read_agent_file(path, app_dir(service.root, APP))
    with pytest.raises(ShuffleConfigError, match="no arrowbeat agent found"):
        find_agent(service.root, APP, wait_s=0.3)
    assert announced_agents(service.root, APP) == []
