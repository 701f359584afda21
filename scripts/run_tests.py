"""``make test``'s primary cell: the tests that start no JVM and the two Spark shards side by side,
then the chaos soak alone.

The three wait on different things: the JVM-less tests on sockets, deadlines and child processes
of their own (about a minute of CPU in three and a half minutes), the Spark tests on executors,
heartbeat timeouts, flush intervals and Spark's scheduler. Run one after the other, the machine
idles through much of each; side by side, they fill each other's waits. The Spark tests are split
by module into two shards (``tests/harness/shards.py``). The chaos soak's short form (tests marked
``chaos``) runs last and alone: it asserts that no executor is ever falsely timed out while faults
are injected, which it should prove on a machine busy with nothing else.

Each run is its own pytest session, with its own run marker (``harness.procs.MARKER``),
leftover-process check and scratch folder, which holds its ``local-cluster`` work dirs too
(``harness.env``: its own ``SPARK_HOME``). The first shard and the chaos
soak print as they go; the other runs' output is kept in ``.cache/test-logs/`` and printed when
they have finished. The exit status is non-zero when any run fails.

    python -m scripts.run_tests [PYTEST ARGS]     extra arguments go to every run

Only the standard library is imported here: the venv's pytest is run as a child.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".cache" / "test-logs"
MARKER = "ARROWBEAT_TEST_RUN"  # harness.procs.MARKER: each run draws its own
NOTHING_SELECTED = 5
"""pytest's exit status when arguments (``-k``, a path) leave a run no test: not a failure,
unless it is every run's."""


def _pytest(python: str, marks: str, extra: list[str], *options: str) -> list[str]:
    # No cache plugin: three sessions at once would overwrite each other's ``lastfailed``.
    pytest = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--durations=15"]
    return [*pytest, "-m", marks, *options, *extra, "tests"]


def main(argv: list[str]) -> int:
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    spark = "spark and not chaos"
    logged = {
        "tests without a JVM": (LOGS / "no-jvm.log", _pytest(python, "not spark", argv)),
        "Spark shard 2/2": (LOGS / "spark-2.log", _pytest(python, spark, argv, "--spark-shard", "2/2")),
    }
    codes: dict[str, int] = {}
    children: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, (log_path, command) in logged.items():
            with log_path.open("wb") as log:
                children[name] = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
        shard_one = _pytest(python, spark, argv, "--spark-shard", "1/2")
        codes["Spark shard 1/2"] = subprocess.call(shard_one, cwd=ROOT, env=env)
        for name, child in children.items():
            codes[name] = child.wait()
    finally:
        for child in children.values():
            if child.poll() is None:  # interrupted: end the runs we started
                child.terminate()
                child.wait(30)
    for name, (log_path, _) in logged.items():
        print(f"\n---- {name} ({log_path.relative_to(ROOT)}) ----", flush=True)
        sys.stdout.write(log_path.read_text(errors="replace"))
    print(f"\n---- the chaos soak, alone (after {time.monotonic() - started:.0f}s) ----", flush=True)
    chaos = subprocess.call(_pytest(python, "chaos", argv), cwd=ROOT, env=env)
    codes["chaos soak"] = chaos
    took = time.monotonic() - started
    outcome = ", ".join(f"{name} exit {code}" for name, code in codes.items())
    print(f"\nprimary cell: {outcome}, {took:.0f}s", flush=True)
    if all(code == NOTHING_SELECTED for code in codes.values()):
        print("no test selected by these arguments", flush=True)
        return 1
    return 0 if all(code in (0, NOTHING_SELECTED) for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
