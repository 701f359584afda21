"""The live page of a real application (the shared frozen-executor run of ``tests.harness.frozen``:
``hold_app.py`` on local-cluster[2,1,1024], heartbeats every 0.5 s, timeout 2 s) in a real
headless Chromium (Debian's package, ``make test`` installs it): the page, found from the
driver-side process's log line, lists both executors RUNNING with their heartbeat ages; one
executor JVM is frozen (SIGSTOP) and the page shows it red within interval + timeout (+ Chromium's
own start-up per look); requests without the token get 401. The SparkConf carries the page's URL
without the token (``spark.arrowbeat.ui.url``).

Set ``ARROWBEAT_LIVE_PAGE_SCREENSHOT=docs/images/live-page.png`` to keep the screenshot of the frozen
executor (the documentation site's picture)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Generator
from pathlib import Path

import pytest

from harness.procs import wait_until
from tests.harness.frozen import INTERVAL_S, TIMEOUT_S, FrozenRun, Phase, Probe

pytestmark = [pytest.mark.spark, pytest.mark.slow]
DETECT_DEADLINE_S = INTERVAL_S + TIMEOUT_S + 15.0
"""The RM reports a frozen JVM after at most interval + timeout and the page polls every interval;
the margin covers each look's own Chromium start-up (about a second, more on a loaded 2-core
machine)."""
GENEROUS_S = 60.0
PAGE_LINE = re.compile(r"arrowbeat live page: (http://[^\s/]+/)\?token=([0-9a-f]{32})")
ROW = re.compile(r'<tr data-executor="([^"]+)" data-state="([A-Z_]+)" data-health="([a-z]+)">(.*?)</tr>')
AGE = re.compile(r'<span class="age [a-z]+">([0-9.]+) s</span>')


class Browser:
    """Headless Chromium, one process tree per look, ended by its process group (ours alone)."""

    def __init__(self, profile: Path) -> None:
        self.chromium = shutil.which("chromium")
        if self.chromium is None:
            pytest.fail("no chromium on PATH: run `make test` (scripts/install_chromium.sh installs it)")
        self.profile = profile
        self.last = ""

    def run(self, url: str, *args: str) -> str:
        command = [
            self.chromium or "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={self.profile}",
            "--virtual-time-budget=3000",  # the page's first polls run before the dump
            *args,
            url,
        ]
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True
        )
        try:
            out, _ = proc.communicate(timeout=60)
        finally:  # the renderer, GPU and zygote processes share its new process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        return out

    def rows(self, url: str) -> dict[str, tuple[str, str, float | None]]:
        """Executor id -> (state, health, heartbeat age) as the page shows them."""
        self.last = self.run(url, "--dump-dom")
        found = {}
        for executor_id, state, health, cells in ROW.findall(self.last):
            age = AGE.search(cells)
            found[executor_id] = (state, health, float(age.group(1)) if age else None)
        return found


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


class LivePageProbe(Probe):
    """The page in Chromium before the freeze, while frozen (red, TIMEOUT) and after the thaw."""

    def __init__(self) -> None:
        super().__init__()
        self.detected_s = 0.0

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        app, info = run.app, run.ready
        browser = Browser(self.folder / "chromium-profile")
        assert wait_until(lambda: PAGE_LINE.search(app.log_text()), GENEROUS_S), app.log_tail()
        match = PAGE_LINE.search(app.log_text())
        assert match is not None
        base, token = match.groups()
        assert info["ui_url"] == base, "the SparkConf (the Environment page) has the URL without the token"
        url = f"{base}?token={token}"

        for path in ("", "api/executors", "api/events", "static/live.js", "?token=" + "0" * 32):
            assert status(base + path) == 401, path
        assert status(f"{base}api/executors?token={token}") == 200

        def both_running() -> bool:
            rows = browser.rows(url)
            return sorted(rows) == ["0", "1"] and all(
                state == "RUNNING" and age is not None for state, _, age in rows.values()
            )

        assert wait_until(both_running, GENEROUS_S, interval_s=0.5), browser.last[-3000:]

        yield Phase.FROZEN
        victim = run.frozen
        red = lambda: browser.rows(url).get(victim, ("", "", None))[1] == "red"  # noqa: E731
        assert wait_until(red, DETECT_DEADLINE_S, interval_s=0.2), browser.last[-3000:]
        self.detected_s = time.monotonic() - run.stopped_at
        timed_out = lambda: browser.rows(url).get(victim, ("", "", None))[0] == "TIMEOUT"  # noqa: E731
        assert wait_until(timed_out, 10.0, interval_s=0.2), browser.last[-3000:]
        others = [h for eid, (_, h, _) in browser.rows(url).items() if eid != victim]
        assert others == ["ok"], "only the frozen executor is red"
        assert re.search(rf'data-kind="HEARTBEAT_TIMEOUT" data-executor="{victim}"', browser.last)

        shot = self.folder / "live-page.png"
        browser.run(url, f"--screenshot={shot}", "--window-size=1400,520", "--hide-scrollbars")
        assert shot.read_bytes().startswith(b"\x89PNG")
        keep = os.environ.get("ARROWBEAT_LIVE_PAGE_SCREENSHOT")
        if keep:
            shutil.copyfile(shot, keep)

        yield Phase.THAWED
        back = lambda: browser.rows(url).get(victim, ("", "", None))[1] == "ok"  # noqa: E731
        assert wait_until(back, GENEROUS_S, interval_s=0.5), browser.last[-3000:]


LIVE_PAGE = LivePageProbe()
FROZEN_PROBES = (LIVE_PAGE,)


def test_the_live_page_shows_executors_and_turns_a_frozen_one_red(frozen_run: FrozenRun) -> None:
    LIVE_PAGE.verdict()
    assert frozen_run.result, "the application ran its last job"
    assert frozen_run.exit_code == 0
    print(f"the live page showed the frozen executor red after {LIVE_PAGE.detected_s:.1f} s")
