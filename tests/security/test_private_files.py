"""Private files, tried as another local user would: real directories, real modes, real owners.

The test machine runs as root, so "another user" is a file ``chown``ed to ``nobody``'s uid; the
checks compare owners with ``os.geteuid()``, so root is refused a foreign-owned root like anyone.
Every attack must be refused with a typed error naming the path (or id), and write nothing.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle.errors import ShuffleConfigError, ShuffleError, UnsafeIdError, UnsafePathError
from arrow_shuffle.private_files import (
    check_id,
    create_private_file,
    private_root,
    read_private_file,
    resolve_inside,
    write_private_atomic,
)
from spark_plugin.shuffle.agent import service as agent_service
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import (
    agent_file,
    agent_identity,
    default_root,
    shuffle_root,
    shuffle_roots,
)
from spark_plugin.shuffle.map_output import MapOutputWriter
from spark_plugin.shuffle.plan import ShufflePlan
from spark_plugin.shuffle.worker import agent_client
from spark_plugin.shuffle.worker.agent_client import AgentInfo, MapOutputClient, announced_agents, find_agent
from spark_plugin.shuffle.worker.map_task import map_function
from spark_plugin.shuffle.worker.reduce_task import ReadStats, read_partitions

SECRET = "private-files-test-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])
OTHER_UID = 65534  # nobody
APP = "app-priv"


needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="a file owned by another uid needs root to create (the test machine runs as root)",
)


def data(n: int = 200) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array(range(n), pa.int64()), pa.array([f"v{i % 7}" for i in range(n)])], schema=SCHEMA
    )


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def walk(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every entry under ``root`` (itself included), without following links."""
    yield root, os.lstat(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            yield path, os.lstat(path)


def assert_private(root: Path) -> int:
    entries = 0
    for path, st in walk(root):
        entries += 1
        assert st.st_uid == os.geteuid(), f"{path} is owned by uid {st.st_uid}"
        assert not stat.S_ISLNK(st.st_mode), f"{path} is a symlink"
        if stat.S_ISDIR(st.st_mode):
            assert stat.S_IMODE(st.st_mode) == 0o700, f"{path} is {stat.S_IMODE(st.st_mode):o}"
        else:
            assert stat.S_ISREG(st.st_mode), f"{path} is neither a file nor a directory"
            assert stat.S_IMODE(st.st_mode) == 0o600, f"{path} is {stat.S_IMODE(st.st_mode):o}"
    return entries


def foreign(path: Path) -> Path:
    """``path``, now owned by another user (the link itself if it is one)."""
    os.lchown(path, OTHER_UID, OTHER_UID)
    return path


def announcement(app: Path, executor: str = "9", **override: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "executor_id": executor,
        "host": "127.0.0.1",
        "data_port": 4000,
        "control_port": 4001,
        "dir": str(app / executor),
        **agent_identity(),  # a live process: a discovery file naming a dead one is ignored
    }
    info.update(override)
    return info


@pytest.fixture
def service(tmp_path: Path) -> Iterator[MapOutputService]:
    """An agent whose executor JVM is pytest's parent: a task run here finds it like a worker."""
    svc = MapOutputService(APP, "3", SECRET, str(tmp_path / "a" / "root"), jvm_pid=os.getppid())
    yield svc
    svc.close()


# -- what arrowbeat creates ------------------------------------------------------------------------
def test_every_path_under_the_root_is_private_after_a_map_task_and_discovery(
    service: MapOutputService, tmp_path: Path
) -> None:
    """The real map-task body (find the agent, write the map output) and the agent's discovery
    file: the root, the missing parent created with it, every folder 0700, every file 0600, ours."""
    plan = ShufflePlan(
        APP,
        11,
        service.root,
        SECRET,
        ("k",),
        3,
        SCHEMA.serialize().to_pybytes(),
        (0, 1, 2),
        read_host_local=False,
    )
    reports: list[dict[str, Any]] = []
    statuses = list(map_function(plan, reports.append)(iter([data(), data(50)])))
    assert reports and reports[0]["rows"] == 250 and statuses[0].num_rows == 3
    root = Path(service.root)
    outputs = list(root.rglob("*.arrows"))
    assert len(outputs) == 1 and outputs[0].parent == Path(service.dir) / "s11"
    assert (root / APP / "agents" / f"{os.getppid()}.json").is_file()
    assert assert_private(tmp_path / "a") >= 7  # a, root, app, agents, executor, s11 + 2 files
    # A staged stream reads it back through the agent: the private file is served to the app.
    path = str(outputs[0])
    segments = json.loads(statuses[0].column("segments")[0].as_py())
    got = read_partitions(
        plan,
        {
            0: [
                {
                    "map": 0,
                    "attempt": "0.0.0",
                    "executor": "3",
                    "host": service.data_address[0],
                    "data_port": service.data_address[1],
                    "control_port": service.control_address[1],
                    "path": path,
                    "segments": json.dumps(segments),
                    "bytes": 1,
                }
            ]
        },
        AgentInfo("4", "127.0.0.1", 0, 0, ""),
        ReadStats(),
    )
    assert sum(b.num_rows for b in got) == int(statuses[0].column("rows")[0].as_py())


def test_roots_are_the_executors_own_local_dirs_and_resolved_in_one_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Python worker: PySpark sets SPARK_LOCAL_DIRS to its executor's block manager folders.
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/disk1/blockmgr-a,/disk2/blockmgr-b")
    assert shuffle_roots("") == ["/disk1/blockmgr-a/arrowbeat", "/disk2/blockmgr-b/arrowbeat"]
    assert shuffle_root("") == "/disk1/blockmgr-a/arrowbeat"
    # The agent: what its JVM handed over wins over its own environment.
    assert shuffle_roots("", "/d3/blockmgr-c,,/d3/blockmgr-c") == ["/d3/blockmgr-c/arrowbeat"]
    # The override: one root, the same on every host.
    assert shuffle_roots("relative/dir", "/d3/x") == [os.path.abspath("relative/dir")]
    # Not under Spark at all: the per-user default.
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    assert Path(default_root()).name == f"arrowbeat-{os.geteuid()}"
    assert shuffle_roots("") == [default_root()]


# -- the root ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode_bits", "owner", "why"),
    [
        pytest.param(0o700, OTHER_UID, "owned by uid 65534", marks=needs_root),
        (0o777, os.geteuid(), "writable by group or others"),
        (0o1777, os.geteuid(), "writable by group or others"),
        (0o770, os.geteuid(), "writable by group or others"),
    ],
    ids=["foreign-owned", "world-writable", "world-writable-sticky", "group-writable"],
)
def test_an_unsafe_root_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, mode_bits: int, owner: int, why: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.chmod(root, mode_bits)
    os.chown(root, owner, -1)
    with pytest.raises(UnsafePathError, match=rf"shuffle root {re.escape(str(root))} .*{why}"):
        MapOutputService(APP, "1", SECRET, str(root), jvm_pid=101)
    assert list(root.iterdir()) == []
    # The reading side does not trust it either: a task fails at once naming it, the driver
    # ignores it (one warning).
    with pytest.raises(UnsafePathError, match=re.escape(str(root))):
        find_agent(str(root), APP, wait_s=0.0)
    assert announced_agents(str(root), APP) == []


