"""Server side of one remote channel: sends a subpartition's buffers as credit allows.

Flink's ``CreditBasedSequenceNumberingViewReader``: every BUFFER frame spends one credit and
carries its sequence number and the backlog left behind it; END_OF_PARTITION needs no credit.
An idle stream sends keepalives so the receiver can tell "slow" from "gone". With the partition's
``config.checksum`` (the default) every BUFFER frame carries the checksum (``checksum.digest``) of
its payload, computed by the transport from the pieces it sends (no copy), so the reader checks
the bytes before it decodes them.

Both time decisions, "is a keepalive due?" and "how long were we blocked on credit?", are read
from the ``Clock`` the server hands in; the condition wait between them is real, and only bounds
how late a jump of a ``ManualClock`` is noticed (one keepalive interval at most).
"""

from __future__ import annotations

import contextlib
import queue
import threading

from arrow_shuffle.codec import ArrowPayload
from arrow_shuffle.credit import SenderCredit
from arrow_shuffle.errors import ChannelClosedError, ProducerFailedError, ShuffleError, describe
from arrow_shuffle.frames import ErrorCode, Kind
from arrow_shuffle.partition import ResultPartition
from arrow_shuffle.transport import Connection
from arrowbeat_base.clock import SYSTEM_CLOCK, Clock


class StreamSender:
    """Pushes one subpartition to one connection; ``run()`` is the sender thread's body."""

    def __init__(
        self,
        conn: Connection,
        partition: ResultPartition,
        subpartition: int,
        initial_credit: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.conn = conn
        self.partition = partition
        self.subpartition = partition.subpartitions[subpartition]
        self.credit = SenderCredit(initial_credit)
        self.keepalive_s = partition.config.keepalive_interval_s
        self.checksum = partition.config.checksum
        self._clock = clock
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        """One item per wake-up call (a C queue: a ``Condition``'s Python-level notify cost a few
        microseconds per buffer); the sender thread drains it before each look at its work."""
        self._stopped = False
        self.completed = False
        self.hung_up = threading.Event()
        """Set when the stream's connection ended: the reader hung up (after END, or cancelled)."""
        self.buffers_sent = 0
        self.keepalives_sent = 0
        self.max_overdraft = 0  # max(sent - granted); > 0 would mean a buffer went out without credit
        self.blocked_on_credit_since: float | None = None
        """``clock.monotonic()`` since when data has been queued with no credit to send it, or
        ``None``; the interval goes into ``blocked_on_credit_s`` when the next buffer is sent."""
        self.where = describe(f"{partition.partition_id}#{subpartition}", conn.peer)
        self._opened_at = clock.monotonic()
        """When the stream was accepted: the keepalive interval counts from here, not from when the
        sender thread first runs (a clock that moved on in between, a test's jump say, would leave
        the first keepalive a whole interval after it, and a clock that then stands still, never)."""

    def notify(self) -> None:
        self._wake.put(None)

    def grant(self, credit: int) -> None:
        self.credit.grant(credit)
        self.notify()

    def stop(self) -> None:
        self._stopped = True
        self._wake.put(None)

    def run(self) -> None:
        clock = self._clock
        seq = 0
        last_send = self._opened_at
        wake = self._wake
        try:
            while True:
                while not wake.empty():  # wake-ups up to now: what they announced is looked at below
                    wake.get_nowait()
                if self._stopped:
                    return
                has_credit = self.credit.available > 0
                buffer, backlog, end = self.subpartition.poll(allow_data=has_credit)
                if buffer is not None:
                    spent = self.credit.try_spend()
                    try:
                        if spent and isinstance(buffer, ArrowPayload):  # from the batch's memory
                            self.conn.send_parts(
                                Kind.BUFFER,
                                buffer.parts,
                                buffer.size,
                                seq,
                                backlog,
                                buffer.segment.view,
                                checksum=self.checksum,
                            )
                        elif spent:
                            self.conn.send(
                                Kind.BUFFER,
                                buffer.segment.view[: buffer.size],
                                seq,
                                backlog,
                                checksum=self.checksum,
                            )
                    finally:
                        buffer.recycle()
                    if not spent:
                        raise ShuffleError(f"internal: buffer polled without credit {self.where}")
                    self.max_overdraft = max(
                        self.max_overdraft, self.credit.spent_total - self.credit.granted_total
                    )
                    self.buffers_sent += 1
                    self.partition.record(buffers_sent=1, bytes_sent=buffer.size)
                    seq += 1
                    last_send = clock.monotonic()
                    if self.blocked_on_credit_since is not None:
                        self._credit_wait_ended(last_send)
                    continue
                if end:
                    self.completed = True  # before the send: a reader that has END sees it set
                    try:
                        self.conn.send(Kind.END_OF_PARTITION, seq=seq)
                    except BaseException:
                        self.completed = False
                        raise
                    return
                now = clock.monotonic()
                if not has_credit and backlog > 0 and self.blocked_on_credit_since is None:
                    self.blocked_on_credit_since = now
                idle_for = now - last_send
                if idle_for >= self.keepalive_s:
                    self.conn.send(Kind.KEEPALIVE)
                    self.keepalives_sent += 1
                    # The time it fell due, not a reading after the send: a clock that moved on
                    # meanwhile (a test's jump, made once the reader heard this one) must find the
                    # next keepalive due, or the stream falls silent at that time for good.
                    last_send = now
                    continue
                with contextlib.suppress(queue.Empty):  # a wake-up since the drain returns at once
                    wake.get(timeout=max(0.0, self.keepalive_s - idle_for))
        except ProducerFailedError as exc:
            self._report(str(exc), ErrorCode.PRODUCER_FAILED)
        except ChannelClosedError as exc:
            self._report(f"partition released or stream closed: {exc}")
        except ShuffleError as exc:
            self._report(str(exc))
        except Exception as exc:  # a bug must still end the stream visibly, not hang it
            self._report(f"internal error in the sender: {exc!r}")
            raise
        finally:
            if self.blocked_on_credit_since is not None:  # ended (stopped, released) while blocked
                self._credit_wait_ended(clock.monotonic())

    def _credit_wait_ended(self, now: float) -> None:
        assert self.blocked_on_credit_since is not None
        self.partition.record(blocked_on_credit_s=now - self.blocked_on_credit_since)
        self.blocked_on_credit_since = None

    def _report(self, message: str, code: ErrorCode = ErrorCode.OTHER) -> None:
        """Best effort: tell the consumer why its stream ends (it may already be gone)."""
        with contextlib.suppress(ShuffleError):
            self.conn.send(Kind.ERROR, f"{message} {self.where}".encode(), value=code)
