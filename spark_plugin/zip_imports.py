"""Keep PySpark workers on Python 3.10/3.11 from re-reading ``pyspark.zip`` on every task.

PySpark's worker calls ``importlib.invalidate_caches()`` at the start of every task (after adding
the task's files to ``sys.path``). On Python 3.10 and 3.11 that makes every ``zipimporter`` on
``sys.path`` re-read its archive's whole directory at once (CPython gh-103200, found by a Spark
developer, fixed in 3.12 by re-reading lazily). Executors put ``pyspark.zip`` (3 MB, thousands of
entries) first on the path, so each Python task paid ~250 ms here before it ran a line of its
own: 16 tasks of a stage cost a 2-core machine 2 s.

:func:`skip_unchanged_archives` makes ``invalidate_caches`` re-read an archive only when it
changed on disk (size, mtime or inode), which keeps the invalidation Spark wants (files added to
a running application are new paths, or new contents) and drops the rest. No-op on 3.12+.
"""

from __future__ import annotations

import os
import sys
import zipimport
from collections.abc import Callable
from typing import Any

_MARK = "_arrowbeat_skips_unchanged"


def _stamp(archive: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def skip_unchanged_archives() -> bool:
    """Patch ``zipimporter.invalidate_caches`` on Python < 3.12; True if it is (now) patched."""
    if sys.version_info >= (3, 12):
        return False
    original: Callable[[Any], None] = zipimport.zipimporter.invalidate_caches
    if getattr(original, _MARK, False):
        return True

    def invalidate_caches(self: Any) -> None:
        stamp = _stamp(self.archive)
        if stamp is not None and getattr(self, "_arrowbeat_stamp", None) == stamp:
            return  # the archive is what we read last time: its directory is still right
        original(self)
        self._arrowbeat_stamp = stamp

    setattr(invalidate_caches, _MARK, True)
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    return True
