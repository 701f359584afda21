"""The Spark tests in three shards that ``scripts/run_tests.py`` runs side by side.

The Spark tests spend much of their time waiting: on heartbeat timeouts, flush intervals, Spark's
scheduler and idle timeouts, executors starting. Pytest sessions, each with its own run marker,
scratch folder and shared sessions, fill each other's waits. ``--spark-shard K/3`` selects the
K-th shard's Spark tests; the first also keeps every test that needs no JVM (``run_tests`` leaves
those out with ``-m``: they run on their own, before the third shard).

A module is in the second or third shard when ``SECOND`` or ``THIRD`` lists it (seconds measured
for the whole module in a full run on this 2-core machine, so the lists can be balanced again as
the suite changes); every other module, including a new one, is in the first. The third shard
runs after the JVM-less tests, beside the first two, so it holds what is not sensitive to a busy
machine (building and installing wheels and packed environments), and what balances the lanes.
Modules that share one application (``BUNDLED``: the shared session, the shuffle cluster, the
frozen-executor runs, the installed wheel) must be in the same shard, or the application would
start once in each: collection fails naming them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

OPTION = "--spark-shard"
BUNDLED = ("spark_local", "shuffle_cluster", "frozen_run", "frozen_kill_run", "installed_wheel")
"""Fixtures whose one application (or wheel) serves every module that uses it
(``tests/spark/conftest.py``, ``tests/installed.py``)."""
SECOND = {
    "tests/spark/test_standalone.py": 186,
    "tests/spark/test_degraded.py": 150,
    "tests/spark/test_stuck_tasks.py": 131,
    "tests/spark/test_agent_restart.py": 63,
    "tests/spark/test_spark_view.py": 59,
    "tests/compat/test_spark_versions.py": 58,
    "tests/spark/test_concurrent_reducers.py": 49,
    "tests/spark/test_frozen_recovery.py": 44,
    "tests/spark/test_connect.py": 44,
    "tests/spark/test_launcher_compat.py": 37,
    "tests/spark/test_secrets.py": 35,
}
"""Modules of the second shard, with their seconds in a full run (the first shard holds about as
many: the frozen-executor modules, the shuffle cluster's, the shared session's and the rest)."""
THIRD = {
    "tests/spark/test_packed_env.py": 208,
    "tests/test_wheel.py": 116,
    "tests/spark/test_tls.py": 42,
    "tests/spark/test_local_dirs.py": 33,
    "tests/spark/test_dev_install_takeover.py": 22,
}
"""Modules of the third shard: the installed wheel's (pip and venv-pack work, no timing asserted),
and the TLS and local-dirs modules, which balance the lanes (its lane runs the JVM-less tests
first; a fresh clone's lanes were 966, 920 and 474 + 431 s without local-dirs)."""
SHARDS = 3
TESTS = Path(__file__).resolve().parent.parent


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        OPTION,
        default=None,
        metavar=f"K/{SHARDS}",
        help=f"run only the K-th of the {SHARDS} Spark shards (tests/harness/shards.py)",
    )


def shard_of(module: str) -> int:
    """1, 2 or 3: the shard of a test module, named by its path from the checkout."""
    return 2 if module in SECOND else 3 if module in THIRD else 1


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keeps the tests of the shard ``--spark-shard`` names (all of them without it), after
    checking that every module ``SECOND`` and ``THIRD`` list exists (a renamed one would fall
    silently into the first shard) and that no bundled application is split between shards."""
    missing = [module for module in (*SECOND, *THIRD) if not (TESTS.parent / module).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/harness/shards.py lists modules that do not exist: {missing}")
    both = sorted(set(SECOND) & set(THIRD))
    if both:
        raise pytest.UsageError(f"tests/harness/shards.py lists modules in two shards: {both}")
    wanted = _wanted(config.getoption(OPTION))
    modules = {item: _module(item) for item in items}
    _check_bundles(items, modules)
    if wanted is None:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        shard = shard_of(modules[item]) if item.get_closest_marker("spark") else 1
        (keep if shard == wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _wanted(value: str | None) -> int | None:
    if value is None:
        return None
    expected = [f"{k}/{SHARDS}" for k in range(1, SHARDS + 1)]
    if value not in expected:
        raise pytest.UsageError(f"{OPTION}={value}: expected one of {', '.join(expected)}")
    return int(value.partition("/")[0])


def _module(item: pytest.Item) -> str:
    path = Path(str(item.path)).resolve()
    return str(path.relative_to(TESTS.parent)) if path.is_relative_to(TESTS.parent) else str(path)


def _check_bundles(items: list[pytest.Item], modules: dict[pytest.Item, str]) -> None:
    for fixture in BUNDLED:
        users = {modules[item] for item in items if fixture in getattr(item, "fixturenames", ())}
        if len({shard_of(module) for module in users}) > 1:
            raise pytest.UsageError(
                f"modules using {fixture} are in more than one Spark shard (tests/harness/shards.py): "
                + ", ".join(sorted(users))
            )
