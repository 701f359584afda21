from __future__ import annotations

import threading

import pytest

from arrow_shuffle import BufferAccountingError, InsufficientBuffersError, NetworkBufferPool
from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool
from arrow_shuffle.credit import SenderCredit, UnannouncedCredit
from arrow_shuffle.errors import ChannelClosedError
from heartbeat.clock import ManualClock


def test_over_release_raises() -> None:
    network = NetworkBufferPool(4, 4096)
    local = LocalBufferPool(network, 1, 2, "t")
    buffer = local.try_request()
    assert buffer is not None
    buffer.recycle()
    with pytest.raises(BufferAccountingError):
        buffer.recycle()
    segment = network.try_request()
    assert segment is not None
    network.release([segment])
    with pytest.raises(BufferAccountingError):
        network.release([segment])


def test_reserve_is_all_or_nothing() -> None:
    network = NetworkBufferPool(3, 4096)
    with pytest.raises(InsufficientBuffersError, match="network_memory_bytes"):
        network.reserve(4, "gate")
    assert network.num_available == 3


def test_local_pool_is_bounded_and_returns_everything() -> None:
    network = NetworkBufferPool(10, 4096)
    local = LocalBufferPool(network, 2, 4, "t")
    taken = [local.try_request() for _ in range(5)]
    assert taken[4] is None
    assert local.peak_in_use == 4
    for b in taken[:4]:
        assert b is not None
        b.recycle()
    local.close()
    assert network.num_available == 10


def test_blocked_request_wakes_on_recycle() -> None:
    network = NetworkBufferPool(4, 4096)
    local = LocalBufferPool(network, 1, 1, "t")
    held = local.try_request()
    assert held is not None
    got: list[Buffer] = []
    waiter = threading.Thread(target=lambda: got.append(local.request(timeout_s=10)))
    waiter.start()
    assert local.exhausted.wait(5)
    assert not got
    held.recycle()
    waiter.join(5)
    assert len(got) == 1
    got[0].recycle()
    local.close()
    assert network.num_available == 4


def test_request_deadline_and_blocked_time_are_on_the_pool_clock_and_close_wakes_waiters() -> None:
    """The deadline and ``blocked_s`` come from the pool's clock: a waiter served after a jump
    short of its timeout was blocked exactly that long, one still waiting fails at the jump that
    reaches its timeout, and ``close()`` wakes a waiter whatever the clock says."""
    clock = ManualClock()
    network = NetworkBufferPool(2, 4096)
    local = LocalBufferPool(network, 1, 1, "t", clock=clock)
    held = local.try_request()
    assert held is not None
    errors: list[BaseException] = []
    got: list[Buffer] = []

    def wait(timeout_s: float) -> None:
        try:
            got.append(local.request(timeout_s))
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait, args=(10.0,))
    waiter.start()
    assert local.exhausted.wait(10)
    clock.jump(9.0)  # short of the timeout: the buffer recycled now still reaches the waiter
    held.recycle()
    waiter.join(10)
    assert not errors and len(got) == 1
    assert local.blocked_s == pytest.approx(9.0)

    waiter = threading.Thread(target=wait, args=(10.0,))
    local.exhausted.clear()
    waiter.start()
    assert local.exhausted.wait(10)
    clock.jump(10.0)
    waiter.join(10)
    assert not waiter.is_alive()
    [error] = errors
    assert isinstance(error, InsufficientBuffersError) and "after 10.0s" in str(error)
    assert "is the consumer reading?" in str(error)
    assert local.blocked_s == pytest.approx(19.0)

    waiter = threading.Thread(target=wait, args=(10.0,))
    local.exhausted.clear()
    waiter.start()
    assert local.exhausted.wait(10)
    local.close()
    waiter.join(10)
    assert isinstance(errors[1], ChannelClosedError)
    got[0].recycle()
    assert network.num_available == 2


def test_listener_gets_recycled_buffer_outside_the_lock() -> None:
    network = NetworkBufferPool(2, 4096)
    local = LocalBufferPool(network, 0, 1, "floating")
    first = local.try_request()
    assert first is not None
    handed: list[Buffer] = []

    def listener(buffer: Buffer) -> bool:
        # Re-entering the pool from the listener would deadlock if it ran under the lock.
        assert local.in_use == 1
        handed.append(buffer)
        return True

    assert local.request_or_listen(listener) is None
    first.recycle()
    assert len(handed) == 1
    handed[0].recycle()
    local.close()
    assert network.num_available == 2


def test_credit_is_announced_only_when_leaving_zero() -> None:
    credit = UnannouncedCredit()
    assert credit.add(1) is True
    assert credit.add(2) is False
    assert credit.take() == 3
    assert credit.add(1) is True
    assert credit.announced_total == 3
    sender = SenderCredit(2)
    assert sender.try_spend() and sender.try_spend()
    assert not sender.try_spend()
    sender.grant(1)
    assert sender.try_spend()
    assert sender.spent_total == sender.granted_total == 3
