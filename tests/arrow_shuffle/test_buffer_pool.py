from __future__ import annotations

import threading

import pytest

from arrow_shuffle import BufferAccountingError, InsufficientBuffersError, NetworkBufferPool
from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool
from arrow_shuffle.credit import SenderCredit, UnannouncedCredit
from arrow_shuffle.errors import ChannelClosedError


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


def test_request_times_out_and_close_wakes_waiters() -> None:
    network = NetworkBufferPool(2, 4096)
    local = LocalBufferPool(network, 1, 1, "t")
    held = local.try_request()
    with pytest.raises(InsufficientBuffersError, match="consumer"):
        local.request(timeout_s=0.05)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            local.request(timeout_s=10)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    local.exhausted.clear()
    waiter.start()
    assert local.exhausted.wait(5)
    local.close()
    waiter.join(5)
    assert isinstance(errors[0], ChannelClosedError)
    assert held is not None
    held.recycle()
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
