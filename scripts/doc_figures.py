"""The documentation site's report figures, drawn from a real application's history.

``arrowbeat report`` draws its figures with ``spark_plugin.tools.report_plots``; this script draws
the same figures for the site from the history tables of an application that ran (by default the
latest one ``make demo`` recorded: a job on ``local-cluster[2,1,1024]`` with one executor frozen,
so the figures show a real timeout and re-registration) and writes them as PNGs under
``docs/images/``, where they are committed. The live page's picture comes from the browser test
(``ARROWBEAT_LIVE_PAGE_SCREENSHOT=docs/images/live-page.png`` with ``tests/spark/test_live_page.py``).

    make demo && python -m scripts.doc_figures [--tables PATH] [--app ID|latest|frozen] [--out docs/images]
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_plugin.history.reader import AppHistory

ROOT = Path(__file__).resolve().parent.parent
DEMO_TABLES = ROOT / ".cache" / "demo" / "warehouse" / "arrowbeat"
FIGURES = ("report-executor.png", "report-timeline.png", "report-shuffles.png")
"""What :func:`draw` writes (the pages under docs/ show them; ``tests/test_docs.py`` checks they exist)."""


FROZEN = "frozen"
"""``--app``'s default: the newest application whose history has a heartbeat timeout (``make demo``
runs two; the first freezes an executor)."""


def _timed_out(history: AppHistory) -> bool:
    return any(e["event"] == "HEARTBEAT_TIMEOUT" for e in history.events)


def draw(tables: Path | str, app: str, out: Path, timeout_s: float) -> list[Path]:
    """Writes the report's figures of ``app`` under ``out``: the executor with the longest silence,
    the timeline of all executors, and the bytes per shuffle (of the newest application with
    shuffles when ``app`` has none)."""
    from spark_plugin.history.reader import applications, load_history, resolve_app
    from spark_plugin.history.storage import locate
    from spark_plugin.tools.report_plots import executor_plot, shuffle_plot, timeline_plot

    location = locate(str(tables))
    if app == FROZEN:
        history = next(
            (h for a, _ in applications(location) if _timed_out(h := load_history(location, a))), None
        )
        if history is None:
            raise SystemExit(f"doc_figures: no application under {tables} recorded a HEARTBEAT_TIMEOUT")
    else:
        history = load_history(location, resolve_app(location, app))
    if not history.executors:
        raise SystemExit(f"doc_figures: application {history.app_id} recorded no executor")
    loudest = max(history.executors, key=lambda e: e.longest_gap()[0])
    shuffled = history if history.shuffles else None
    for a, _ in applications(location) if shuffled is None else ():
        if (candidate := load_history(location, a)).shuffles:
            shuffled = candidate  # make demo's second application (jobs/arrow_pipeline.py)
            break
    if shuffled is None:
        raise SystemExit(f"doc_figures: no application under {tables} recorded a shuffle")
    pngs = {
        FIGURES[0]: executor_plot(loudest, timeout_s),
        FIGURES[1]: timeline_plot(history.executors, timeout_s),
        FIGURES[2]: shuffle_plot(shuffled.shuffles),
    }
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, png in pngs.items():
        path = out / name
        path.write_bytes(base64.b64decode(png))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.doc_figures", description=__doc__)
    parser.add_argument("--tables", default=str(DEMO_TABLES), help="history tables (default: make demo's)")
    parser.add_argument("--app", default=FROZEN, help="application id, latest, or frozen (the default)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    parser.add_argument("--timeout", type=float, default=5.0, help="the run's heartbeat timeout, s")
    args = parser.parse_args(argv)
    for path in draw(args.tables, args.app, args.out, args.timeout):
        print(f"doc_figures: wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
