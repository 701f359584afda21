"""Environment for every test (``harness.env.prepare``, which the benchmarks call too:
loopback only, the venv's Python everywhere, the checkout on every Python process's path, Spark
dirs in a temp folder), and a final check that the run left no process behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.env import clean_up, for_tests
from harness.procs import end, ours, wait_until
from tests.harness import shards
from tests.harness.markers import pytest_collection_modifyitems  # noqa: F401  (the ``spark`` marker by folder)
from tests.installed import installed_wheel  # noqa: F401  (one wheel per run, for every module that installs it)

_SCRATCH = for_tests()


def pytest_addoption(parser: pytest.Parser) -> None:
    shards.add_option(parser)


@pytest.fixture(scope="session")
def scratch() -> Path:
    """A per-run folder for warehouses, tables and logs."""
    return _SCRATCH


@pytest.fixture(scope="session", autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """After the suite, nothing this run started may still run (JVMs, executors, agents, RMs)."""
    yield
    gone = wait_until(lambda: not ours(), timeout_s=20)
    leftovers = [" ".join(p.cmdline())[:160] for p in ours()]
    end(ours())
    clean_up()
    assert gone, f"processes left running after the tests: {leftovers}"
