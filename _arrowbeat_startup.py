"""What arrowbeat does when a Python process starts in an environment it is installed in.

The wheel ships ``arrowbeat.pth`` beside this module; Python's ``site`` runs its one line at
start-up, which calls :func:`watch`. That adds an import watcher and nothing else (standard
library only: a process that never imports PySpark pays one set lookup per import). When PySpark
loads one of the modules whose methods ``spark.arrowbeat.shuffle.groupedMap`` needs
(``spark_plugin.compat.grouped_map_hook.MODULES``), the watcher has the hook wrap them right
after the module ran; the hook reads the key at each call, so with ``off`` (the default) Spark's
own methods run. ``ARROWBEAT_GROUPED_MAP_HOOK=0`` in the environment skips even the watcher.

It is a top-level module so that the ``.pth`` line imports nothing of ``spark_plugin`` (whose
package import costs tens of milliseconds) in processes that never use PySpark.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

WATCHED = frozenset(
    {"pyspark.sql.classic.dataframe", "pyspark.sql.pandas.group_ops", "pyspark.sql.connect.group"}
)
"""``grouped_map_hook.MODULES`` (a unit test keeps the two equal)."""
SWITCH = "ARROWBEAT_GROUPED_MAP_HOOK"


def _takeover() -> Any:
    """The function the hook offers calls to, imported at the first call with the key on."""
    from spark_plugin.shuffle.driver.takeover import take_over

    return take_over


def _patch() -> None:
    try:
        from spark_plugin.compat.grouped_map_hook import patch_loaded

        patch_loaded(_takeover)
    except Exception as exc:  # never break the user's import of PySpark
        import logging

        logging.getLogger("spark_plugin.compat.grouped_map_hook").warning(
            "arrowbeat's grouped-map hook is not installed (%s: %s); Spark's own methods run",
            type(exc).__name__,
            exc,
        )


class _ThenPatch(Loader):
    """Runs the real loader, then the hook; everything else is the real loader's."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch()

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, get_resource_reader, ...
        return getattr(self._loader, name)


class _Watcher(MetaPathFinder):
    """Finds nothing itself: for a watched module, the spec the other finders give, with its
    loader followed by the hook."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenPatch(spec.loader)
                return spec
        return None


def watch() -> None:
    """Installs the watcher once (the ``.pth`` line), and wraps what PySpark already loaded."""
    if os.environ.get(SWITCH, "1") == "0" or any(isinstance(f, _Watcher) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Watcher())
    if any(name in sys.modules for name in WATCHED):
        _patch()
