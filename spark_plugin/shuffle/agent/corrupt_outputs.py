"""What an executor's agent does with a map output of its own that a reader found damaged.

A reader (a reduce task reading host-locally, or this agent serving a stream) finds a segment
that fails its checksum, ends early or does not decode (``map_output.read_segments``). Reading it
again would give the same error, so the output must be *recomputed*, and Spark must do it, since
the status rows of every map output travel through Spark's own shuffle (``tasks``):

- **precisely** (``Outcome.RECOMPUTE``): the Spark shuffle blocks that carry the damaged output's
  status rows are files of this executor, named after the map task's attempt id (which the
  output's own file name records). Removed (``compat.shuffle_blocks``), the reduce task's retry
  meets a fetch failure for exactly that map partition; Spark's DAGScheduler reruns it, and the
  job reads the new output. Nothing else of this executor is touched.
- **by replacing the executor** (``Outcome.REPLACE``), when those blocks cannot be found (rows
  cached and carried elsewhere by an adaptive shuffle, Spark's old fetch protocol, an unknown
  Spark layout): the JVM asks Spark to replace this executor, as for a lost output.
- ``Outcome.GONE``: the shuffle was released or swept here on purpose; nothing to recompute (the
  reader's error says so).

Either way the damaged file is removed first, so no reader decodes it again, and the finding is
recorded once per file (bounded, ``MAX_RECORDS``): logged, told to ``on_corrupt`` (a
``SHUFFLE_CORRUPT`` executor event) and counted; ``of_shuffle`` lists a shuffle's findings for the
driver's ``shuffle_metrics`` rows.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spark_plugin.shuffle.agent_layout import name_parts

log = logging.getLogger(__name__)

MAX_RECORDS = 1024
"""Findings kept (the oldest go first): each file is handled once, and a long-running application
keeps no more than this however many outputs were damaged."""


class Outcome(enum.IntEnum):
    """What becomes of a damaged output (the ``report_corrupt`` operation's answer)."""

    GONE = 0
    RECOMPUTE = 1
    REPLACE = 2


@dataclass(frozen=True)
class Corruption:
    """One damaged map output of this executor, as found."""

    shuffle_id: int
    map_partition: int
    """-1 when the file's name does not say (not written by ``map_task.map_function``)."""
    path: str
    detail: str
    outcome: Outcome


RemoveBlocks = Callable[[Sequence[str], int], list[str]]
"""``(spark local dirs, task attempt id) -> files removed``: ``compat.shuffle_blocks``'s shim."""


SPARK_VERSION_SETTING = "arrowbeat.executor.spark.version"
"""The executor's Spark version, as its JVM plugin hands it to the agent."""


def status_blocks_remover(settings: Mapping[str, str] | None = None) -> RemoveBlocks:
    """``compat.shuffle_blocks.remove_map_status_blocks`` for this executor's Spark version and
    shuffle settings (``settings``: what the JVM plugin handed the agent; without them, the
    imported pyspark's version and Spark's defaults). Says once, at start-up, when the layout is
    not one the shim checked: damaged outputs then replace the executor."""
    from spark_plugin.compat.shuffle_blocks import CONF_KEYS, remove_map_status_blocks, status_block_layout

    settings = settings or {}
    version = settings.get(SPARK_VERSION_SETTING) or None
    conf = {key: settings[key] for key in CONF_KEYS if key in settings}
    layout = status_block_layout(version, conf)
    if not layout.checked:
        log.warning(
            "a damaged map output will have Spark replace its executor, not rerun one map partition: %s",
            layout.reason,
        )

    def remove(local_dirs: Sequence[str], task_attempt_id: int) -> list[str]:
        return remove_map_status_blocks(local_dirs, task_attempt_id, version, conf)

    return remove


class CorruptOutputs:
    """The agent's findings of damaged map outputs and what it did about each."""

    def __init__(
        self,
        executor_id: str,
        spark_local_dirs: Sequence[str],
        replace_executor: Callable[[str], None],
        on_corrupt: Callable[[str], None] | None = None,
        remove_blocks: RemoveBlocks | None = None,
        max_records: int = MAX_RECORDS,
    ) -> None:
        self.executor_id = executor_id
        self.spark_local_dirs = tuple(d for d in spark_local_dirs if d)
        self._replace_executor = replace_executor
        self._on_corrupt = on_corrupt
        self._remove_blocks = remove_blocks or status_blocks_remover()
        self._max = max_records
        self._lock = threading.Lock()
        self._handling = threading.Lock()
        """One finding is handled at a time: a second reader of the same file waits for the first's
        answer (removing the blocks twice would find none the second time, and replace the
        executor)."""
        self._pending: set[str] = set()
        """Files being handled now: removed, or about to be, on purpose."""
        self._found: OrderedDict[str, Corruption] = OrderedDict()
        self.count = 0
        """Damaged outputs found over the agent's life (``shuffle_outputs_corrupt``)."""

    def known(self, path: str) -> bool:
        """Whether ``path`` was found damaged (and so removed on purpose, its recompute arranged or
        being arranged: a reader that finds it gone meanwhile must not report it lost)."""
        with self._lock:
            return path in self._found or path in self._pending

    def of_shuffle(self, shuffle_id: int) -> list[Corruption]:
        with self._lock:
            return [c for c in self._found.values() if c.shuffle_id == shuffle_id]

    def handle(self, shuffle_id: int, path: str, detail: str, released: bool = False) -> Outcome:
        """Removes the damaged file at ``path`` (a real path inside the agent's folders, checked by
        the caller) and arranges its recompute; the first finding of a file decides, later ones of
        the same file get the same answer. ``released``: the shuffle was deleted here on purpose."""
        with self._lock:
            self._pending.add(path)
        try:
            with self._handling:
                return self._handle(shuffle_id, path, detail, released)
        finally:
            with self._lock:
                self._pending.discard(path)

    def _handle(self, shuffle_id: int, path: str, detail: str, released: bool) -> Outcome:
        with self._lock:
            seen = self._found.get(path)
            if seen is not None:
                return seen.outcome
        parts = name_parts(path)
        map_partition = parts[0] if parts else -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        if released:
            outcome = Outcome.GONE
        else:
            removed = self._status_blocks(parts[1]) if parts else []
            outcome = Outcome.RECOMPUTE if removed else Outcome.REPLACE
        finding = Corruption(shuffle_id, map_partition, path, detail[:1000], outcome)
        with self._lock:
            self._found[path] = finding
            while len(self._found) > self._max:
                self._found.popitem(last=False)
            self.count += 1
        what = {
            Outcome.RECOMPUTE: f"Spark recomputes map partition {map_partition}",
            Outcome.REPLACE: "Spark replaces the executor to recompute its map outputs",
            Outcome.GONE: "the shuffle was released here, nothing to recompute",
        }[outcome]
        line = (
            f"shuffle {shuffle_id}, map partition {map_partition}, executor {self.executor_id}, "
            f"file {path}: {detail[:600]}; {what}"
        )
        log.warning("damaged map output: %s", line)
        if outcome is Outcome.REPLACE:
            self._replace_executor("outputs-corrupt")
        if self._on_corrupt is not None:
            try:
                self._on_corrupt(line)
            except Exception:  # an event sink must not turn a recompute into a hung stage
                log.exception("on_corrupt failed")
        return outcome

    def _status_blocks(self, task_attempt_id: int) -> list[str]:
        if not self.spark_local_dirs:
            return []
        try:
            return self._remove_blocks(self.spark_local_dirs, task_attempt_id)
        except Exception:  # a shim that cannot act leaves the executor replacement
            log.exception("removing the status blocks of task %s failed", task_attempt_id)
            return []
