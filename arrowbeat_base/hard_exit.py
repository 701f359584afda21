"""``exit_now``: end a process with a status, its logs and output flushed, without interpreter
finalisation.

Why: two kinds of arrowbeat process cannot finalise safely. The plugin's processes (agent, RM)
keep a daemon thread blocked reading the JVM's stdin, which finalisation trips over. A process
that read the history tables through delta-rs may still hold an Arrow table (a global, a cache, a
frame of ``main``) whose native reader threads run when the interpreter frees it, and the C++
runtime aborts ("terminate called without an active exception", exit 134, 3 runs in 12 of a
short read here; delta-io/delta-rs#2184) after the work is done, so a good run reads as failed.
Skipping finalisation skips ``atexit`` handlers too: call this once everything is closed (Spark
sessions stopped, servers stopped, temporary folders removed).

It sits in the base layer beside the clock (``tests/test_architecture.py``): every process of
arrowbeat may import it, and it imports nothing of arrowbeat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flushes the logs, stdout and stderr, then ends the process with status ``code``."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken pipe must not change the status
            stream.flush()
    os._exit(code)
