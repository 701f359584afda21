"""The architecture the developer guide draws, kept true: layers, one-way dependencies, no cycles.

The import graph is read from the source (every ``import`` statement, function-level ones
included, ``TYPE_CHECKING`` blocks excluded since they never run), so a cycle hidden inside a
function is found as well as one at module level.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("arrowbeat_base", "heartbeat", "arrow_shuffle", "spark_plugin", "jobs")
# setuptools installs jobs/ as ``spark_plugin.jobs`` ([tool.setuptools.package-dir]): an import by
# that name is an import of the jobs layer, and is checked as one.
PACKAGE_DIR_ALIASES = {"spark_plugin.jobs": "jobs"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _unalias(target: str) -> str:
    for alias, real in PACKAGE_DIR_ALIASES.items():
        if target == alias or target.startswith(alias + "."):
            return real + target[len(alias) :]
    return target


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" not in path.name:
                found[_module_name(path)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module this one imports at run time, with the line of the statement."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node.level, node.module)
            if node.module or not module.startswith(f"{target}."):  # ``from . import sibling``: the
                yield target, node.lineno  # sibling, not the package (imported before the module anyway)
            for alias in node.names:  # ``from pkg import module`` imports the module too
                yield f"{target}.{alias.name}", node.lineno
        elif _is_exports(node):  # a package's names imported on first use (PEP 562)
            assert isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            for value in node.value.values:
                assert isinstance(value, ast.Constant) and isinstance(value.value, str), ast.dump(value)
                relative = value.value.lstrip(".")
                level = len(value.value) - len(relative)
                yield _resolve(module, is_package, level, relative), node.lineno
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name of ``from <level dots><name> import ...`` written in ``module``."""
    if not level:
        return name or ""
    base = module.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, name] if name else base)


def _is_exports(node: ast.AST) -> bool:
    """``_EXPORTS = {name: module}``: what a package's ``__getattr__`` imports on first use."""
    return (
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
        and isinstance(node.value, ast.Dict)
    )


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, int] = {}
        for target, line in _imports(tree, name, path.name == "__init__.py"):
            target = _unalias(target)
            if target in modules and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _external_imports(module: str) -> set[str]:
    path = _modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    return {target for target, _ in _imports(tree, module, path.name == "__init__.py")}