def test_a_root_that_is_a_symlink_is_refused_and_nothing_is_written_through_it(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    link = tmp_path / "root"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match=rf"shuffle root {re.escape(str(link))} is a symlink"):
        MapOutputService(APP, "1", SECRET, str(link), jvm_pid=102)
    assert list(target.iterdir()) == []


def test_a_root_below_a_world_writable_parent_without_sticky_bit_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(
        UnsafePathError,
        match=rf"{re.escape(str(shared))}, a parent of shuffle root {re.escape(str(shared))}/r/root",
    ):
        private_root(str(shared / "r" / "root"))
    assert list(shared.iterdir()) == []
    os.chmod(shared, 0o1777)  # like /tmp: others cannot move what we own
    assert private_root(str(shared / "r" / "root")) == str(shared / "r" / "root")
    assert mode(shared / "r") == 0o700 and mode(shared / "r" / "root") == 0o700


def test_an_existing_root_of_ours_that_only_we_write_is_accepted(tmp_path: Path) -> None:
    """An administrator's data directory (0755) is fine: what arrowbeat creates inside is 0700."""
    root = tmp_path / "data"
    root.mkdir()
    os.chmod(root, 0o755)
    svc = MapOutputService(APP, "1", SECRET, str(root), jvm_pid=103)
    try:
        assert mode(root) == 0o755 and mode(root / APP) == 0o700
    finally:
        svc.close()


