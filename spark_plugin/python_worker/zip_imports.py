"""Keep PySpark workers on Python 3.11 from re-reading ``pyspark.zip`` on every task.

Up to pyspark 4.1 the worker calls ``importlib.invalidate_caches()`` at the start of every task
(after adding the task's files to ``sys.path``). On Python 3.10 and 3.11 that makes every
``zipimporter`` on ``sys.path`` re-read its archive's whole directory at once (CPython gh-103200,
found by a Spark developer, fixed in 3.12 by re-reading lazily). Executors put ``pyspark.zip``
(3 MB, thousands of entries) first on the path, so each Python task paid ~250 ms here before it
ran a line of its own: 16 tasks of a stage cost a 2-core machine 2 s.

:func:`skip_unchanged_archives` makes ``invalidate_caches`` re-read an archive only when it
changed on disk (size, mtime or inode), which keeps the invalidation Spark wants (files added to
a running application are new paths, or new contents) and drops the rest. Whether it is needed,
and the CPython method it wraps, come from ``compat.zipimport_cache``: a no-op on 3.12+ and on
pyspark 4.2+ (which invalidates only when a task adds a path).
"""

from __future__ import annotations

import logging
import os
import zipimport
from typing import Any

from spark_plugin.compat.zipimport_cache import find_invalidate_caches

log = logging.getLogger(__name__)
_MARK = "_arrowbeat_skips_unchanged"


def _stamp(archive: object) -> tuple[int, int, int] | None:
    if not isinstance(archive, str):
        return None
    try:
        st = os.stat(archive)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def skip_unchanged_archives(
    python: tuple[int, int] | None = None, pyspark_version: str | None = None
) -> bool:
    """Patch ``zipimporter.invalidate_caches`` where a worker would re-read archives every task
    (see ``compat.zipimport_cache``; the defaults are this process's); True if it is (now)
    patched. A patch that is wanted but cannot be verified is skipped with one warning."""
    point = find_invalidate_caches(python, pyspark_version)
    original = point.original
    if original is None:
        if point.unverified:
            log.warning("arrowbeat does not cut the workers' per-task zip re-reads: %s", point.reason)
        return False
    if getattr(original, _MARK, False):
        return True

    def invalidate_caches(self: Any) -> None:
        stamp = _stamp(getattr(self, "archive", None))
        if stamp is not None and getattr(self, "_arrowbeat_stamp", None) == stamp:
            return  # the archive is what we read last time: its directory is still right
        original(self)
        self._arrowbeat_stamp = stamp

    setattr(invalidate_caches, _MARK, True)
    zipimport.zipimporter.invalidate_caches = invalidate_caches  # type: ignore[method-assign]
    return True
