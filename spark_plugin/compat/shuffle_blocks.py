"""Spark's own shuffle files of one map task attempt, as an executor's agent may remove them: how a
damaged arrowbeat map output is turned into the fetch failure that has Spark recompute it, without
replacing the executor.

An arrowbeat map task's *status rows* are Spark shuffle blocks ``shuffle_<S>_<mapId>_<reduce>``
(``spark_plugin.shuffle.worker.map_task``). What the Spark 4.0-4.3 sources and jars say (each minor's
``spark-core`` and ``spark-network-shuffle`` checked; recorded in :data:`CHECKED_MINORS`):

- ``ShuffleMapTask.runTask`` passes ``mapId = context.taskAttemptId()`` to the shuffle writer,
  unless ``spark.shuffle.useOldFetchProtocol`` (then the partition index, which a rerun reuses).
- The sort shuffle (``IndexShuffleBlockResolver``) keeps one map output as
  ``shuffle_<S>_<mapId>_0.data`` and ``.index`` (``NOOP_REDUCE_ID`` 0), plus
  ``shuffle_<S>_<mapId>_0.checksum.<ALGORITHM>`` with ``spark.shuffle.checksum.enabled``
  (``ShuffleChecksumHelper.getChecksumFileName``: ``"%s.%s"``), in
  ``<local dir>/<"%02x" of a hash>/`` where each local dir is a ``blockmgr-<uuid>`` folder
  (``DiskBlockManager``; the same list PySpark hands workers as ``SPARK_LOCAL_DIRS`` and the JVM
  plugin hands the agent).
- ``getBlockData`` opens the index file on every read (no index cache in the executor's resolver;
  the external shuffle service's resolver has one, ``shuffleIndexCache``, but then opens the data
  file, which is gone too). A local, host-local or remote read of a removed block fails, and
  ``ShuffleBlockFetcherIterator`` turns that into a ``FetchFailedException`` naming the serving
  executor and the map index.
- ``DAGScheduler`` then unregisters that map output and *every* other map output registered on
  that executor (``removeExecutorAndUnregisterOutputs(fileLost = true)``; the whole host's with
  the external shuffle service), resubmits the map stage for the missing partitions and the reduce
  stage after it. The executor is not replaced: its running tasks and cached blocks stay.

Several map outputs of one ``mapId`` cannot exist (a task attempt writes one shuffle output), so
the files are found by the task attempt id alone; anything unexpected (a second shuffle id, no
index, a link, a folder not named as Spark names them) removes nothing and the caller falls back
to replacing the executor. Files are looked up and removed through directory descriptors opened
without following links, so nothing outside the executor's own block-manager folders is touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spark_plugin.compat._pyspark import imported_pyspark_version, recorded_for

log = logging.getLogger(__name__)

CHECKED_MINORS: dict[tuple[int, int], str] = {
    (4, 0): "4.0.1 sources, 4.0.5 jars",
    (4, 1): "4.1.4 jars",
    (4, 2): "4.2.1 jars",
    (4, 3): "4.3.0 jars",
}
"""The Spark minors whose map-output file layout and mapId were checked, and against what."""

CONF_KEYS = (
    "spark.shuffle.useOldFetchProtocol",
    "spark.shuffle.manager",
    "spark.shuffle.push.enabled",
)
"""The Spark settings that decide whether the layout holds; pass what the application set."""
SORT_SHUFFLE = {"sort", "tungsten-sort", "org.apache.spark.shuffle.sort.SortShuffleManager"}
"""``spark.shuffle.manager`` values that mean Spark's own sort shuffle (the default)."""