# -- planted symlinks and foreign folders below the root ------------------------------------------------
@pytest.mark.parametrize("where", [APP, f"{APP}/agents", f"{APP}/1"])
def test_a_symlink_planted_for_a_folder_is_refused_and_nothing_is_written_through_it(
    tmp_path: Path, where: str
) -> None:
    root = tmp_path / "root"
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    root.mkdir(mode=0o700)
    if where != APP:
        (root / APP).mkdir(mode=0o700)
    (root / where).symlink_to(victim)
    with pytest.raises(UnsafePathError, match=rf"{re.escape(str(root / where))} is a symlink"):
        MapOutputService(APP, "1", SECRET, str(root), jvm_pid=104)
    assert list(victim.iterdir()) == []


@needs_root
def test_a_folder_another_user_made_in_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / APP).mkdir(parents=True, mode=0o700)
    foreign(root / APP)
    with pytest.raises(UnsafePathError, match=rf"{re.escape(str(root / APP))} is owned by uid {OTHER_UID}"):
        MapOutputService(APP, "1", SECRET, str(root), jvm_pid=105)
    assert list((root / APP).iterdir()) == []


def test_a_symlink_planted_for_a_map_output_is_refused_and_its_target_untouched(
    service: MapOutputService, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    folder = Path(service.dir) / "s1"
    folder.mkdir(mode=0o700)
    planted = folder / "m0.arrows"
    planted.symlink_to(victim)
    with pytest.raises(UnsafePathError, match=rf"{re.escape(str(planted))} already exists"):
        MapOutputWriter(str(planted), SCHEMA, ["k"], 2, 1 << 20)
    dangling = folder / "m1.arrows"
    dangling.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(UnsafePathError, match=re.escape(str(dangling))):
        MapOutputWriter(str(dangling), SCHEMA, ["k"], 2, 1 << 20)
    assert victim.read_text() == "precious" and not (tmp_path / "would-be-created").exists()


def test_a_symlink_planted_for_the_discovery_file_is_replaced_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    agents = root / APP / "agents"
    agents.mkdir(parents=True, mode=0o700)
    for folder in (root, root / APP):
        os.chmod(folder, 0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (agents / "106.json").symlink_to(victim)
    svc = MapOutputService(APP, "1", SECRET, str(root), jvm_pid=106)
    try:
        assert victim.read_text() == "precious"
        assert stat.S_ISREG(os.lstat(agents / "106.json").st_mode) and mode(agents / "106.json") == 0o600
    finally:
        svc.close()


# -- ids -----------------------------------------------------------------------------------------
BAD_IDS = ["", ".", "..", "a/b", "../x", "/abs", "a\\b", "a\x00b", "x" * 129, "line\nbreak", "sp ace"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
@pytest.mark.parametrize("which", ["application id", "executor id"])
def test_an_id_that_is_not_a_path_component_is_refused_naming_it(
    tmp_path: Path, bad: str, which: str
) -> None:
    root = tmp_path / "root"
    app, executor = (bad, "1") if which == "application id" else (APP, bad)
    with pytest.raises(UnsafeIdError, match=rf"^{which} .*cannot be a path component") as caught:
        MapOutputService(app, executor, SECRET, str(root), jvm_pid=107)
    assert "\n" not in str(caught.value) and "\x00" not in str(caught.value)
    assert not root.exists()  # ids are checked before anything is created


def test_check_id_takes_spark_ids_and_refuses_the_rest() -> None:
    for good in (
        "app-20240101010101-0000",
        "local-1700000000000",
        "application_1_0001",
        "driver",
        "7",
        0,
        42,
    ):
        assert check_id(good, "id") == str(good)
    for bad in (-1, True, None, 1.5):
        with pytest.raises(UnsafeIdError, match="shuffle id"):
            check_id(bad, "shuffle id")
    with pytest.raises(UnsafeIdError, match="executor JVM pid -3"):
        agent_file("/r", APP, -3)
    with pytest.raises(UnsafeIdError, match="discovery folder"):
        MapOutputService(APP, "agents", SECRET, "/nonexistent/never", jvm_pid=1)


def test_release_of_a_negative_shuffle_id_is_refused(service: MapOutputService) -> None:
    with pytest.raises(UnsafeIdError, match="shuffle id -1"):
        service.release_shuffle(-1)


# -- discovery files -------------------------------------------------------------------------------
def _plant(agents: Path, name: str, content: dict[str, Any] | str) -> Path:
    path = agents / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.chmod(path, 0o600)
    return path


@needs_root
def test_untrusted_discovery_files_are_ignored_with_one_log_line(
    service: MapOutputService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = Path(service.root)
    app = root / APP
    agents = app / "agents"
    (app / "9").mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(announcement(app)))
    planted = {
        "foreign": foreign(_plant(agents, "901.json", announcement(app))),
        "group-writable": _plant(agents, "902.json", announcement(app)),
        "world-writable": _plant(agents, "903.json", announcement(app)),
        "symlink": agents / "904.json",
        "fifo": agents / "905.json",
        "oversized": _plant(agents, "906.json", json.dumps(announcement(app)) + " " * 5000),
        "not-json": _plant(agents, "907.json", "{'executor_id': 9}"),
        "not-an-object": _plant(agents, "908.json", "[1, 2]"),
        "port-as-string": _plant(agents, "909.json", announcement(app, data_port="4000")),
        "port-out-of-range": _plant(agents, "910.json", announcement(app, control_port=70000)),
        "bool-port": _plant(agents, "911.json", announcement(app, data_port=True)),
        "dir-elsewhere": _plant(agents, "912.json", announcement(app, dir="/etc")),
        "dir-of-another-executor": _plant(agents, "913.json", announcement(app, dir=str(app / "3"))),
        "bad-executor-id": _plant(agents, "914.json", announcement(app, executor="../9")),
        "host-with-newline": _plant(agents, "915.json", announcement(app, host="a\nb")),
    }
    os.chmod(planted["group-writable"], 0o620)
    os.chmod(planted["world-writable"], 0o602)
    planted["symlink"].symlink_to(elsewhere)
    os.mkfifo(planted["fifo"], 0o600)
    with caplog.at_level(logging.WARNING, logger=agent_client.__name__):
        for _ in range(3):  # the driver asks again and again: still one line a minute
            found = announced_agents(str(root), APP)
            assert [a.executor_id for a in found] == ["3"]  # only the real agent
    lines = [r for r in caplog.records if "untrusted discovery file" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    # Every kind is refused on its own (read one by one, not through the limiter), naming the file.
    trusted = []
    for kind, path in planted.items():
        try:
            agent_client.read_agent_file(str(path), str(app))
        except UnsafePathError as exc:
            assert str(path) in str(exc), kind
        else:
            trusted.append(kind)
    assert trusted == []


@needs_root
def test_a_task_never_trusts_a_planted_discovery_file_at_its_jvms_name(tmp_path: Path) -> None:
    """pytest's parent plays the executor JVM: files at its pid that are not ours are not an agent."""
    root = tmp_path / "root"
    app = root / APP
    agents = app / "agents"
    agents.mkdir(parents=True, mode=0o700)
    for folder in (root, app):
        os.chmod(folder, 0o700)
    (app / "9").mkdir(mode=0o700)
    path = _plant(agents, f"{os.getppid()}.json", announcement(app))
    assert find_agent(str(root), APP, wait_s=0.0).executor_id == "9"  # ours: trusted
    foreign(path)
    with pytest.raises(ShuffleConfigError, match="no arrowbeat agent found"):
        find_agent(str(root), APP, wait_s=0.0)
    os.lchown(path, os.geteuid(), os.getegid())
    os.chmod(path, 0o666)
    with pytest.raises(ShuffleConfigError, match="no arrowbeat agent found"):
        find_agent(str(root), APP, wait_s=0.0)


def test_read_private_file_checks_the_file_it_opened(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_private_atomic(str(path), b"hello")
    assert read_private_file(str(path), 5) == b"hello" and mode(path) == 0o600
    with pytest.raises(UnsafePathError, match="more than 4"):
        read_private_file(str(path), 4)
    assert not [p for p in tmp_path.iterdir() if p.name != "f"]  # no temp file left
    with pytest.raises(FileNotFoundError):
        read_private_file(str(tmp_path / "missing"), 5)
    with pytest.raises(UnsafePathError, match="already exists"):
        create_private_file(str(path))


# -- paths a peer names ----------------------------------------------------------------------------
def test_stage_serves_only_files_inside_the_agents_folder(
    service: MapOutputService, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = Path(service.dir) / "s2"
    own.mkdir(mode=0o700)
    writer = MapOutputWriter(str(own / "m0.arrows"), SCHEMA, ["k"], 1, 1 << 20)
    writer.write(data(10))
    segments = writer.finish()[0].segments
    secret_file = tmp_path / "secret.arrows"
    secret_file.write_bytes((own / "m0.arrows").read_bytes())
    (own / "link.arrows").symlink_to(secret_file)
    neighbour = Path(service.dir).parent / "agents" / f"{os.getppid()}.json"
    outside = [
        str(secret_file),
        "/etc/passwd",
        f"{service.dir}/../agents/{os.getppid()}.json",
        str(neighbour),
        str(own / "link.arrows"),
        "relative/m0.arrows",
        f"{service.dir}/s2/m0.arrows\x00",
        service.dir,
    ]
    with caplog.at_level(logging.WARNING, logger=agent_service.__name__):
        for path in outside:
            with pytest.raises(UnsafePathError, match=r"not .*inside"):
                service.stage(2, 0, SCHEMA, [(path, segments)])
    assert len([r for r in caplog.records if "refused to stage" in r.getMessage()]) == 1  # rate-limited
    # Over the control channel, as a reducer of the application would ask.
    with MapOutputClient(service.control_address, SECRET, "test") as client:
        for path in (str(secret_file), "/etc/passwd"):
            with pytest.raises(ShuffleError, match="not inside"):
                client.stage(2, 0, SCHEMA, [(path, segments)])
        assert client.metrics()["shuffle_streams_staged"] == 0  # nothing was staged
        client.unstage(client.stage(2, 0, SCHEMA, [(str(own / "m0.arrows"), segments)]))  # ours: served


def test_a_host_local_read_of_anything_but_its_executors_map_output_is_refused(
    service: MapOutputService, tmp_path: Path
) -> None:
    """A status row names a file on another executor's disks (the driver never knew those paths):
    it is read only if it has the layout of a map output of that executor and shuffle."""

    def map_output(path: Path) -> dict[str, Any]:
        writer = MapOutputWriter(str(path), SCHEMA, ["k"], 1, 1 << 20)
        writer.write(data(10))
        outs = writer.finish()
        status = {"map": 0, "attempt": "1.0.0", "executor": "3", "host": "127.0.0.1", "data_port": 1}
        status.update({"control_port": 1, "path": str(path), "segments": json.dumps(outs[0].segments)})
        status["bytes"] = outs[0].bytes
        return status

    plan = ShufflePlan(APP, 3, service.root, SECRET, ("k",), 1, SCHEMA.serialize().to_pybytes(), (0,))
    me = AgentInfo("4", "127.0.0.1", 0, 0, "")  # another executor on the same host
    own = Path(service.dir) / "s3"
    loose = map_output(tmp_path / "other.arrows")
    wrong_shuffle = map_output(Path(service.dir) / "s2" / "m0.arrows")
    link = own / "m1.arrows"
    own.mkdir(mode=0o700, exist_ok=True)
    link.symlink_to(tmp_path / "other.arrows")
    through_link = dict(loose, path=str(link))
    for status in (loose, wrong_shuffle, through_link):
        with pytest.raises(UnsafePathError, match=r"is not a map output of shuffle 3 of executor 3"):
            list(read_partitions(plan, {0: [status]}, me, ReadStats()))
    good = map_output(own / "m0.arrows")
    assert sum(b.num_rows for b in read_partitions(plan, {0: [good]}, me, ReadStats())) == 10


def test_resolve_inside_is_not_fooled_by_a_common_prefix(tmp_path: Path) -> None:
    (tmp_path / "app2").mkdir()
    (tmp_path / "app2" / "f").write_text("x")
    with pytest.raises(UnsafePathError):
        resolve_inside(str(tmp_path / "app"), str(tmp_path / "app2" / "f"))
    with pytest.raises(UnsafePathError, match="int"):
        resolve_inside(str(tmp_path), 7)
