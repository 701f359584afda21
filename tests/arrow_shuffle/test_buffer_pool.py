from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

from arrow_shuffle import (
    BufferAccountingError,
    InsufficientBuffersError,
    NetworkBufferPool,
    PartitionId,
    RecordWriter,
    ResultPartition,
    ShuffleConfig,
    ShuffleConfigError,
)
from arrow_shuffle.buffer_pool import Buffer, LocalBufferPool, Reservation, Segment
from arrow_shuffle.credit import SenderCredit, UnannouncedCredit
from arrow_shuffle.errors import ChannelClosedError
from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until

from .local_read import read_subpartition


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


# -- waiting for reservations (an agent's staged streams under load) -------------------------------


def _granted(reservation: Reservation) -> bool:
    return reservation.event.is_set()


def test_reservations_are_served_first_come_first_served_and_floating_requests_wait_behind_them() -> None:
    network = NetworkBufferPool(4, 4096)
    held = network.enqueue(4, "first").wait(1)  # granted at once: nothing queued, all free
    b, c, d = (network.enqueue(n, name) for n, name in ((2, "b"), (1, "c"), (2, "d")))
    assert network.queued == 3 and network.reservations_queued == 3
    with pytest.raises(InsufficientBuffersError, match=r"3 reservations queued before it"):
        network.reserve(1, "jumper")  # an immediate reservation never jumps the queue
    network.release(held[:1])
    # One free: c (needs 1) must not overtake b (needs 2), nor a floating request either.
    assert not any(_granted(r) for r in (b, c, d)) and network.try_request() is None
    network.release(held[1:2])
    assert _granted(b) and not _granted(c)
    network.release(held[2:3])
    assert _granted(c) and not _granted(d)
    network.release(held[3:4])
    assert not _granted(d) and network.num_available == 1
    got_b, got_c = b.wait(1), c.wait(1)
    assert (len(got_b), len(got_c)) == (2, 1)
    network.release(got_c)
    assert _granted(d) and network.queued == 0
    network.release(got_b + d.wait(1))
    assert network.num_available == 4 and network.try_request() is not None


def test_reservation_deadline_is_on_the_clock_and_the_error_names_what_it_waited_for() -> None:
    """A wait served short of its deadline reports exactly how long it queued; one that reaches
    it fails naming the purpose, the count and the pool, and leaves the queue, so a smaller
    reservation behind it (held back by strict FIFO) is served at once."""
    clock = ManualClock()
    network = NetworkBufferPool(3, 4096)
    held = network.reserve(3, "others")
    first = network.enqueue(2, "stream A", clock)
    done: list[list[Segment]] = []
    waiter = threading.Thread(target=lambda: done.append(list(first.wait(30.0))))
    waiter.start()
    clock.jump(29.0)
    network.release(held[:2])
    waiter.join(10)
    assert len(done[0]) == 2 and first.waited_s == pytest.approx(29.0)
    assert network.reservation_wait_max_s == pytest.approx(29.0)

    stuck = network.enqueue(2, "staged stream of shuffle 3, reduce partition 5", clock)
    behind = network.enqueue(1, "stream C", clock)
    network.release(held[2:])  # one free: enough for C, which waits behind the stuck head
    assert not _granted(behind)
    errors: list[BaseException] = []

    def wait_stuck() -> None:
        try:
            stuck.wait(30.0)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait_stuck)
    waiter.start()
    clock.jump(30.0)
    waiter.join(10)
    assert not waiter.is_alive()
    [error] = errors
    assert isinstance(error, InsufficientBuffersError)
    message = str(error)
    assert "staged stream of shuffle 3, reduce partition 5 waited 30.0s" in message
    assert "2 network buffers of 4096 bytes" in message and "1 of 3 free" in message
    assert network.reservations_timed_out == 1
    assert _granted(behind) and network.queued == 0
    network.release(behind.wait(1) + done[0])
    assert network.num_available == 3


def test_a_reservation_larger_than_the_pool_fails_at_once() -> None:
    network = NetworkBufferPool(2, 4096)
    with pytest.raises(InsufficientBuffersError, match=r"needs 3 network buffers but the pool has only 2"):
        network.enqueue(3, "huge")
    assert network.queued == 0


def test_closing_a_local_pool_withdraws_its_queued_reservation() -> None:
    network = NetworkBufferPool(2, 4096)
    held = network.reserve(2, "others")
    local = LocalBufferPool(network, 2, 4, "late stream", reserve_now=False)
    assert local.owned == 0 and not local.reserved and local.try_request() is None
    errors: list[BaseException] = []

    def reserve() -> None:
        try:
            local.reserve(60.0)
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=reserve)
    waiter.start()
    assert wait_until(lambda: network.queued == 1, 10)
    local.close()
    waiter.join(10)
    assert not waiter.is_alive() and isinstance(errors[0], ChannelClosedError)
    assert network.queued == 0
    network.release(held)
    assert network.num_available == 2


