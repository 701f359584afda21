"""Credit accounting, pure (no I/O): the sender's credit, the receiver's unannounced credit, and
the receiver's ledger of what it announced, received and consumed.

Flink's rules: the receiver announces credit only when its unannounced count leaves zero (later
increments ride along with that announcement; ``RemoteInputChannel`` holds it back longer, while
the sender has enough unspent); the sender sends a data buffer only while it has credit. The
receiver's ledger checks the second rule from the other end of the wire, so tests need not trust
the sender's own counters.
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

    @property
    def pending(self) -> int:
        """Credits gained and not yet announced."""
        with self._lock:
            return self._count

    def take(self) -> int:
        """Everything unannounced, for one ADD_CREDIT message; resets to zero."""
        with self._lock:
            n, self._count = self._count, 0
            self.announced_total += n
            return n


class ReceiverLedger:
    """The receiver's witness of the credit contract: announced vs received vs consumed.

    Not thread-safe: the channel calls it under its own lock. ``announce`` is called when
    credit is taken for an ADD_CREDIT message, *before* it is sent, so a sender that keeps the
    contract can never make ``received`` overtake ``announced``; the witness has no false alarms.
    """

    def __init__(self, initial_credit: int) -> None:
        self.announced = initial_credit
        self.announcements = 0
        """ADD_CREDIT messages (each announces one or more credits)."""
        self.received = 0
        self.consumed = 0
        self.without_credit = 0
        """Buffers that arrived with no announced-and-unused credit, or no free buffer, for them."""
        self.max_in_flight = 0
        """Most buffers received and not yet consumed, sampled on every receive."""
        self.max_in_flight_over_credit = 0
        """Largest excess, on any receive, of in-flight buffers over the credit announced for
        buffers not yet consumed (``announced - consumed``); 0 while the contract holds."""

    def announce(self, credit: int) -> None:
        self.announced += credit
        self.announcements += 1

    def receive(self, has_free_buffer: bool) -> bool:
        """Account one arriving buffer; ``False`` if it came without credit (also counted)."""
        within = has_free_buffer and self.received < self.announced
        self.received += 1
        if not within:
            self.without_credit += 1
        in_flight = self.received - self.consumed
        self.max_in_flight = max(self.max_in_flight, in_flight)
        window = self.announced - self.consumed
        self.max_in_flight_over_credit = max(self.max_in_flight_over_credit, in_flight - window)
        return within

    def consume(self) -> None:
        """One received buffer was handed to the consumer."""
        self.consumed += 1
