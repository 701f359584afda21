"""Without Spark: the Connect-session shim, the agent's secret desk, the status rows as write
reports and the stage-id shuffle ids (``spark_plugin.compat.connect``, ``local_secret``,
``map_task.write_reports``, ``session``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from arrow_shuffle.errors import (
    PeerLostError,
    ShuffleAuthenticationError,
    ShuffleConfigError,
    ShuffleError,
    UnsafePathError,
)
from arrow_shuffle.private_files import write_private_atomic
from spark_plugin.compat.connect import is_connect
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import agent_file, app_dir
from spark_plugin.shuffle.driver import session
from spark_plugin.shuffle.local_secret import SecretDesk, secret_from_agent
from spark_plugin.shuffle.plan import STATUS_SCHEMA
from spark_plugin.shuffle.worker.agent_client import read_agent_file, secret_of
from spark_plugin.shuffle.worker.map_task import REPORT_COLUMNS, write_reports

SECRET = "a-secret-of-the-application-0123456789"
CHILD = (
    "import sys\n"
    "from spark_plugin.shuffle.local_secret import secret_from_agent\n"
    "from arrow_shuffle.errors import ShuffleError\n"
    "try:\n"
    "    print('GOT', secret_from_agent(sys.argv[1], 'the test agent'))\n"
    "except ShuffleError as exc:\n"
    "    print('REFUSED', type(exc).__name__)\n"
)


def ask_from_child(name: str) -> str:
    """What a child process of this one (a descendant, as a worker is of its JVM) is told."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


@pytest.fixture
def desk() -> Iterator[SecretDesk]:
    """A desk whose "executor JVM" is this test process: its children are its workers."""
    serving = SecretDesk(SECRET, os.getpid())
    yield serving
    serving.close()


def test_a_descendant_of_the_jvm_gets_the_secret(desk: SecretDesk) -> None:
    assert ask_from_child(desk.name) == f"GOT {SECRET}"
    assert desk.handed == 1


def test_a_process_outside_the_jvms_tree_is_refused() -> None:
    # A live process that is not an ancestor of this one: it waits for its stdin to close.
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    serving = SecretDesk(SECRET, other.pid)
    try:
        with pytest.raises(ShuffleAuthenticationError, match="refused this process"):
            secret_from_agent(serving.name, "the test agent")
        assert serving.handed == 0
    finally:
        serving.close()
        assert other.stdin is not None
        other.stdin.close()
        other.wait(timeout=30)


def test_the_jvm_itself_is_not_its_own_worker(desk: SecretDesk) -> None:
    with pytest.raises(ShuffleAuthenticationError):
        secret_from_agent(desk.name, "the test agent")


def test_a_closed_desk_is_a_lost_peer_and_a_bad_name_is_refused_before_connecting(desk: SecretDesk) -> None:
    name = desk.name
    desk.close()
    with pytest.raises(PeerLostError, match="did not answer"):
        secret_from_agent(name, "the test agent", timeout_s=2.0)
    with pytest.raises(ShuffleConfigError, match="not a secret desk's name"):
        secret_from_agent("../../etc", "the test agent")


def test_a_desk_needs_a_jvm_and_a_secret() -> None:
    with pytest.raises(ShuffleConfigError):
        SecretDesk(SECRET, 0)
    with pytest.raises(ShuffleConfigError):
        SecretDesk("", os.getpid())


