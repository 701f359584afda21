"""Where an executor's shuffle files and its agent's discovery file live: the one layout shared by
the agent (``agent.service``), the Python workers that find it (``agent_client``) and the tasks
that write map outputs and read them host-locally (``tasks``).

``<root>/<app>/<executor>/s<shuffle>/<name>.arrows`` holds an executor's map outputs;
``<root>/<app>/agents/<jvm pid>.json`` announces the agent of the executor JVM with that pid, so
Python workers, children of the same executor JVM, find it by walking their parent chain
(``agent_client.find_agent``). The file names the agent process itself (``agent_identity``: its
pid and start time) and is trusted only while that very process runs (``names_live_agent``): the
file of an agent that died (killed, before its JVM restarts it) names nobody and is ignored, and
a reused pid does not revive it.

Where (``shuffle_roots``): on each executor's own local disks, found from the executor's side and
never from a path computed on the driver. By default Spark's local directories of that executor
(its block manager's folders, where Spark keeps its own shuffle files: ``spark.local.dir``,
``SPARK_LOCAL_DIRS``, YARN's ``LOCAL_DIRS``, a Worker's ``SPARK_EXECUTOR_DIRS`` as Spark resolved
them), ``arrowbeat/`` in each. The JVM plugin hands them to the agent; PySpark hands the same list
to every Python worker of the executor as ``SPARK_LOCAL_DIRS``. With several, map outputs are
spread over them (a hash of shuffle and map partition, as Spark spreads its files); one that is
missing or not writable is skipped with a warning. ``spark.arrowbeat.shuffle.dir`` overrides them.

Files are private (``arrow_shuffle.private_files``): a root is ours and writable by nobody else,
every directory below it 0700, every file 0600 created without following links; ids become path
components only through ``check_id``; a host-local reader reads another executor's file only
through ``owned_output``. ``note_read`` tells the owning agent's TTL about such a read, at the
time of an injected ``arrowbeat_base.clock.Clock``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import tempfile
import zlib
from collections.abc import Mapping, Sequence

import psutil

from arrow_shuffle.errors import ShuffleConfigError, UnsafeIdError, UnsafePathError
from arrow_shuffle.private_files import check_id, check_private_dir, make_private_dir, private_root
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)
AGENTS = "agents"
"""The discovery folder of an application (an executor id can never be this name)."""


def agent_identity() -> dict[str, float]:
    """This process as a discovery file names it: its pid and start time (which a reused pid
    does not share)."""
    return {"pid": os.getpid(), "started": psutil.Process().create_time()}


def names_live_agent(announcement: Mapping[str, object]) -> bool:
    """Whether the process a discovery file names (``agent_identity``) is running: that pid, started
    at that time (as ``agent_identity`` read it). False for a missing or malformed identity."""
    pid, started = announcement.get("pid"), announcement.get("started")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not isinstance(started, int | float) or isinstance(started, bool):
        return False
    try:
        return abs(psutil.Process(pid).create_time() - float(started)) < 0.001
    except psutil.Error:
        return False


def default_root() -> str:
    """The per-user default root, ``arrowbeat-<uid>`` in the system temp dir: one user's root is
    never another's, and a root another user created first is refused, not shared."""
    return os.path.join(tempfile.gettempdir(), f"arrowbeat-{os.geteuid()}")


LOCAL_DIRS_ENV = "SPARK_LOCAL_DIRS"
"""What PySpark sets, in every Python worker's environment, to its executor's block manager
folders (comma-separated, the same list and order the JVM plugin hands the agent)."""
ROOT_FOLDER = "arrowbeat"
"""Our folder in each of Spark's local directories."""


def shuffle_roots(configured: str = "", local_dirs: str | None = None) -> list[str]:
    """The shuffle roots of this executor, the first one preferred.

    ``spark.arrowbeat.shuffle.dir`` if set (one root, the same path on every host); else
    ``arrowbeat/`` in each of Spark's local directories of this executor: ``local_dirs`` as the JVM
    handed them to the agent, or ``$SPARK_LOCAL_DIRS`` in a Python worker (PySpark's own setting);
    else (a process Spark did not start, e.g. a test) ``default_root()``. The one place roots are
    resolved, called where they are used, so each process resolves them as the user it runs as."""
    if configured:
        return [os.path.abspath(configured)]
    listed = os.environ.get(LOCAL_DIRS_ENV, "") if local_dirs is None else local_dirs
    roots = [os.path.join(os.path.abspath(d), ROOT_FOLDER) for d in listed.split(",") if d.strip()]
    return list(dict.fromkeys(roots)) or [default_root()]


def shuffle_root(configured: str = "") -> str:
    """The preferred root of ``shuffle_roots``."""
    return shuffle_roots(configured)[0]


def app_dir(root: str, app_id: str) -> str:
    return os.path.join(root, check_id(app_id, "application id"))


def agent_file(root: str, app_id: str, jvm_pid: int) -> str:
    return os.path.join(app_dir(root, app_id), AGENTS, f"{check_id(jvm_pid, 'executor JVM pid')}.json")


