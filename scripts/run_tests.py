"""``make test``'s primary cell: the tests that start no JVM run beside the ones that do.

The two halves wait on different things: the JVM-less tests on sockets, deadlines and child
processes of their own (about a minute of CPU in three and a half minutes), the Spark tests on
executors, heartbeat timeouts and Spark's scheduler. Run one after the other, the machine idles
through most of both; run side by side, the JVM-less half finishes inside the Spark half.

Each half is its own pytest session, with its own run marker (``tests.harness.procs.MARKER``),
scratch folder and leftover-process check. The JVM-less half leaves Spark's work dirs to the
half that makes them (``NO_JVM``). The Spark half prints as it goes; the other half's output is
kept in ``.cache/test-logs/no-jvm.log`` and printed when it has finished. The exit status is
non-zero when either half fails.

    python -m scripts.run_tests [PYTEST ARGS]     extra arguments go to both halves

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
NO_JVM = "ARROWBEAT_TESTS_NO_JVM"
"""Set for the JVM-less half: its clean-up leaves Spark's work dirs to the Spark half, whose
applications may still read an ended executor's logs there (``tests.harness.env``)."""
MARKER = "ARROWBEAT_TEST_RUN"  # tests.harness.procs.MARKER: each half draws its own


def _pytest(python: str, marks: str, extra: list[str]) -> list[str]:
    return [python, "-m", "pytest", "-q", "-rs", "--durations=15", "-m", marks, *extra, "tests"]


def main(argv: list[str]) -> int:
    python = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    LOGS.mkdir(parents=True, exist_ok=True)
    log_path = LOGS / "no-jvm.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        no_jvm = subprocess.Popen(
            _pytest(python, "not spark", argv), cwd=ROOT, env={**env, NO_JVM: "1"}, stdout=log, stderr=log
        )
        try:
            spark_rc = subprocess.call(_pytest(python, "spark", argv), cwd=ROOT, env=env)
            no_jvm_rc = no_jvm.wait()
        finally:
            if no_jvm.poll() is None:  # interrupted: end the half we started
                no_jvm.terminate()
                no_jvm.wait(30)
    print(f"\n---- tests without a JVM ({log_path.relative_to(ROOT)}) ----", flush=True)
    sys.stdout.write(log_path.read_text(errors="replace"))
    took = time.monotonic() - started
    outcome = f"spark half exit {spark_rc}, no-JVM half exit {no_jvm_rc}"
    print(f"\nprimary cell: {outcome}, {took:.0f}s", flush=True)
    return 0 if spark_rc == 0 and no_jvm_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
