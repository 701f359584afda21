"""The bookkeeping soak, its long form: ``harness.bookkeeping_soak`` (whose short form the suite runs
in ``tests/spark_plugin/shuffle/test_bounded_state.py``) with this command line.

    .venv/bin/python -m benchmarks.bookkeeping_soak --shuffles 100000
"""

from __future__ import annotations

from harness.bookkeeping_soak import main

if __name__ == "__main__":
    raise SystemExit(main())
