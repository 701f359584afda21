"""Whether a PySpark worker's per-task re-read of ``pyspark.zip`` is there to cut, and the CPython
method to wrap for it (``zip_imports`` does the wrapping).

Up to pyspark 4.1 the worker calls ``importlib.invalidate_caches()`` at every task; on CPython 3.10
and 3.11 that makes each ``zipimporter`` on ``sys.path`` re-read its archive's whole directory at
once (CPython gh-103200; 3.12 re-reads lazily). pyspark 4.2 and 4.3 call it only when a task adds
a path, so once per worker. The patch point is CPython's ``zipimport.zipimporter.invalidate_caches``
(taking only ``self``), checked before use. It is a CPython patch whose effect does not depend on
PySpark, so an unknown pyspark minor is patched all the same (it may still re-read per task).
"""

from __future__ import annotations

import inspect
import sys
import zipimport
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_plugin.compat._pyspark import imported_pyspark_version, minor_of

LAZY_CPYTHON = (3, 12)
"""From this CPython on, ``zipimporter.invalidate_caches`` re-reads lazily: nothing to cut."""
INVALIDATES_EVERY_TASK: dict[tuple[int, int], bool] = {
    (4, 0): True,
    (4, 1): True,
    (4, 2): False,
    (4, 3): False,
}
"""Per pyspark minor: does ``setup_spark_files`` call ``importlib.invalidate_caches()`` every task?"""


@dataclass(frozen=True)
class ZipPatchPoint:
    """``original`` (``zipimporter.invalidate_caches``) to wrap, or None with ``reason``;
    ``unverified`` when the patch is wanted but CPython's method is not the expected one."""

    original: Callable[[Any], None] | None
    reason: str = ""
    unverified: bool = False


def find_invalidate_caches(
    python: tuple[int, int] | None = None, pyspark_version: str | None = None, importer: Any = None
) -> ZipPatchPoint:
    """For CPython ``python`` (default: this one), pyspark ``pyspark_version`` (default: the
    imported one) and ``importer`` (default: ``zipimport.zipimporter``)."""
    python = python or (sys.version_info.major, sys.version_info.minor)
    if python >= LAZY_CPYTHON:
        return ZipPatchPoint(None, f"CPython {python[0]}.{python[1]} re-reads zip archives lazily")
    version = pyspark_version or imported_pyspark_version()
    minor = minor_of(version)
    if minor is not None and INVALIDATES_EVERY_TASK.get(minor) is False:
        return ZipPatchPoint(
            None, f"pyspark {version} invalidates import caches only when a task adds a path"
        )
    importer = importer if importer is not None else zipimport.zipimporter
    original = getattr(importer, "invalidate_caches", None)
    if not callable(original):
        return ZipPatchPoint(
            None, f"CPython {python[0]}.{python[1]}'s zipimporter has no invalidate_caches", True
        )
    try:
        parameters = tuple(inspect.signature(original).parameters)
    except (TypeError, ValueError) as exc:
        return ZipPatchPoint(None, f"zipimporter.invalidate_caches's signature cannot be read ({exc})", True)
    if parameters != ("self",):
        return ZipPatchPoint(None, f"zipimporter.invalidate_caches takes {parameters}, not (self)", True)
    return ZipPatchPoint(original)
