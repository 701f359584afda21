"""The agent's buffers under load, without Spark: staged streams queue for the agent's pool (first
come, first served, with a deadline whose error the reader gets), a stage nobody connects to is
freed within the peer timeout, and the TTL of a shuffle counts its reads and spares outputs in use.

Real ``MapOutputService``s serve real map-output files over the engine's transport to real
``InputGate``s; time that decides (stage expiry, the queue's deadline, the TTL) is a
``ManualClock`` moved by the test, while the streams themselves run on the system clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from arrow_shuffle import InputGate, NetworkBufferPool, RemoteChannelSpec, ShuffleConfig, ShuffleError
from arrow_shuffle.ids import PartitionId
from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.agent_layout import note_read
from spark_plugin.shuffle.map_output import MapOutputWriter

SECRET = "agent-buffers-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64())])
BUFFER = 4096
CONFIG = ShuffleConfig(
    buffer_size=BUFFER,
    network_memory_bytes=4 * BUFFER,  # two streams' reserved buffers: a third must queue
    keepalive_interval_s=0.2,
    peer_timeout_s=2.0,
    buffer_reserve_timeout_s=30.0,
)
ROWS = 20_000  # ~320 KB per stream: far more than a stream's buffers, so an unread one stays open


@pytest.fixture
def clock() -> ManualClock:
    """Its wall reading starts at the real time: map-output files get real modification times."""
    return ManualClock(start=1000.0, wall_start=time.time())


@pytest.fixture
def service(tmp_path: Path, clock: ManualClock) -> Iterator[MapOutputService]:
    svc = MapOutputService(
        "app-b", "5", SECRET, str(tmp_path / "root"), jvm_pid=5151, config=CONFIG, ttl_s=600.0, clock=clock
    )
    yield svc
    svc.close()


def write_map(svc: MapOutputService, shuffle: int, m: int = 0) -> tuple[str, list[Any]]:
    """One map output of ``ROWS`` rows for a single reducer; its path and segments."""
    path = str(Path(svc.dir) / f"s{shuffle}" / f"m{m}.arrows")
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 30)
    for start in range(0, ROWS, 2000):
        ids = list(range(start, start + 2000))
        writer.write(pa.record_batch([pa.array(ids, pa.int64()), pa.array(ids, pa.float64())], schema=SCHEMA))
    return path, writer.finish()[0].segments


def gate(svc: MapOutputService, pid: PartitionId) -> InputGate:
    need = CONFIG.exclusive_buffers_per_channel + CONFIG.floating_buffers_per_gate
    return InputGate(
        [RemoteChannelSpec(svc.data_address, pid, 0)], SCHEMA, NetworkBufferPool(need, BUFFER), CONFIG, SECRET
    )


def connected(svc: MapOutputService, count: int) -> bool:
    return len(svc.server.senders()) >= count


def test_a_stage_nobody_connects_to_is_freed_within_the_peer_timeout(
    service: MapOutputService, clock: ManualClock
) -> None:
    """Two stages hold the whole pool, a third queues; no reducer ever connects. At the peer
    timeout, on the agent's clock, all three are freed and the pool is whole again."""
    path, segments = write_map(service, 1)
    pids = [service.stage(1, r, SCHEMA, [(path, segments)]) for r in range(3)]
    assert wait_until(lambda: service.metrics()["shuffle_streams_waiting"] == 1, 10)
    assert service.pool.num_available == 0
    clock.jump(CONFIG.peer_timeout_s - 0.1)
    assert service.expire_stages() == 0 and service.metrics()["shuffle_streams_open"] == 3
    clock.jump(0.2)
    assert wait_until(lambda: service.metrics()["shuffle_streams_open"] == 0, 10)  # the reaper thread
    figures = service.metrics()
    assert figures["shuffle_streams_expired"] == 3 and figures["shuffle_streams_waiting"] == 0
    assert wait_until(lambda: service.pool.num_available == service.pool.num_segments, 10)
    with gate(service, pids[0]) as late, pytest.raises(ShuffleError, match="never registered or released"):
        late.read_all()  # the reducer came back after all: refused, not served a freed stream
    assert Path(path).exists()  # expiry frees buffers; the map outputs stay for a retry


