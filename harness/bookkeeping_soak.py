"""Bookkeeping soak: many shuffles through the driver-side and agent-side services, without Spark.

What a streaming query with a shuffle per micro-batch leaves behind in its long-lived processes,
at a rate no real cluster reaches: every shuffle's bookkeeping runs through the real service
objects, on a ``ManualClock`` (the TTLs pass by jumps, not by waiting).

- The driver side (``rendezvous.Rendezvous``, one per application): a pipelined shuffle's map
  tasks register and its reducers locate them, through the handlers its control server calls;
  each map task unregisters as it ends, as ``pipelined._map`` does. One in ten loses a map task
  before it could (killed): half of those are released (``ShuffleHandle.release`` forgets the
  shuffle), half are left to the TTL sweep.
- The agent side (``agent_service.MapOutputService``, one per executor): a materialized shuffle
  is released (nine in ten) or forgotten and swept by the TTL (one in ten); one in two has a map
  output on this executor (a file in its folder; every one the TTL sweeps does). Every
  ``stream_every``-th is staged and read over the agent's ``PartitionServer`` (a real TCP
  stream), which is the costly part. Map outputs go to ``/dev/shm`` when there is one.

Memory is Python's heap as ``tracemalloc`` counts it, after a collection, after a warm-up (as
many streams as a data server keeps the senders of, plus one), then at 10 %, 50 % and 100 % of
the run; descriptors are ``/proc/self/fd``. ``RESULT`` lines: ``shuffles``,
``pipelined_failed`` (shuffles the rendezvous refused), ``bytes_per_1k_shuffles.first_half``
(10 % to 50 %: the bounded structures fill up) and ``.second_half`` (50 % to 100 %: flat when
nothing grows), ``fds_growth`` (second half), ``threads_growth`` and ``seconds``.

    .venv/bin/python -m benchmarks.bookkeeping_soak --shuffles 100000

It lives in ``harness/`` because ``tests/spark_plugin/shuffle/test_bounded_state.py`` runs a short
form; ``benchmarks/bookkeeping_soak.py`` is its command.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time
import tracemalloc
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from arrow_shuffle.buffer_pool import NetworkBufferPool
from arrow_shuffle.config import ShuffleConfig
from arrow_shuffle.errors import ControlRequestError
from arrow_shuffle.gate import InputGate, RemoteChannelSpec
from arrow_shuffle.partition_server import RECENT_STREAMS
from arrowbeat_base.clock import ManualClock
from spark_plugin.shuffle.agent.service import MapOutputService
from spark_plugin.shuffle.driver.rendezvous import Rendezvous
from spark_plugin.shuffle.map_output import MapOutputWriter

SECRET = "bookkeeping-soak-secret-0123456789"
SCHEMA = pa.schema([("k", pa.int64())])
BUFFER = 4096
CONFIG = ShuffleConfig(buffer_size=BUFFER, network_memory_bytes=16 * BUFFER)
TTL_S = 3600.0
MAPS, REDUCERS = 2, 2
"""Map and reduce tasks of each pipelined shuffle."""


@dataclass
class Soak:
    """A run's figures: memory, descriptors and threads at each checkpoint (after ``done``)."""

    shuffles: int = 0
    pipelined_failed: int = 0
    streams: int = 0
    marks: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(shuffles done, traced bytes, open descriptors, threads)."""
    seconds: float = 0.0

    def growth_per_1k(self, first: int, last: int) -> float:
        """Traced bytes per 1,000 shuffles between checkpoints ``first`` and ``last``."""
        (n0, b0, _, _), (n1, b1, _, _) = self.marks[first], self.marks[last]
        return (b1 - b0) * 1000.0 / max(1, n1 - n0)

    def fds_growth(self, first: int, last: int) -> int:
        return self.marks[last][2] - self.marks[first][2]

    def threads_growth(self, first: int, last: int) -> int:
        return self.marks[last][3] - self.marks[first][3]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _mark(soak: Soak, done: int) -> None:
    gc.collect()
    soak.marks.append((done, tracemalloc.get_traced_memory()[0], _fds(), threading.active_count()))


def _pipelined(driver: Rendezvous, shuffle: int, killed: bool) -> None:
    """One pipelined shuffle's rendezvous traffic, as its tasks make it."""
    tokens = [(shuffle * 7 + m) & 0x3FFFFFFF for m in range(MAPS)]
    for m in range(MAPS):
        driver._register(
            {"shuffle": shuffle, "map": m, "host": "10.0.0.1", "port": 40000 + m, "token": tokens[m]}
        )
    for _ in range(REDUCERS):
        found = driver.locate(shuffle, MAPS, 0.0)
        assert len(found) == MAPS, found
    unregister = getattr(driver, "_unregister", None)  # absent before issue 36: nothing was removed
    if unregister is None:
        return
    for m in range(MAPS - 1 if killed else MAPS):  # a killed map task never unregisters
        unregister({"shuffle": shuffle, "map": m, "token": tokens[m]})
    if killed and shuffle % 2:
        driver.forget(shuffle)  # released by its handle; the others wait for the TTL