def test_a_deferred_local_pool_queues_on_first_request_gives_surplus_back_and_drains() -> None:
    network = NetworkBufferPool(6, 4096)
    local = LocalBufferPool(network, 2, 4, "stream", reserve_now=False)
    assert network.num_available == 6
    buffers = [local.request(timeout_s=5) for _ in range(4)]  # queues for its 2, then floats 2
    assert local.reserved and local.in_use == 4 and network.num_available == 2
    other = network.reserve(2, "other")
    queued = network.enqueue(2, "next stream")
    buffers.pop().recycle()  # surplus goes back to the queue's head even though...
    assert not _granted(queued)
    buffers.pop().recycle()
    assert _granted(queued) and local.owned == 2  # ...it keeps its reserved two
    buffers.pop().recycle()
    assert local.owned == 2  # within the reserved minimum: kept
    local.drain()  # the writer finished: everything goes back, the minimum too
    assert local.owned == 1
    buffers.pop().recycle()
    assert local.owned == 0
    network.release(other + queued.wait(1))
    assert network.num_available == 6


def test_partition_pool_share_caps_one_streams_buffers(tmp_path: Path) -> None:
    """A PIPELINED partition whose reader does not read stops at its share of the pool; another
    stream still gets its own share. The share never cuts below the reserved minimum."""
    config = ShuffleConfig(buffer_size=4096, network_memory_bytes=32 * 4096, partition_pool_share=0.25)
    network = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    schema = pa.schema([("x", pa.int64())])
    greedy = ResultPartition(PartitionId("a", 1, 0), 1, schema, network, config=config)
    assert greedy.pool.max_segments == 8  # 2 per subpartition + 8 floating = 10, capped at 32 / 4
    held = [greedy.request_buffer() for _ in range(8)]
    assert greedy.pool.try_request() is None and network.num_available == 24
    other = ResultPartition(PartitionId("a", 1, 1), 1, schema, network, config=config)
    more = [other.request_buffer() for _ in range(8)]
    assert network.num_available == 16
    for b in held + more:
        b.recycle()
    greedy.release()
    other.release()
    assert network.num_available == 32
    tiny = config.replace(partition_pool_share=0.01)
    assert ResultPartition(PartitionId("a", 1, 2), 1, schema, network, config=tiny).pool.max_segments == 2
    for bad in (0.0, 1.5, "half"):
        with pytest.raises(
            ShuffleConfigError, match=r"partition_pool_share=.*allowed 0.01 <= partition_pool_share <= 1.0"
        ):
            config.replace(partition_pool_share=bad)
    with pytest.raises(ShuffleConfigError, match=r"buffer_reserve_timeout_s=0 is out of range"):
        config.replace(buffer_reserve_timeout_s=0)


def test_many_streams_on_a_small_pool_queue_and_all_finish_exactly(tmp_path: Path) -> None:
    """Twelve streams, each reserving two of six buffers: at most three run at once, the others
    queue (first come, first served) and every stream delivers all its rows."""
    config = ShuffleConfig(buffer_size=4096, network_memory_bytes=6 * 4096, flush_timeout_s=0)
    network = NetworkBufferPool.from_config(config.network_memory_bytes, config.buffer_size)
    schema = pa.schema([("stream", pa.int64()), ("seq", pa.int64())])
    streams = 12
    partitions = [
        ResultPartition(PartitionId("a", 2, i), 1, schema, network, config=config, reserve_now=False)
        for i in range(streams)
    ]
    failures: list[BaseException] = []
    results: dict[int, list[int]] = {}

    def write(i: int) -> None:
        try:
            partitions[i].reserve_buffers()
            writer = RecordWriter(partitions[i])
            for start in range(0, 3000, 300):
                seq = pa.array(range(start, start + 300), pa.int64())
                writer.write(pa.record_batch([pa.array([i] * 300, pa.int64()), seq], schema=schema), 0)
            writer.finish()
        except BaseException as exc:
            failures.append(exc)

    def read(i: int) -> None:
        try:
            table = read_subpartition(partitions[i], 0, timeout_s=60.0)
            results[i] = table.column("seq").to_pylist()
            assert set(table.column("stream").to_pylist()) == {i}
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=f, args=(i,)) for i in range(streams) for f in (write, read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures and not any(t.is_alive() for t in threads)
    assert all(results[i] == list(range(3000)) for i in range(streams))
    assert network.reservations_queued > 0  # buffers ran out: streams queued instead of failing
    for partition in partitions:
        partition.release()
    assert network.num_available == 6 and network.queued == 0
