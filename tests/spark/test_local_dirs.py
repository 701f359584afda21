"""Map outputs live on the executor's own local disks, as Spark resolved them, and agents serve
them on ports a firewall can allow (issue 15, items 1 and 6).

The driver computes no path: the agent is told its executor's local dirs by its JVM, the Python
workers by PySpark (``SPARK_LOCAL_DIRS``), and map outputs are spread over all of them. Also the
pieces without Spark: several roots, a bad one skipped, discovery across roots, one TTL per
shuffle across its folders.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from pathlib import Path

import pyarrow as pa
import pytest

from arrow_shuffle.errors import ShuffleConfigError, UnsafePathError
from arrowbeat_base.clock import ManualClock
from harness.submit import SubmittedApp
from spark_plugin.settings.config import ConfigError, load
from spark_plugin.shuffle.agent.service import PORT_TRIES, MapOutputService, bind_from
from spark_plugin.shuffle.agent_layout import owned_output, spread_dir
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.worker.agent_client import announced_agents, find_agent

APP = "app-dirs"
SECRET = "s" * 32
SCHEMA = pa.schema([("k", pa.int64())])


def _write(path: str) -> list[tuple[int, int, list[int]]]:
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 20)
    writer.write(pa.record_batch([pa.array(range(10), pa.int64())], schema=SCHEMA))
    return writer.finish()[0].segments


def test_an_agent_spreads_over_its_roots_skips_a_bad_one_and_is_found_through_any(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where a local dir should be")
    roots = [
        str(blocked / "arrowbeat"),
        str(tmp_path / "d1" / "arrowbeat"),
        str(tmp_path / "d2" / "arrowbeat"),
    ]
    clock = ManualClock(start=1_000.0, wall_start=time.time())  # file times are wall clock
    service = MapOutputService(APP, "5", SECRET, roots, jvm_pid=os.getpid(), clock=clock, ttl_s=60.0)
    try:
        assert service.dirs == (f"{roots[1]}/{APP}/5", f"{roots[2]}/{APP}/5")
        assert any(str(blocked) in r.getMessage() for r in caplog.records)  # named, then skipped
        # Announced under the first usable root, found by a worker looking through all of them.
        announced = announced_agents(roots, APP)
        assert [a.output_dirs for a in announced] == [service.dirs]
        # Both dirs get outputs; each is served, a path outside both is not.
        with pytest.raises(UnsafePathError):
            service.stage(7, 0, SCHEMA, [(str(tmp_path / "d1" / "elsewhere.arrows"), [(0, 1)])])
        chosen = {spread_dir(service.dirs, 7, m) for m in range(16)}
        assert chosen == set(service.dirs)
        paths = [os.path.join(d, "s7", f"m{i}.arrows") for i, d in enumerate(service.dirs)]
        segments = [_write(p) for p in paths]
        pid = service.stage(7, 0, SCHEMA, list(zip(paths, segments, strict=True)))
        service.unstage(pid)
        # One TTL per shuffle: a read of its folder on d2 keeps its folder on d1 too.
        clock.jump(120.0)
        os.utime(os.path.dirname(paths[1]), (clock.time(), clock.time()))
        assert service.sweep() == 0 and all(os.path.exists(p) for p in paths)
        clock.jump(120.0)
        assert service.sweep() > 0 and not any(os.path.exists(p) for p in paths)
    finally:
        service.close()
    assert not any(os.path.exists(d) for d in service.dirs)


def test_no_usable_root_is_an_error_naming_each(tmp_path: Path) -> None:
    files = []
    for name in ("a", "b"):
        (tmp_path / name).write_text("x")
        files.append(str(tmp_path / name / "arrowbeat"))
    with pytest.raises(
        ShuffleConfigError, match=rf"no usable shuffle directory for executor 1: {files[0]}.*{files[1]}"
    ):
        MapOutputService(APP, "1", SECRET, files, jvm_pid=1)


def test_find_agent_looks_under_every_root(tmp_path: Path) -> None:
    with pytest.raises(ShuffleConfigError) as error:
        find_agent([str(tmp_path / "x"), str(tmp_path / "y")], APP, wait_s=0.0)
    assert f"{tmp_path}/x/{APP}/agents" in str(error.value) and f"{tmp_path}/y/{APP}" in str(error.value)


def test_pinned_shuffle_ports_are_taken_in_turn_by_the_agents_of_one_host(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a free port to start from; the agents take it and the next ones
        probe.bind(("127.0.0.1", 0))
        first = probe.getsockname()[1]
    services = []
    try:
        for executor in ("1", "2"):
            services.append(
                MapOutputService(
                    APP, executor, SECRET, str(tmp_path / "r"), jvm_pid=int(executor), port=first
                )
            )
        ports = [(s.data_address[1], s.control_address[1]) for s in services]
        assert ports[0] == (first, first + 1)
        assert ports[1][0] > first + 1 and ports[1][1] > ports[1][0]
        assert max(ports[1]) < first + PORT_TRIES
    finally:
        for service in services:
            service.close()


def test_ports_stay_in_the_window_and_other_bind_errors_pass_through() -> None:
    taken = set(range(100, 131))  # all but the window's last port

    def bind(port: int) -> int:
        if port in taken:
            raise OSError(errno.EADDRINUSE, "in use")
        return port

    assert bind_from(100, bind) == 131
    with pytest.raises(
        ShuffleConfigError, match=r"no free port in 100\.\.130 .*spark.arrowbeat.shuffle.port"
    ):
        bind_from(100, bind, last=130)

    def refused(port: int) -> int:
        raise OSError(errno.EACCES, "permission denied")

    with pytest.raises(PermissionError):
        bind_from(100, refused)


def test_a_map_output_under_a_linked_local_dir_is_read_and_a_look_alike_is_not(tmp_path: Path) -> None:
    """Spark hands over its local dirs as configured: one may be a link (a YARN or macOS local dir)."""
    real = tmp_path / "disk"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    service = MapOutputService(APP, "5", SECRET, str(tmp_path / "link" / "arrowbeat"), jvm_pid=os.getpid())
    try:
        path = os.path.join(service.dir, "s7", "m0.arrows")
        _write(path)
        assert owned_output(path, APP, "5", 7) == os.path.realpath(path)
        for wrong in ((APP, "6", 7), (APP, "5", 8), ("app-other", "5", 7)):
            with pytest.raises(UnsafePathError, match="is not a map output"):
                owned_output(path, *wrong)
        os.chmod(os.path.dirname(path), 0o755)  # a shuffle folder others may read: not ours alone
        with pytest.raises(UnsafePathError, match="must be 0700"):
            owned_output(path, APP, "5", 7)
    finally:
        service.close()


def test_a_bad_shuffle_port_is_named_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"spark.arrowbeat.shuffle.port=70000: expected an integer port"):
        load({"spark.arrowbeat.shuffle.port": "70000"})


@pytest.mark.spark
def test_map_outputs_are_spread_over_sparks_local_dirs(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real application whose Spark local dirs are two folders (SPARK_LOCAL_DIRS, as a host with
    two disks sets it): the shuffle's files are in both, none elsewhere, and gone after release."""
    dirs = [str(scratch / "local-dirs" / "disk1"), str(scratch / "local-dirs" / "disk2")]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", ",".join(dirs))
    app = SubmittedApp(Path(__file__).parent / "apps" / "local_dirs_app.py", "local[2]", scratch, args=dirs)
    try:
        result = app.wait_for("APP-RESULT ", 240)
        assert app.wait(60) == 0, app.log_tail()
    finally:
        app.close()
    assert result["equal"] is True
    assert all(result["held"][d] > 0 for d in dirs), json.dumps(result)
    assert all(result["after"][d] == 0 for d in dirs) and result["freed"] > 0, json.dumps(result)
