"""Credit accounting, pure (no I/O): the sender's credit and the receiver's unannounced credit.

Flink's rules: the receiver announces credit only when its unannounced count leaves zero (later
increments ride along with that announcement); the sender sends a data buffer only while it has
credit. Counters let tests assert the invariants directly.
"""

from __future__ import annotations

import threading


class SenderCredit:
    """Credit the sender has been granted and not yet spent."""

    def __init__(self, initial: int) -> None:
        self._lock = threading.Lock()
        self.available = initial
        self.granted_total = initial
        self.spent_total = 0

    def grant(self, credit: int) -> None:
        with self._lock:
            self.available += credit
            self.granted_total += credit

    def try_spend(self) -> bool:
        with self._lock:
            if self.available <= 0:
                return False
            self.available -= 1
            self.spent_total += 1
            return True


class UnannouncedCredit:
    """Receiver-side credit gained but not yet sent to the sender."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self.announced_total = 0

    def add(self, n: int = 1) -> bool:
        """Record ``n`` new credits; ``True`` when the count left zero, i.e. the caller must announce."""
        with self._lock:
            was_zero = self._count == 0
            self._count += n
            return was_zero and n > 0

    def take(self) -> int:
        """Everything unannounced, for one ADD_CREDIT message; resets to zero."""
        with self._lock:
            n, self._count = self._count, 0
            self.announced_total += n
            return n
