"""Optional features and the pip extra that brings each one's library.

The core plugin (monitoring, the shuffle, the history tables) needs none of them. A feature whose
library is missing says which extra to install, once, where it starts; the rest runs on.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from spark_plugin.errors import PluginError


@dataclass(frozen=True)
class Extra:
    name: str
    module: str
    """The import that the feature needs."""
    feature: str
    alternative: str = ""


EXTRAS = {
    e.name: e
    for e in (
        Extra("live", "aiohttp", "the live page", " (or set spark.arrowbeat.ui.enabled=false)"),
        Extra("report", "matplotlib", "`arrowbeat report`"),
        Extra("delta", "delta", "Delta-Spark's Python API (jobs/executor_health.py)"),
    )
}


class MissingExtraError(PluginError, ImportError):
    """An optional feature was asked for without its extra installed; the message names the extra."""


def missing(name: str) -> str | None:
    """Why the extra ``name``'s feature cannot run here, or None when its library is importable."""
    extra = EXTRAS[name]
    try:
        found = importlib.util.find_spec(extra.module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return (
        f"{extra.feature} needs {extra.module}, which is not installed: "
        f"pip install 'arrowbeat[{extra.name}]'{extra.alternative}"
    )


def require(name: str) -> None:
    """Raises :class:`MissingExtraError` naming the extra when its library is missing."""
    problem = missing(name)
    if problem is not None:
        raise MissingExtraError(problem)
