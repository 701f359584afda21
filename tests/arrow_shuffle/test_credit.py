"""The receiver's credit ledger, pure: what counts as a buffer without credit, and in flight."""

from __future__ import annotations

from arrow_shuffle.credit import ReceiverLedger


def test_buffers_within_announced_credit_are_accepted() -> None:
    ledger = ReceiverLedger(initial_credit=2)
    assert ledger.receive(has_free_buffer=True)
    assert ledger.receive(has_free_buffer=True)
    ledger.consume()
    ledger.announce(1)  # the consumed buffer's credit, announced before it is sent
    assert ledger.receive(has_free_buffer=True)
    assert ledger.without_credit == 0
    assert ledger.max_in_flight == 2
    assert ledger.max_in_flight_over_credit == 0


def test_a_buffer_beyond_announced_credit_is_counted_even_with_a_free_buffer() -> None:
    ledger = ReceiverLedger(initial_credit=1)
    assert ledger.receive(has_free_buffer=True)
    # A free buffer whose credit was not announced yet does not make the next buffer legal.
    assert not ledger.receive(has_free_buffer=True)
    assert ledger.without_credit == 1
    assert ledger.max_in_flight == 2
    assert ledger.max_in_flight_over_credit == 1


def test_a_buffer_with_credit_but_no_free_buffer_is_counted() -> None:
    ledger = ReceiverLedger(initial_credit=3)
    assert not ledger.receive(has_free_buffer=False)
    assert ledger.without_credit == 1
    assert ledger.max_in_flight_over_credit == 0  # within credit: the receiver broke its own books


def test_in_flight_is_what_was_received_and_not_yet_consumed() -> None:
    ledger = ReceiverLedger(initial_credit=4)
    for _ in range(3):
        ledger.receive(has_free_buffer=True)
    for _ in range(3):
        ledger.consume()
    ledger.announce(3)
    ledger.receive(has_free_buffer=True)
    assert ledger.max_in_flight == 3
    assert (ledger.announced, ledger.received, ledger.consumed) == (7, 4, 3)
