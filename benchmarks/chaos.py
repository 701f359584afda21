"""The chaos soak (issue 24, item 7), its long form: ``harness.chaos`` (where the suite also runs its
short form and checks its arithmetic) with this command line.

    flock /tmp/arrowbeat-spark.lock .venv/bin/python -m benchmarks.chaos --duration 1800 --seed 7
"""

from __future__ import annotations

from harness.chaos import main

if __name__ == "__main__":
    from spark_plugin.history.reader import run_reader

    run_reader(main)  # no interpreter finalisation: delta-rs's readers can abort it (exit 134)
