"""The standalone cluster's thaw time, without Spark (``harness.standalone``): what a frozen
host does after SIGCONT comes after the time ``thaw`` returns, however fast it does it. The freeze
test and the ``host_freeze`` benchmark look for the re-registration after that time; taken after
the thaw, it missed one that came within milliseconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil

from harness.procs import wait_until
from harness.standalone import StandaloneCluster, Worker

TICKER = """
import sys, time
with open(sys.argv[1], "a") as out:
    while True:
        out.write(f"{time.time()!r}\\n")
        out.flush()
        time.sleep(0.001)
"""


def test_what_a_thawed_host_does_first_comes_after_the_thaw_time(tmp_path: Path) -> None:
    """A stand-in host writes the wall time every millisecond: its first line after the SIGCONT
    is never older than what ``thaw`` returned."""
    ticks = tmp_path / "ticks"
    proc = subprocess.Popen([sys.executable, "-c", TICKER, str(ticks)])
    worker = Worker("host9", "127.0.0.9", tmp_path, tmp_path, tmp_path, tmp_path / "log", proc)
    cluster = StandaloneCluster(tmp_path, "tmpdir", 0, 0, [worker])
    try:
        assert wait_until(lambda: ticks.exists() and ticks.stat().st_size > 0, 10)
        cluster.freeze(worker)
        assert wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 10)
        before = ticks.read_text()
        thawed_at = cluster.thaw(worker)
        assert wait_until(lambda: ticks.read_text().count("\n") > before.count("\n") + 1, 10)
        first_after = float(ticks.read_text()[len(before) :].splitlines()[0])
        assert first_after >= thawed_at
    finally:
        proc.kill()
        proc.wait(10)
