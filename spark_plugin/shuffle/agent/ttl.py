"""The executor agent's shuffle TTL bookkeeping, in bounded memory and on the monotonic clock.

Runs in the agent (``agent_service.MapOutputService``), which lives as long as its executor: a
streaming query makes a shuffle per micro-batch, so nothing here may hold an entry per shuffle
that ever ran.

- ``FolderActivity``: when each shuffle folder was last used. File times are wall clock, and a
  wall clock stepped forward made every unread output look a day old and deleted it. So wall
  times are never compared with "now" to age a folder; the agent notices that a folder *changed*
  (a write, or a host-local reader's ``note_read`` setting the folder's time) by comparing what
  the file system shows with what it showed at the previous look, and dates the change on the
  monotonic clock. The file's own time only says how long before this look the change was made,
  and is trusted no further back than the previous look (a stepped clock can move a TTL by one
  sweep interval, never delete a folder in use). Entries go with their folders.
- ``DeletedShuffles``: which shuffles the agent deleted on purpose (released, or swept by the
  TTL), to tell "gone on purpose" (a reader gets an error; the executor is kept) from "lost" (the
  JVM is told, Spark recomputes on another executor). The newest ``RECENT_DELETED`` ids are kept
  exactly; past them a watermark: Spark hands shuffle ids out in increasing order, so an id at or
  below the highest id that fell out of the window is of a shuffle older than the last
  ``RECENT_DELETED`` deletions, and it counts as deleted on purpose unless its folder is still
  on disk (then its missing files are lost, as they would be in the window too). The cost of a
  wrong answer there: a reader of a long-released shuffle would have had an executor replaced,
  and a long-lived shuffle whose *whole folder* vanished without the agent would fail its query
  rather than be recomputed.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from arrowbeat_base.clock import Clock

RECENT_DELETED = 1024
"""Deleted shuffle ids the agent remembers exactly (about 100 KB); older ones: a watermark."""

Mark = tuple[int, int, int]
"""What a shuffle's folders show: entries, total bytes, sum of modification times (ns)."""


class DeletedShuffles:
    """Shuffle ids deleted on purpose: the recent ones exactly, the older ones by a watermark.

    ``shuffle_id in deleted`` is the question the agent asks; ``on_disk(shuffle_id)`` says
    whether the shuffle's folder exists now (consulted below the watermark only)."""

    def __init__(self, on_disk: Callable[[int], bool], recent: int = RECENT_DELETED) -> None:
        self._on_disk = on_disk
        self._limit = recent
        self._recent: OrderedDict[int, None] = OrderedDict()
        self.watermark = -1
        """The highest id that fell out of the exact window (-1: none yet)."""

    def add(self, shuffle_id: int) -> None:
        self._recent[shuffle_id] = None
        self._recent.move_to_end(shuffle_id)
        while len(self._recent) > self._limit:
            evicted, _ = self._recent.popitem(last=False)
            self.watermark = max(self.watermark, evicted)

    def __contains__(self, shuffle_id: object) -> bool:
        if not isinstance(shuffle_id, int):
            return False
        if shuffle_id in self._recent:
            return True
        return shuffle_id <= self.watermark and not self._on_disk(shuffle_id)

    def __len__(self) -> int:
        """Ids held exactly (at most ``RECENT_DELETED``)."""
        return len(self._recent)


class FolderActivity:
    """The last use of each shuffle folder, on the monotonic clock, noticed from its changes."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[Mark, float]] = {}
        """Folder name -> (its mark at the last look, ``clock.monotonic()`` of its last change)."""
        self._looked_at = clock.monotonic()
        """The previous look (or the start): a change seen now was made after it."""

    def look(self) -> tuple[float, float]:
        """Begin a look at every folder: ``(now, seconds since the previous look)``, monotonic."""
        now = self._clock.monotonic()
        with self._lock:
            since, self._looked_at = max(0.0, now - self._looked_at), now
        return now, since

    def last_change(self, name: str, paths: Sequence[str], now: float, since: float) -> float:
        """``clock.monotonic()`` when ``name``'s folders (one per local dir) last changed."""
        mark, newest = folder_mark(paths)
        with self._lock:
            seen = self._seen.get(name)
            if seen is not None and seen[0] == mark:
                return seen[1]
        # New or changed since the previous look: its newest file time says how long ago, but
        # never earlier than that look (a wall clock stepped forward must not age it).
        age = min(max(0.0, self._clock.time() - newest), since)
        with self._lock:
            self._seen[name] = (mark, now - age)
        return now - age

    def forget(self, name: str) -> None:
        with self._lock:
            self._seen.pop(name, None)

    def keep_only(self, names: set[str]) -> None:
        """Drop the entries of folders no longer on disk."""
        with self._lock:
            for gone in [n for n in self._seen if n not in names]:
                del self._seen[gone]

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)


def folder_mark(paths: Sequence[str]) -> tuple[Mark, float]:
    """What ``paths``' trees show (every folder and file, links not followed) and their newest
    modification time (wall clock; ``-inf`` if none exists)."""
    entries = size = mtimes = 0
    newest = float("-inf")
    for path in paths:
        try:
            top = os.lstat(path)
        except FileNotFoundError:
            continue
        entries, mtimes, newest = entries + 1, mtimes + top.st_mtime_ns, max(newest, top.st_mtime)
        for folder, _, files in os.walk(path):
            for name in files:
                with contextlib.suppress(FileNotFoundError):
                    found = os.lstat(os.path.join(folder, name))
                    entries += 1
                    size += found.st_size
                    mtimes += found.st_mtime_ns
                    newest = max(newest, found.st_mtime)
    return (entries, size, mtimes), newest