def _write(service: MapOutputService, shuffle: int, rows: int) -> tuple[str, Any]:
    path = os.path.join(service.dir, f"s{shuffle}", "m0.arrows")  # no pathlib: it interns parts
    if not rows:  # the bookkeeping only: a folder and a file
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x" * 64)
        return path, None
    writer = MapOutputWriter(path, SCHEMA, ["k"], 1, 1 << 20)
    writer.write(pa.record_batch([pa.array(range(rows), pa.int64())], schema=SCHEMA))
    return path, writer.finish()[0].segments


def _stream(service: MapOutputService, shuffle: int, path: str, segments: Any) -> int:
    """Stage the output and read it over the agent's data server, as a remote reducer does."""
    pid = service.stage(shuffle, 0, SCHEMA, [(path, segments)])
    need = CONFIG.exclusive_buffers_per_channel + CONFIG.floating_buffers_per_gate
    gate = InputGate(
        [RemoteChannelSpec(service.data_address, pid, 0)],
        SCHEMA,
        NetworkBufferPool(need, BUFFER),
        CONFIG,
        SECRET,
    )
    with gate:
        rows = int(gate.read_all().num_rows)
    service.unstage(pid)
    return rows


def run_soak(shuffles: int, root: str, stream_every: int = 1000, sweep_every: int = 500) -> Soak:
    """``shuffles`` shuffles, every other one pipelined; returns the figures."""
    clock = ManualClock(start=1000.0, wall_start=time.time())
    soak = Soak()
    began = time.monotonic()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    driver = Rendezvous(SECRET, clock=clock, **_ttl(Rendezvous))
    service = MapOutputService(
        "app-soak", "1", SECRET, root, jvm_pid=0, config=CONFIG, ttl_s=TTL_S, clock=clock
    )
    checkpoints = {shuffles // 10, shuffles // 2, shuffles}
    try:
        for warm_up in range(RECENT_STREAMS + 1):  # what streams import, cache and keep (the recent)
            path, segments = _write(service, warm_up, 100)
            assert _stream(service, warm_up, path, segments) == 100
            service.release_shuffle(warm_up)
        _mark(soak, 0)
        for n in range(RECENT_STREAMS + 1, shuffles + 1):
            if n % 2:
                try:
                    _pipelined(driver, n, killed=n % 20 == 1)
                except ControlRequestError:
                    soak.pipelined_failed += 1
            else:
                # Streams half-way between checkpoints: their threads and sockets are gone by then.
                streamed = stream_every > 0 and n % (2 * stream_every) == stream_every
                if (
                    n % 4 == 0 or streamed
                ):  # a map output on disk (else a shuffle this executor wrote nothing of)
                    path, segments = _write(service, n, 100 if streamed else 0)
                if streamed:
                    assert _stream(service, n, path, segments) == 100
                    soak.streams += 1
                if n % 20 != 0:
                    service.release_shuffle(n)
            if n % sweep_every == 0:  # time passes: a TTL's worth every 4 sweeps
                clock.jump(TTL_S / 4)
                service.sweep()
            if n in checkpoints:
                _mark(soak, n)
        soak.shuffles = shuffles
    finally:
        service.close()
        driver.close()
        if not tracing:
            tracemalloc.stop()
    soak.seconds = time.monotonic() - began
    return soak


def fast_dir() -> str | None:
    """A memory-backed folder for the map outputs when there is one (``/dev/shm``): the run
    measures bookkeeping, and a disk's folder creation and removal took 1.5 ms a shuffle here."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _ttl(rendezvous: type) -> dict[str, Any]:
    """``ttl_s`` where the rendezvous takes one (before issue 36 it had none)."""
    import inspect

    return {"ttl_s": TTL_S} if "ttl_s" in inspect.signature(rendezvous).parameters else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shuffles", type=int, default=100_000)
    parser.add_argument(
        "--stream-every", type=int, default=1000, help="one shuffle in 2N is streamed (N even)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="arrowbeat-soak-", dir=fast_dir()) as root:
        soak = run_soak(args.shuffles, root, args.stream_every)
    print(f"RESULT shuffles={soak.shuffles}")
    print(f"RESULT pipelined_failed={soak.pipelined_failed}")
    print(f"RESULT streams={soak.streams}")
    print(f"RESULT bytes_per_1k_shuffles.first_half={soak.growth_per_1k(1, 2):.0f}")
    print(f"RESULT bytes_per_1k_shuffles.second_half={soak.growth_per_1k(2, 3):.0f}")
    print(f"RESULT fds_growth={soak.fds_growth(2, 3)}")
    print(f"RESULT threads_growth={soak.threads_growth(2, 3)}")
    print(f"RESULT seconds={soak.seconds:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