def test_queued_streams_wait_their_turn_and_a_connected_one_never_expires(
    service: MapOutputService, clock: ManualClock
) -> None:
    """Three reducers on a pool for two: the third is connected but queued while the clock
    passes the peer timeout many times over; once the first two are read it gets its buffers
    and every reducer receives all its rows. Its wait is measured on the agent's clock."""
    path, segments = write_map(service, 2)
    pids = [service.stage(2, r, SCHEMA, [(path, segments)]) for r in range(3)]
    results: dict[int, pa.Table] = {}
    third = gate(service, pids[2])
    third.start()
    reader = threading.Thread(target=lambda: results.__setitem__(2, third.read_all()))
    reader.start()
    assert wait_until(lambda: service.metrics()["shuffle_streams_waiting"] == 1, 10)
    clock.jump(10 * CONFIG.peer_timeout_s)  # the first two stages are not connected yet either...
    firsts = [gate(service, pid) for pid in pids[:2]]
    for g in firsts:
        g.start()
    assert wait_until(lambda: connected(service, 3), 10)
    assert service.expire_stages() == 0  # ...but all three are connected now: none expires
    for r, g in enumerate(firsts):
        results[r] = g.read_all()
    reader.join(30)
    assert not reader.is_alive()
    assert all(results[r].num_rows == ROWS for r in range(3))
    assert sorted(results[2].column("k").to_pylist()) == list(range(ROWS))
    figures = service.metrics()
    assert figures["shuffle_streams_queued"] == 1 and figures["shuffle_streams_expired"] == 0
    assert figures["shuffle_stream_wait_max_s"] == pytest.approx(10 * CONFIG.peer_timeout_s)
    for pid in pids:
        service.unstage(pid)
    assert wait_until(lambda: service.pool.num_available == service.pool.num_segments, 10)


def test_a_stream_queued_past_its_deadline_tells_its_reader_what_it_waited_for(
    service: MapOutputService, clock: ManualClock
) -> None:
    path, segments = write_map(service, 3)
    held = service.pool.reserve(4, "slow streams")  # every buffer taken by others
    pid = service.stage(3, 0, SCHEMA, [(path, segments)])
    errors: list[BaseException] = []
    reader_gate = gate(service, pid)

    def read() -> None:
        try:
            reader_gate.read_all()
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    assert wait_until(lambda: connected(service, 1) and service.pool.queued == 1, 10)
    clock.jump(CONFIG.buffer_reserve_timeout_s)
    reader.join(30)
    assert not reader.is_alive()
    [error] = errors
    message = str(error)
    assert "the shuffle agent of executor 5 queued this stream for 30s and got no buffers" in message
    assert "spark.arrowbeat.shuffle.agentMemory" in message
    assert f"waited 30.0s in the queue for 2 network buffers of {BUFFER} bytes" in message
    assert service.metrics()["shuffle_streams_wait_timeouts"] == 1
    service.pool.release(held)
    assert wait_until(lambda: service.metrics()["shuffle_streams_open"] == 0, 10)  # reaped: it ended


def test_ttl_counts_reads_and_stages(service: MapOutputService, clock: ManualClock) -> None:
    """Files written long ago stay while they are read: the TTL runs from the last stage or
    stream end, not from the files' modification time."""
    path, segments = write_map(service, 4)
    clock.jump(service.ttl_s - 10)
    assert service.sweep() == 0
    pid = service.stage(4, 0, SCHEMA, [(path, segments)])
    with gate(service, pid) as g:
        assert g.read_all().num_rows == ROWS
    service.unstage(pid)
    clock.jump(20)  # the files are older than the TTL now; the read was 20 s ago
    assert service.sweep() == 0 and Path(path).exists()
    clock.jump(service.ttl_s - 20 + 1)
    assert service.sweep() > 0 and not Path(path).exists()


def test_ttl_counts_host_local_reads(service: MapOutputService, clock: ManualClock) -> None:
    """A reducer on the same host reads the file itself; ``note_read`` tells the agent's TTL."""
    path, _ = write_map(service, 5)
    clock.jump(service.ttl_s - 10)
    note_read(path, clock)
    clock.jump(20)
    assert service.sweep() == 0 and Path(path).exists()
    clock.jump(service.ttl_s)
    assert service.sweep() > 0 and not Path(path).exists()


