"""Spark fixtures: in-process sessions (Spark start-up is the expensive part), and the two
frozen-executor runs of ``tests.harness.frozen``, each once per session for every module whose
tests use it (the modules' ``FROZEN_PROBES`` ride along)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from harness.session import build_session
from tests.harness.apps import (  # noqa: F401  (hooks and the run's shared session, by name)
    SharedSession,
    pytest_collection_modifyitems,
    pytest_runtest_teardown,
    shared_sessions,
    shuffle_cluster,
)
from tests.harness.frozen import FrozenRun, kill_run, probes_of, thaw_run


@pytest.fixture(scope="module")
def spark_local(scratch: Path, request: pytest.FixtureRequest) -> SparkSession:
    """``local[2]`` with arrowbeat and Delta on: one session for every module that uses it, run
    one after another (``tests/harness/apps.py``)."""
    sessions: SharedSession = request.getfixturevalue("shared_sessions")
    return sessions.get("spark_local", lambda: build_session("local[2]", scratch, "test-spark-local"))


def _modules_using(request: pytest.FixtureRequest, fixture: str) -> list[object]:
    """The modules of the selected tests that use ``fixture``, in run order."""
    modules: dict[int, object] = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if module is not None and fixture in getattr(item, "fixturenames", ()):
            modules.setdefault(id(module), module)
    return list(modules.values())


@pytest.fixture(scope="session")
def frozen_run(scratch: Path, request: pytest.FixtureRequest) -> FrozenRun:
    """The application whose executor ``frozen`` was frozen and thawed (and ``killed`` killed),
    already ended; every probe of the modules using this fixture ran along."""
    run = thaw_run(scratch, probes_of(_modules_using(request, "frozen_run"), "thaw"))
    print(f"frozen_run: {run.timeline}")
    return run


@pytest.fixture(scope="session")
def frozen_kill_run(scratch: Path, request: pytest.FixtureRequest) -> FrozenRun:
    """The ``onHeartbeatTimeout=kill`` application whose frozen executor Spark removed, ended."""
    run = kill_run(scratch, probes_of(_modules_using(request, "frozen_kill_run"), "kill"))
    print(f"frozen_kill_run: {run.timeline}")
    return run
