"""The documentation site: its generated parts cover what the code declares, its pages ask for them,
its figures exist, the primary venv's lock pins its generator, and the README stays one page.

``make docs`` builds the site itself (strict: broken links and anchors fail it); these tests need
neither MkDocs nor a JVM."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts import docs_site, matrix
from scripts.doc_figures import FIGURES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def pages() -> dict[str, str]:
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in sorted(DOCS.rglob("*.md"))}


def test_every_marker_names_a_generator_and_every_generator_is_shown() -> None:
    asked: dict[str, list[str]] = {}
    for name, text in pages().items():
        for marker in docs_site.MARKER.findall(text):
            asked.setdefault(marker, []).append(name)
    assert set(asked) == set(docs_site.GENERATORS), asked
    assert asked["config-table"] == ["reference/configuration.md"]
    assert asked["table-schemas"] == asked["event-kinds"] == ["reference/tables.md"]
    for name, text in pages().items():
        assert not docs_site.MARKER.findall(docs_site.expand(text, name)), name


def test_an_unknown_marker_fails_the_build() -> None:
    with pytest.raises(KeyError, match="no generated part 'config-tabel'"):
        docs_site.expand("# x\n\n<!-- generated: config-tabel -->\n", "x.md")


def test_the_configuration_reference_is_the_declarations() -> None:
    from spark_plugin.settings.config import OPTIONS, docs_table

    page = docs_site.expand((DOCS / "reference/configuration.md").read_text())
    assert docs_table() in page
    for option in OPTIONS:
        assert (f"| `{option.key}` |" in page) is not option.internal, option.key


def test_the_tables_reference_has_every_column_and_event_kind() -> None:
    from heartbeat import EventKind
    from spark_plugin.history.tables import EXECUTOR_EVENTS, HEARTBEATS, SHUFFLE_METRICS

    page = docs_site.expand((DOCS / "reference/tables.md").read_text())
    for spec in (HEARTBEATS, EXECUTOR_EVENTS, SHUFFLE_METRICS):
        section = page.split(f"### `{spec.name}`", 1)[1].split("###", 1)[0]
        for field in spec.schema:
            assert f"| `{field.name}` | `{field.type}` |" in section, (spec.name, field.name)
    for kind in EventKind:
        assert re.search(rf"^\| `{kind.name}` \| \S", page, re.MULTILINE), kind


def test_a_column_or_metric_without_its_doc_line_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_plugin.history import tables
    from spark_plugin.jvm import plugin_metrics

    heartbeats = dict(tables.COLUMN_DOCS["heartbeats"])
    del heartbeats["gc_ms"]
    monkeypatch.setitem(tables.COLUMN_DOCS, "heartbeats", heartbeats)
    with pytest.raises(docs_site.MissingDocError, match=r"heartbeats\.gc_ms"):
        docs_site.table_schemas()
    monkeypatch.setattr(plugin_metrics, "EXECUTOR_METRICS", plugin_metrics.EXECUTOR_METRICS | {"shuffle.new"})
    with pytest.raises(docs_site.MissingDocError, match=r"shuffle\.new"):
        docs_site.executor_metrics()


def test_the_metrics_reference_lists_every_name_the_jvm_accepts() -> None:
    from spark_plugin.jvm.plugin_metrics import DRIVER_METRICS, EXECUTOR_METRICS, METRIC_DOCS, allowed

    page = docs_site.expand((DOCS / "reference/metrics.md").read_text())
    driver, executors = page.split("## Executors", 1)
    for name in DRIVER_METRICS:
        assert f"| `{name}` |" in driver and allowed("driver", name), name
    for name in ("executor.<id>.heartbeatAgeMs", "executor.<id>.rttMs"):
        assert f"| `{name}` |" in driver
        assert allowed("driver", name.replace("<id>", "7"))
    for name in EXECUTOR_METRICS:
        assert f"| `{name}` |" in executors and allowed("executor", name), name
    documented = {n.replace("<id>", "7") for n in METRIC_DOCS} - {"metricsLineAgeMs"}
    assert all(allowed("driver", n) or allowed("executor", n) for n in documented), "a doc names no metric"


def test_every_figure_is_committed_and_shown() -> None:
    shown = "\n".join(pages().values())
    for name in (*FIGURES, "live-page.png"):
        path = DOCS / "images" / name
        assert path.read_bytes().startswith(b"\x89PNG"), name
        assert f"images/{name})" in shown, name


def test_the_primary_lock_pins_the_site_generator_within_the_declared_ranges() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("arrowbeat[") and "docs" in d for d in extras["dev"]), "dev brings docs"
    primary = next(c for c in matrix.CELLS if c.primary)
    assert primary.extras == "dev"
    locked = {}
    for line in primary.lock.read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep and not line.startswith("#"):
            locked[name.strip().lower().replace("_", "-")] = version.strip()
    for requirement in map(Requirement, extras["docs"]):
        assert requirement.specifier.contains(locked[requirement.name.lower()]), str(requirement)


def test_the_readme_is_one_page_that_links_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 150
    assert "make demo" in readme and "make test" in readme
    linked = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert linked, "the README links into the site"
    for target in linked:
        assert (ROOT / target).is_file(), target