def test_the_agent_names_its_desk_in_the_discovery_file_and_serves_its_workers(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    service = MapOutputService("app-1", "3", SECRET, str(root), jvm_pid=os.getpid())
    try:
        info = read_agent_file(agent_file(str(root), "app-1", os.getpid()), app_dir(str(root), "app-1"))
        assert info.secret_socket
        assert ask_from_child(info.secret_socket) == f"GOT {SECRET}"
        with pytest.raises(ShuffleAuthenticationError):  # this process is the "JVM", not a worker
            secret_of(info)
    finally:
        service.close()
    with pytest.raises(PeerLostError):  # closed with its service
        secret_from_agent(info.secret_socket, "the test agent", timeout_s=2.0)


def test_without_a_jvm_pid_there_is_no_desk_and_a_keyless_task_is_told_why(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    service = MapOutputService("app-1", "3", SECRET, str(root), jvm_pid=0)
    try:
        info = read_agent_file(agent_file(str(root), "app-1", 0), app_dir(str(root), "app-1"))
        assert info.secret_socket == ""
        with pytest.raises(ShuffleConfigError, match="offers no secret desk"):
            secret_of(info)
    finally:
        service.close()


def test_a_discovery_file_naming_anything_but_a_desk_is_not_trusted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    service = MapOutputService("app-1", "3", SECRET, str(root), jvm_pid=os.getpid())
    try:
        path = agent_file(str(root), "app-1", os.getpid())
        data = json.loads(Path(path).read_text())
        data["secret_socket"] = "/run/somebody-elses.sock"
        write_private_atomic(path, json.dumps(data).encode())
        with pytest.raises(UnsafePathError, match="secret_socket"):
            read_agent_file(path, app_dir(str(root), "app-1"))
    finally:
        service.close()


class ClassicLike:
    _jsc = object()
    sparkContext = object()


class ContextOnly:
    """The unit tests' fake sessions: a SparkContext-like attribute, no py4j."""

    sparkContext = object()


class ConnectLike:
    """A session that has neither (what a Connect session lacks, whatever its class)."""


def test_a_session_is_connect_by_what_it_is() -> None:
    assert not is_connect(ClassicLike())
    assert not is_connect(ContextOnly())
    assert is_connect(ConnectLike())


def test_connect_sessions_of_pyspark_are_recognised_by_class() -> None:
    module = pytest.importorskip("pyspark.sql.connect.session", exc_type=ImportError)
    fake = module.SparkSession.__new__(module.SparkSession)  # never connected: only its class matters
    assert is_connect(fake)


def test_write_reports_are_rebuilt_from_status_rows() -> None:
    def rows(map_index: int, attempt: str, executor: str, sizes: list[int]) -> list[dict[str, object]]:
        return [
            {
                "rk": 0,
                "reduce": r,
                "map": map_index,
                "attempt": attempt,
                "executor": executor,
                "host": "127.0.0.1",
                "data_port": 1,
                "control_port": 4000 + int(executor),
                "path": "/x",
                "segments": "[]",
                "bytes": size,
                "batches": 1,
                "rows": size // 10,
                "spill_bytes": 5,
                "seconds": 0.25,
            }
            for r, size in enumerate(sizes)
        ]

    table = pa.Table.from_pylist(
        rows(1, "3.11.0", "1", [100, 200]) + rows(0, "3.10.0", "0", [10, 0]), schema=STATUS_SCHEMA
    )
    reports = write_reports(table.select(list(REPORT_COLUMNS)))
    assert [(r["partition"], r["attempt"], r["stage"]) for r in reports] == [
        (0, "3.10.0", 3),
        (1, "3.11.0", 3),
    ]
    assert [(r["bytes"], r["batches"], r["rows"]) for r in reports] == [(10, 2, 1), (300, 2, 30)]
    assert reports[1]["control"] == ["127.0.0.1", 4001] and reports[1]["executor"] == "1"
    assert (reports[0]["spill_bytes"], reports[0]["seconds"], reports[0]["recomputed"]) == (5, 0.25, False)


def test_stage_ids_become_shuffle_ids_above_sparks_own() -> None:
    assert session.shuffle_id_from_stage(0) == 1 << 30
    assert session.shuffle_id_from_stage(41) == (1 << 30) + 41
    assert session.shuffle_id_from_stage((1 << 30) - 1) == (1 << 31) - 1  # still an int32
    with pytest.raises(ShuffleError, match="no room"):
        session.shuffle_id_from_stage(1 << 30)