def executor_dir(root: str, app_id: str, executor_id: str) -> str:
    """``<root>/<app>/<executor>``, created private with the discovery folder beside it (ids are
    checked before anything is created)."""
    if check_id(executor_id, "executor id") == AGENTS:
        raise UnsafeIdError(f"executor id {executor_id!r} is the name of the discovery folder")
    app = app_dir(os.path.abspath(root), app_id)
    private_root(root)
    make_private_dir(app)
    make_private_dir(os.path.join(app, AGENTS))
    return make_private_dir(os.path.join(app, executor_id))


def usable_executor_dirs(roots: Sequence[str], app_id: str, executor_id: str) -> list[tuple[str, str]]:
    """``(root, executor_dir)`` for every root that can hold this executor's outputs, in order.

    Of several, a root that is missing and cannot be created, not writable, or not safe is skipped
    with a warning naming it (Spark skips a bad local dir the same way); none usable is an error
    naming each and why. A single root's problem is raised as it is (``UnsafePathError``, ...)."""
    usable, problems = [], []
    for root in roots:
        if len(roots) == 1:
            return [(os.path.abspath(root), executor_dir(root, app_id, executor_id))]
        try:
            folder = executor_dir(root, app_id, executor_id)
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(f"{folder} is not writable")
            usable.append((os.path.abspath(root), folder))
        except UnsafeIdError:
            raise
        except (OSError, UnsafePathError) as exc:
            problems.append(f"{root}: {exc}")
            log.warning("shuffle root %s not used on executor %s: %s", root, executor_id, exc)
    if not usable:
        raise ShuffleConfigError(
            f"no usable shuffle directory for executor {executor_id}: {'; '.join(problems)}; "
            "check Spark's local dirs (spark.local.dir, SPARK_LOCAL_DIRS) or spark.arrowbeat.shuffle.dir"
        )
    return usable


def spread_dir(dirs: Sequence[str], shuffle_id: int, map_index: int) -> str:
    """The directory of ``dirs`` a map output of (shuffle, map partition) goes to: a stable hash,
    so a shuffle's files spread over every local disk the executor has."""
    return dirs[zlib.crc32(f"{shuffle_id}/{map_index}".encode()) % len(dirs)]


def owned_output(path: object, app_id: str, executor_id: str, shuffle_id: int) -> str:
    """The real path of a map-output file named by a status row, if, links resolved, it has our
    layout ``<root>/<app>/<executor>/s<shuffle>/<name>.arrows``, is a regular file, and its shuffle
    and executor folders are private to us. A host-local reader reads another executor's file only
    through this: a row naming anything else is refused (``UnsafePathError``), not read. (The root
    itself may sit behind a link, as a YARN or macOS local dir often does.)"""
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        raise UnsafePathError(f"{path!r} is not an absolute map-output path")
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    owner = os.path.dirname(folder)
    expected = (
        shuffle_folder(shuffle_id),
        check_id(executor_id, "executor id"),
        check_id(app_id, "application id"),
    )
    found = (
        os.path.basename(folder),
        os.path.basename(owner),
        os.path.basename(os.path.dirname(owner)),
    )
    refused = UnsafePathError(
        f"{path} is not a map output of shuffle {shuffle_id} of executor {executor_id}: refused"
    )
    if found != expected or not real.endswith(".arrows"):
        raise refused
    try:
        if not stat.S_ISREG(os.lstat(real).st_mode):
            raise refused
    except FileNotFoundError:
        pass  # gone: the read fails and reports it lost
    check_private_dir(folder)
    check_private_dir(owner)
    return real


def note_read(path: str, clock: Clock = SYSTEM_CLOCK) -> None:
    """A reducer read map-output file ``path`` straight from disk (host-local): its shuffle folder's
    times are set to ``clock.time()``, so the owning agent's TTL counts the read. Best effort."""
    now = clock.time()
    with contextlib.suppress(OSError):
        os.utime(os.path.dirname(path), (now, now), follow_symlinks=False)


def shuffle_folder(shuffle_id: int) -> str:
    """A shuffle's folder in an executor's directory (the map tasks write into it)."""
    return f"s{check_id(shuffle_id, 'shuffle id')}"


_OUTPUT_NAME = re.compile(r"^m(\d+)-(\d+)\.(\d+)\.(\d+)-[0-9a-f]{8}\.arrows$")
"""A map output's file name, as ``worker.map_task.map_function`` writes it:
``m<map>-<stage>.<task attempt id>.<attempt number>-<uuid8>.arrows``."""


def name_parts(path: str) -> tuple[int, int] | None:
    """``(map partition, Spark task attempt id)`` from a map output's file name, or None."""
    found = _OUTPUT_NAME.match(os.path.basename(path))
    return (int(found.group(1)), int(found.group(3))) if found else None


def written_by(path: str) -> str | None:
    """The map attempt (``stage.taskAttemptId.attemptNumber``) that wrote a map output, from its
    file name, or None."""
    found = _OUTPUT_NAME.match(os.path.basename(path))
    return f"{found.group(2)}.{found.group(3)}.{found.group(4)}" if found else None
