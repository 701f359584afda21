"""The architecture the README draws, kept true: layers, one-way dependencies, no import cycles.

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
PACKAGES = ("heartbeat", "arrow_shuffle", "spark_plugin")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


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
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:  # ``from pkg import module`` imports the module too
                yield f"{target}.{alias.name}", node.lineno
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        edges: dict[str, int] = {}
        for target, line in _imports(tree, name, path.name == "__init__.py"):
            if target in modules and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def _external_imports(module: str) -> set[str]:
    path = _modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    return {target for target, _ in _imports(tree, module, path.name == "__init__.py")}


FOUNDATION_MODULES = ("spark_plugin.config", "spark_plugin.errors", "spark_plugin.tls")


def _layer(module: str) -> str:
    """The layer a module belongs to, bottom first (see README, Contributing)."""
    if module == "heartbeat.clock":
        return "clock"
    if module.startswith("heartbeat"):
        return "heartbeat"
    if module.startswith("arrow_shuffle.spark"):
        return "shuffle-spark"
    if module.startswith("arrow_shuffle"):
        return "engine"
    if module in FOUNDATION_MODULES or module.startswith(("spark_plugin.history", "spark_plugin.compat")):
        return "plugin-foundation"
    return "plugin-processes"


# What each layer may import (besides itself); anything else is a dependency running the wrong way.
ALLOWED = {
    "clock": set(),
    "heartbeat": {"clock"},
    "engine": {"clock"},
    "plugin-foundation": {"clock", "heartbeat"},
    "shuffle-spark": {"clock", "engine", "plugin-foundation"},
    "plugin-processes": {"clock", "heartbeat", "engine", "shuffle-spark", "plugin-foundation"},
}


def test_dependencies_run_one_way() -> None:
    wrong = []
    for module, edges in _graph().items():
        here = _layer(module)
        for target, line in edges.items():
            there = _layer(target)
            if there != here and there not in ALLOWED[here]:
                # The engine's package facade re-exports the DataFrame API lazily (PEP 562).
                if module == "arrow_shuffle" and there == "shuffle-spark":
                    continue
                wrong.append(f"{module}:{line} ({here}) imports {target} ({there})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle() -> None:
    graph = _graph()
    # The package facade's lazy re-export is an edge only when the attribute is used; leave it out.
    graph["arrow_shuffle"] = {t: n for t, n in graph["arrow_shuffle"].items() if _layer(t) != "shuffle-spark"}
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
    assert set(_graph()["spark_plugin.tls"]) <= {
        "spark_plugin.config",
        "spark_plugin.errors",
        "heartbeat.clock",
    }


SPARK_FREE = sorted(m for m in _modules() if _layer(m) in ("clock", "heartbeat", "engine"))


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
        "m.startswith(('pyspark', 'py4j', 'spark_plugin', 'arrow_shuffle.spark')))\n"
        "assert not loaded, loaded\n"
        "import arrow_shuffle\n"
        "try:\n"
        "    arrow_shuffle.group_apply\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('the DataFrame API loaded without pyspark')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_dataframe_api_stays_importable_as_documented() -> None:
    code = (
        "from arrow_shuffle import group_apply, map_in_arrow, partition_apply, release, repartition\n"
        "from arrow_shuffle.spark import dataframe\n"
        "assert group_apply is dataframe.group_apply\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_engine_loads_no_grpc() -> None:
    """The engine shares only the clock with the heartbeat library; its processes carry no gRPC."""
    engine = [m for m in SPARK_FREE if _layer(m) == "engine"]
    code = (
        "import sys, importlib\n"
        f"for name in {engine!r}: importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'grpc')\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