BLOCK_MANAGER_DIR = re.compile(r"blockmgr-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""``Utils.createDirectory(root, "blockmgr")``: the prefix and a random UUID."""
SUB_DIR = re.compile(r"[0-9a-f]{2,8}")
_FILE = re.compile(r"shuffle_(\d+)_(\d+)_0\.(data|index|checksum\.[A-Za-z0-9]+)")


@dataclass(frozen=True)
class Layout:
    """Whether this Spark keeps map outputs as checked: ``reason`` is empty when it does."""

    reason: str = ""

    @property
    def checked(self) -> bool:
        return not self.reason


def status_block_layout(spark_version: str | None = None, conf: Mapping[str, str] | None = None) -> Layout:
    """Whether ``remove_map_status_blocks`` can act on this Spark (``spark_version``, default the
    imported pyspark's) with these settings (``conf``: any of :data:`CONF_KEYS` the application
    set; Spark's defaults otherwise). Call once at start-up to log why not."""
    version = spark_version or imported_pyspark_version()
    checked, unknown = recorded_for(CHECKED_MINORS, version, "shuffle file layout")
    if checked is None:
        return Layout(unknown)
    conf = conf or {}
    if _true(conf.get("spark.shuffle.useOldFetchProtocol")):
        return Layout(
            "spark.shuffle.useOldFetchProtocol is on: a map output is named by its partition, "
            "not by the task attempt that wrote it"
        )
    manager = (conf.get("spark.shuffle.manager") or "sort").strip()
    if manager.lower() not in SORT_SHUFFLE and manager not in SORT_SHUFFLE:
        return Layout(f"spark.shuffle.manager is {manager}: map outputs are not Spark's sort-shuffle files")
    if _true(conf.get("spark.shuffle.push.enabled")):
        return Layout(
            "push-based shuffle is on: reducers may read a merged copy of the status rows, which "
            "removing the map task's own files does not fail"
        )
    return Layout()


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def task_attempt_of(attempt: object) -> int | None:
    """The task attempt id (Spark's ``mapId``) in a status row's ``attempt``,
    ``"stage.taskAttemptId.attemptNumber"``; None when it is not one."""
    if not isinstance(attempt, str):
        return None
    found = re.fullmatch(r"\d+\.(\d+)\.\d+", attempt)
    return int(found.group(1)) if found else None


def remove_map_status_blocks(
    local_dirs: str | Sequence[str],
    task_attempt_id: int,
    spark_version: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """Removes the Spark shuffle files (index first, then data and checksums) of the map task
    attempt ``task_attempt_id`` from this executor's block-manager folders ``local_dirs`` (a list
    or Spark's comma-joined form) and returns their paths; ``[]`` when nothing was removed: the
    layout is not the checked one (``status_block_layout``), nothing matched, or what matched was
    not what Spark writes. The next read of those blocks is a fetch failure."""
    if isinstance(task_attempt_id, bool) or not isinstance(task_attempt_id, int) or task_attempt_id < 0:
        raise ValueError(f"not a task attempt id: {task_attempt_id!r}")
    layout = status_block_layout(spark_version, conf)
    if not layout.checked:
        log.warning("Spark's shuffle files of task %s not removed: %s", task_attempt_id, layout.reason)
        return []
    dirs = local_dirs.split(",") if isinstance(local_dirs, str) else list(local_dirs)
    found: list[_Found] = []
    for folder in dict.fromkeys(d.strip() for d in dirs if d.strip()):
        found.extend(_matches(folder, task_attempt_id))
    try:
        shuffles = {f.shuffle_id for f in found}
        names = [f.name for f in found]
        if len(shuffles) != 1 or len(set(names)) != len(names) or not any(f.kind == "index" for f in found):
            if found:
                log.warning(
                    "Spark's shuffle files of task %s not removed: expected one map output with its "
                    "index, each file once, found %s",
                    task_attempt_id,
                    sorted(f.path for f in found),
                )
            return []
        removed = []
        for f in sorted(found, key=lambda f: _ORDER[f.kind]):  # a reader meets the index first
            try:
                os.unlink(f.name, dir_fd=f.dir_fd)
            except FileNotFoundError:
                continue
            removed.append(f.path)
        return removed
    finally:
        for fd in {f.dir_fd for f in found}:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class _Found:
    dir_fd: int
    name: str
    path: str
    shuffle_id: int

    @property
    def kind(self) -> str:
        suffix = self.name.split(".", 1)[1]
        return "checksum" if suffix.startswith("checksum.") else suffix


_ORDER = {"index": 0, "data": 1, "checksum": 2}
_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _matches(folder: str, task_attempt_id: int) -> list[_Found]:
    """The regular files of ``task_attempt_id``'s map output in one block-manager folder, each with
    an open descriptor of its sub-folder (the caller closes them). A folder not named
    ``blockmgr-<uuid>`` or not absolute is refused; links are never followed."""
    if not os.path.isabs(folder) or not BLOCK_MANAGER_DIR.fullmatch(os.path.basename(folder.rstrip("/"))):
        log.warning("not a Spark block-manager folder, not searched: %s", folder)
        return []
    try:
        top = os.open(folder, _NOFOLLOW_DIR)
    except OSError as exc:
        log.warning("Spark block-manager folder %s cannot be opened: %s", folder, exc)
        return []
    found: list[_Found] = []
    try:
        with os.scandir(top) as entries:
            subs = [e.name for e in entries if SUB_DIR.fullmatch(e.name) and _is_dir(e)]
        for sub in subs:
            if format(int(sub, 16), "02x") != sub:  # DiskBlockManager names them "%02x"
                continue
            try:
                fd = os.open(sub, _NOFOLLOW_DIR, dir_fd=top)
            except OSError:
                continue  # replaced by a link, or gone, meanwhile
            mine = []
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        match = _FILE.fullmatch(entry.name)
                        if match is None or int(match.group(2)) != task_attempt_id:
                            continue
                        path = os.path.join(folder, sub, entry.name)
                        if not entry.is_file(follow_symlinks=False):
                            log.warning("not a regular file, left alone: %s", path)
                            continue
                        mine.append(_Found(fd, entry.name, path, int(match.group(1))))
            finally:
                if mine:
                    found.extend(mine)
                else:
                    os.close(fd)
    except BaseException:
        for fd in {f.dir_fd for f in found}:
            os.close(fd)
        raise
    finally:
        os.close(top)
    return found


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False
