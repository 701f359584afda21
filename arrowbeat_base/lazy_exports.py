"""Package names imported on first use (PEP 562), so a process loads only the modules it uses.

A Python worker running a shuffle task imports ``spark_plugin.shuffle.worker.reduce_task``; with
eager package ``__init__`` files that also loaded the driver's API, the tables, the agent and
asyncio (7.8 MiB a worker). Each package lists its public names and their modules once
(``_EXPORTS``) and takes its module ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`.
In the base room: every package may import it, and it imports nothing of arrowbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str,
    namespace: dict[str, Any],
    exports: Mapping[str, str],
    unknown: Callable[[str], str] | None = None,
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (whose globals are ``namespace``).

    ``exports`` maps each public name to its module, relative to the package (``".errors"``).
    A name is imported on first use and stored in the package, so later uses are plain reads.
    ``unknown(name)`` words the error for a name that is not exported (default: Python's own)."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(
                unknown(name) if unknown else f"module {package!r} has no attribute {name!r}"
            )
        value = getattr(import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