def test_outputs_in_use_are_never_swept(service: MapOutputService, clock: ManualClock) -> None:
    """A stream being read keeps its shuffle however long it lasts; after its end the TTL runs."""
    path, segments = write_map(service, 6)
    pid = service.stage(6, 0, SCHEMA, [(path, segments)])
    with gate(service, pid) as g:
        batches = iter(g)
        got = next(batches).num_rows  # connected and reading, far from its end
        clock.jump(3 * service.ttl_s)
        assert service.sweep() == 0 and Path(path).exists()
        assert service.expire_stages() == 0 and service.metrics()["shuffle_streams_open"] == 1
        got += sum(b.num_rows for b in batches)
    assert got == ROWS
    service.unstage(pid)
    clock.jump(service.ttl_s - 1)
    assert service.sweep() == 0
    clock.jump(2)
    assert service.sweep() > 0 and not Path(path).exists()


def test_one_stream_holds_at_most_its_share_of_the_agents_pool(tmp_path: Path, clock: ManualClock) -> None:
    """A stream nobody reads yet fills up to a quarter of the pool and waits; the next stream
    gets its own quarter, not what is left after a greedy one."""
    config = CONFIG.replace(network_memory_bytes=32 * BUFFER)
    svc = MapOutputService(
        "app-c", "6", SECRET, str(tmp_path / "root"), jvm_pid=5152, config=config, clock=clock
    )
    try:
        assert svc.config.partition_pool_share == 0.25
        path, segments = write_map(svc, 7)
        for r, left in ((0, 24), (1, 16)):
            pid = svc.stage(7, r, SCHEMA, [(path, segments)])
            pool = svc.server._partitions[pid].pool  # the stream's share of the agent's pool
            assert pool.exhausted.wait(10)  # its writer waits: it holds all it may
            assert pool.in_use == pool.max_segments == 8 and svc.pool.num_available == left
    finally:
        svc.close()


def test_a_reader_that_dies_after_its_stream_was_queued_frees_the_stage_and_the_ttl_runs(
    tmp_path: Path, clock: ManualClock
) -> None:
    """The whole stream fits the stream's buffers, so the agent's writer is done before its reader
    took more than one buffer; the reader then dies without taking its end or unstaging. Nothing
    writes any more, so nothing would notice: the stage must be abandoned within the peer timeout
    (on the agent's clock), and then the shuffle's TTL runs and sweeps its files."""
    svc = MapOutputService(
        "app-d",
        "8",
        SECRET,
        str(tmp_path / "root"),
        jvm_pid=5153,
        config=CONFIG.replace(network_memory_bytes=32 * BUFFER),
        ttl_s=600.0,
        clock=clock,
    )
    try:
        path = str(Path(svc.dir) / "s9" / "m0.arrows")
        writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 30)
        for start in range(0, 600, 100):  # six small batches: a few buffers, within the stream's share
            ids = list(range(start, start + 100))
            writer.write(
                pa.record_batch([pa.array(ids, pa.int64()), pa.array(ids, pa.float64())], schema=SCHEMA)
            )
        pid = svc.stage(9, 0, SCHEMA, [(path, writer.finish()[0].segments)])
        partition = svc.server._partitions[pid]
        assert wait_until(lambda: partition.finished, 10)  # the whole stream is queued
        queued = partition.subpartitions[0].backlog
        assert queued >= 2
        one_credit = CONFIG.replace(exclusive_buffers_per_channel=1, floating_buffers_per_gate=0)
        reader = InputGate(
            [RemoteChannelSpec(svc.data_address, pid, 0)],
            SCHEMA,
            NetworkBufferPool(1, BUFFER),
            one_credit,
            SECRET,
        )
        reader.start()
        assert wait_until(lambda: connected(svc, 1) and svc.server.senders()[0].buffers_sent == 1, 10)
        reader.close()  # the reducer is gone: it took one buffer, never its end, never unstaged
        # The server drops what the reader did not take; no writer is left to see it.
        assert wait_until(lambda: partition.subpartitions[0].backlog == 0, 10)
        assert not partition.consumed and not partition.released
        assert svc.expire_stages() == 0  # the reader might still be taking its end: not yet
        clock.jump(CONFIG.peer_timeout_s)
        assert wait_until(lambda: svc.metrics()["shuffle_streams_open"] == 0, 10)  # the reaper thread
        assert svc.metrics()["shuffle_streams_abandoned"] == 1
        assert wait_until(lambda: svc.pool.num_available == svc.pool.num_segments, 10)
        clock.jump(svc.ttl_s + 1)
        assert svc.sweep() > 0 and not Path(path).exists()  # no longer "in use" forever
    finally:
        svc.close()
