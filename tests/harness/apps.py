"""One in-process Spark application for consecutive test modules that want the same one.

Starting a session costs a JVM, Delta and the plugin's processes; several modules want exactly
the same one (``SHARED``: the fixture name says which). Those modules run one after another
(``group_modules``), get one session from the run's ``SharedSession`` and it is stopped as soon
as the next module uses none of it (``release_between_modules``), so no other module ever finds
it running: not one that builds its own in-process session (``getOrCreate`` would hand it this
one), nor a Connect client, nor one that counts executor JVMs. The session-scoped fixture that
owns it stops it at the end of the run in any case.

``tests/spark/conftest.py`` registers the hooks and the fixtures (``spark_local`` is defined there)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.session import build_session, stop_session

SHARED = ("spark_local", "shuffle_cluster")
"""Fixtures that hand out the shared session; a module uses it when any of its tests does."""
_MODULES = pytest.StashKey[dict[str, frozenset[str]]]()
_SESSIONS = pytest.StashKey["SharedSession"]()


class SharedSession:
    """At most one in-process session, under the name of the fixture that asked for it."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._spark: SparkSession | None = None
        self._after_stop: list[Callable[[], None]] = []

    def get(self, name: str, build: Callable[[], SparkSession]) -> SparkSession:
        """The session ``name`` stands for: the running one, or (after stopping any other) a new one."""
        if self.name != name or self._spark is None:
            self.release()
            self._spark, self.name = build(), name
        return self._spark

    def after_stop(self, check: Callable[[], None]) -> None:
        """Runs ``check`` once the running session has stopped (what a module asserts about the
        end of the application it used)."""
        self._after_stop.append(check)

    def release(self) -> None:
        """Stops the session and its gateway JVM, if one runs, then its ``after_stop`` checks."""
        spark, self._spark, self.name = self._spark, None, None
        checks, self._after_stop = self._after_stop, []
        if spark is not None:
            stop_session(spark)
        for check in checks:
            check()


def module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def group_modules(items: list[pytest.Item]) -> None:
    """Moves the modules that use a ``SHARED`` fixture right after the first module that uses the
    same one (otherwise the order stays), and notes which shared fixtures each module uses."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(module_of(item), []).append(item)
    uses = {
        module: frozenset(n for n in SHARED for item in its if n in getattr(item, "fixturenames", ()))
        for module, its in modules.items()
    }
    ordered: list[pytest.Item] = []
    placed: set[str] = set()
    for module in modules:
        if module in placed:
            continue
        group = [module] + [m for m in modules if m not in placed and m != module and uses[m] & uses[module]]
        for member in group:
            ordered += modules[member]
            placed.add(member)
    items[:] = ordered
    if items:
        items[0].config.stash[_MODULES] = uses


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    group_modules(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test of a module (its fixtures torn down): ``release_between_modules``."""
    result = yield
    release_between_modules(item, nextitem)
    return result


def release_between_modules(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stops the shared session when the next test is in a module that does not use it."""
    sessions = item.config.stash.get(_SESSIONS, None)
    if sessions is None or sessions.name is None:
        return
    if nextitem is not None and module_of(nextitem) == module_of(item):
        return
    uses = item.config.stash.get(_MODULES, {})
    if nextitem is None or sessions.name not in uses.get(module_of(nextitem), frozenset()):
        sessions.release()


@pytest.fixture(scope="session")
def shared_sessions(request: pytest.FixtureRequest) -> Iterator[SharedSession]:
    """The run's ``SharedSession``; whatever it still holds is stopped at the end of the run."""
    sessions = SharedSession()
    request.config.stash[_SESSIONS] = sessions
    try:
        yield sessions
    finally:
        sessions.release()


@dataclass
class ShuffleCluster:
    """``local-cluster[2,1,1024]``: two executor JVMs on this host, each with its agent."""

    spark: SparkSession
    root: Path
    """``spark.arrowbeat.shuffle.dir``: every executor's map outputs, under ``<root>/<app id>``."""
    tables: Path


@pytest.fixture(scope="module")
def shuffle_cluster(scratch: Path, request: pytest.FixtureRequest) -> ShuffleCluster:
    """Both executors share this host; by default they would read each other's map outputs from
    disk. Off here (``readHostLocalDisk``, settable per query), every read of the other executor's
    outputs goes through its agent's credit-based stream, as between hosts."""
    sessions: SharedSession = request.getfixturevalue("shared_sessions")
    root, tables = scratch / "shuffle-cluster", scratch / "shuffle-cluster-tables"
    conf = {
        "spark.arrowbeat.shuffle.dir": str(root),
        "spark.arrowbeat.tables.path": str(tables),
        "spark.sql.shuffle.partitions": "5",
        "spark.arrowbeat.shuffle.readHostLocalDisk": "false",
    }
    build = lambda: build_session("local-cluster[2,1,1024]", scratch, "test-shuffle-cluster", conf)  # noqa: E731
    return ShuffleCluster(sessions.get("shuffle_cluster", build), root, tables)
