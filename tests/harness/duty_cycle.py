"""A slowed, not frozen, process: SIGSTOP and SIGCONT on a duty cycle (issue 37's gray failure).

``DutyCycle(pid, stop_s=0.15, period_s=0.3)`` stops the process for ``stop_s`` of every
``period_s`` on a thread of its own, by deadlines on the monotonic clock (a late wake-up shortens
the next wait instead of drifting), until :meth:`stop`. Whatever happens, the process is left
running: :meth:`stop` and the thread's own ``finally`` both send SIGCONT. Used by the tests and
the job-recovery benchmark alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time


class DutyCycle:
    """Stops ``pid`` ``stop_s`` of every ``period_s`` from :meth:`start` until :meth:`stop`."""

    def __init__(self, pid: int, stop_s: float = 0.15, period_s: float = 0.3) -> None:
        if not 0 < stop_s < period_s:
            raise ValueError(f"need 0 < stop_s < period_s, got {stop_s} and {period_s}")
        self.pid = pid
        self.stop_s = stop_s
        self.period_s = period_s
        self.started_at: float | None = None
        """Wall-clock time of the first SIGSTOP."""
        self.cycles = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"duty-cycle-{pid}", daemon=True)

    def start(self) -> DutyCycle:
        self._thread.start()
        return self

    def _run(self) -> None:
        begin = time.monotonic()
        try:
            while not self._stopping.is_set():
                cycle_start = begin + self.cycles * self.period_s
                os.kill(self.pid, signal.SIGSTOP)
                if self.started_at is None:
                    self.started_at = time.time()
                self._stopping.wait(max(0.0, cycle_start + self.stop_s - time.monotonic()))
                os.kill(self.pid, signal.SIGCONT)
                self.cycles += 1
                self._stopping.wait(max(0.0, cycle_start + self.period_s - time.monotonic()))
        except ProcessLookupError:
            return  # the process is gone: nothing to slow, nothing to continue
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Ends the cycle and leaves the process running (SIGCONT), however the thread ended."""
        self._stopping.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def __enter__(self) -> DutyCycle:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