def _run_python(code: str) -> None:
    """Runs ``code`` in a fresh interpreter from the checkout (what it imports is what a new process
    would) and fails the test with its stderr if it fails."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _layer(module: str) -> str:
    """The room a module belongs to (see docs/developer/contributing.md: the tree, bottom first). Below
    ``spark_plugin``, the folder says the process: ``shuffle.driver`` (the user's driver; the
    package's public names are its API), ``shuffle.worker`` and ``python_worker`` (PySpark's Python
    workers), ``shuffle.agent`` (the executor's agent); ``shuffle`` holds what more than one of them
    reads (file formats, layouts, the control schema)."""
    parts = module.split(".")
    if parts[0] == "arrowbeat_base":
        return "base"
    if parts[0] == "heartbeat":
        if len(parts) == 1:
            return "heartbeat.api"  # the package's names, imported on first use from every room
        return f"heartbeat.{parts[1]}" if parts[1] in ("rm", "agent", "wire") else "heartbeat"
    if parts[0] == "jobs":
        return "jobs"
    if parts[0] == "arrow_shuffle":
        return "engine"
    if module == "spark_plugin.errors" or parts[1:2] in (["settings"], ["compat"]):
        return "foundation"
    if len(parts) == 1 or parts[1] == "__main__":
        return "entry"
    if parts[1] == "shuffle":
        if len(parts) == 2:
            return "shuffle.driver"
        return f"shuffle.{parts[2]}" if parts[2] in ("driver", "worker", "agent") else "shuffle"
    return parts[1]  # history, jvm, monitoring, python_worker, tools, processes


HEARTBEAT_ROOMS = {"heartbeat", "heartbeat.wire", "heartbeat.rm", "heartbeat.agent", "heartbeat.api"}

# What each room may import (besides itself): anything else is a dependency running the wrong way.
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "heartbeat": {"base", "heartbeat.wire"},
    "heartbeat.wire": {"base", "heartbeat"},
    "heartbeat.rm": {"base", "heartbeat", "heartbeat.wire"},
    "heartbeat.agent": {"base", "heartbeat", "heartbeat.wire"},
    "heartbeat.api": {"base", "heartbeat", "heartbeat.wire", "heartbeat.rm", "heartbeat.agent"},
    "engine": {"base"},
    "foundation": {"base", *HEARTBEAT_ROOMS},
    "history": {"base", *HEARTBEAT_ROOMS, "foundation"},
    "jvm": {"base", *HEARTBEAT_ROOMS, "engine", "foundation"},
    "python_worker": {"base", "engine", "foundation"},
    "monitoring": {"base", *HEARTBEAT_ROOMS, "foundation", "history", "jvm", "python_worker"},
    "shuffle": {"base", "engine", "foundation"},
    "shuffle.worker": {"base", "engine", "foundation", "shuffle"},  # never the driver side
    "shuffle.agent": {"base", "engine", "foundation", "shuffle"},
    "shuffle.driver": {
        "base",
        "engine",
        "foundation",
        "history",
        "shuffle",
        "shuffle.worker",
        "shuffle.agent",
    },
    "tools": {"base", *HEARTBEAT_ROOMS, "foundation", "history", "jvm"},
    "processes": {
        "base",
        *HEARTBEAT_ROOMS,
        "engine",
        "foundation",
        "history",
        "jvm",
        "monitoring",
        "python_worker",
        "shuffle",
        "shuffle.agent",
        "tools",
    },
    "entry": {"base", "foundation", "jvm", "tools"},
    "jobs": {"base", *HEARTBEAT_ROOMS, "foundation", "history", "shuffle.driver", "tools", "entry"},
}


def test_every_module_has_a_room() -> None:
    assert {m: _layer(m) for m in _modules() if _layer(m) not in ALLOWED} == {}


def test_dependencies_run_one_way() -> None:
    wrong = []
    for module, edges in _graph().items():
        here = _layer(module)
        for target, line in edges.items():
            there = _layer(target)
            if there != here and there not in ALLOWED[here]:
                wrong.append(f"{module}:{line} ({here}) imports {target} ({there})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in graph[module]:
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in graph:
        if module not in state and (cycle := visit(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_tls_material_needs_only_the_config_and_the_clock() -> None:
    """The TLS module is what the heartbeat library's and the engine's callers build contexts
    with: it must stay as light as the config (no history tables, no heartbeat library)."""
    assert set(_graph()["spark_plugin.settings.tls"]) <= {
        "spark_plugin.settings.config",
        "spark_plugin.errors",
        "arrowbeat_base.clock",
    }


SPARK_FREE = sorted(m for m in _modules() if _layer(m) in ("base", "engine") or m.startswith("heartbeat"))


@pytest.mark.parametrize("module", SPARK_FREE)
def test_spark_free_layers_name_no_pyspark(module: str) -> None:
    assert not {m for m in _external_imports(module) if m.split(".")[0] in ("pyspark", "py4j", "delta")}


def test_heartbeat_and_engine_import_without_pyspark() -> None:
    """As pandas is tested by Dask: with pyspark made unimportable, the libraries still load."""
    code = (
        "import sys, importlib\n"
        "sys.modules['pyspark'] = None; sys.modules['py4j'] = None\n"
        f"for name in {SPARK_FREE!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m, v in sys.modules.items() if v is not None and "
        "m.startswith(('pyspark', 'py4j', 'spark_plugin', 'jobs')))\n"
        "assert not loaded, loaded\n"
    )
    _run_python(code)


def test_dataframe_api_stays_importable_as_documented() -> None:
    """The documented import line works, and the engine (which never imports the plugin) says where
    the API went instead of a bare AttributeError."""
    code = (
        "from spark_plugin.shuffle import group_apply, map_in_arrow, partition_apply, release, repartition\n"
        "from spark_plugin.shuffle.driver import dataframe\n"
        "assert group_apply is dataframe.group_apply\n"
        "import arrow_shuffle\n"
        "try:\n"
        "    arrow_shuffle.group_apply\n"
        "except AttributeError as exc:\n"
        "    assert 'spark_plugin.shuffle' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('the engine re-exports the plugin')\n"
    )
    _run_python(code)


def test_the_engine_loads_no_grpc() -> None:
    """The engine shares only the clock with the heartbeat library; its processes carry no gRPC."""
    engine = [m for m in SPARK_FREE if _layer(m) == "engine"]
    code = (
        "import sys, importlib\n"
        f"for name in {engine!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'grpc')\n"
        "assert not loaded, loaded\n"
    )
    _run_python(code)


LAZY_PACKAGES = ("heartbeat", "arrow_shuffle", "spark_plugin", "spark_plugin.shuffle")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_public_name_of_a_package_resolves_on_first_use(package: str) -> None:
    """The packages import their names on first use (PEP 562): each name in ``__all__`` is there,
    is the object of the module that defines it, and an unknown name is an AttributeError."""
    code = (
        "import importlib\n"
        f"pkg = importlib.import_module({package!r})\n"
        "for name in pkg.__all__:\n"
        "    value = getattr(pkg, name)\n"
        "    home = importlib.import_module(pkg._EXPORTS[name], pkg.__name__)\n"
        "    assert value is getattr(home, name), name\n"
        "assert sorted(pkg._EXPORTS) == sorted(pkg.__all__), set(pkg._EXPORTS) ^ set(pkg.__all__)\n"
        "assert set(pkg.__all__) <= set(dir(pkg))\n"
        "try:\n"
        "    pkg.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc), exc\n"
        "else:\n"
        "    raise SystemExit('an unknown name resolved')\n"
    )
    _run_python(code)


def test_a_shuffle_task_loads_only_what_it_runs() -> None:
    """A Python worker running a map or reduce task imports ``worker.map_task`` or
    ``worker.reduce_task``; it must not pay (about 6 MiB a worker, measured) for the driver's API,
    the tables, the agent's asyncio or pyarrow's Parquet and filesystems, which the task never uses."""
    code = (
        "import sys\n"
        "import spark_plugin.shuffle.worker.map_task, spark_plugin.shuffle.worker.reduce_task\n"
        "import spark_plugin.shuffle.worker.grouped_map\n"
        "unwanted = ('asyncio', 'grpc', 'pyarrow.parquet', 'pyarrow.fs',\n"
        "            'spark_plugin.shuffle.driver.dataframe',\n"
        "            'spark_plugin.history', 'spark_plugin.jvm.launch', 'heartbeat.agent.core',\n"
        "            'importlib.metadata')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(unwanted))\n"
        "assert not loaded, loaded\n"
    )
    _run_python(code)


def test_the_worker_daemon_loads_no_package_metadata() -> None:
    """arrowbeat's worker daemon (every Python worker is forked from it and carries its modules)
    parses versions but never reads installed packages' metadata (``importlib.metadata`` and the
    ``email`` package under it: about 3 MiB a worker)."""
    code = (
        "import sys\n"
        "import spark_plugin.python_worker.daemon\n"
        "unwanted = ('importlib.metadata', 'email', 'asyncio')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(unwanted))\n"
        "assert not loaded, loaded\n"
    )
    _run_python(code)
