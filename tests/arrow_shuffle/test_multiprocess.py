"""M producer x N consumer processes over the real transport, and producers or consumers that die
or hang mid-stream.

These run on wall time with real processes, so they assert what happens and in which order,
each within a generous deadline; how fast a loss is detected is measured by the benchmarks
(and driven on a ``ManualClock`` in ``test_clock``), not asserted here.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from .mp_worker import rows_of

ROOT = Path(__file__).resolve().parents[2]
BUFFER = 64 * 1024
DEADLINE_S = 60.0
"""Bound on any one step (a line, a process exit): a hang fails the test, slowness does not."""


class Procs:
    """Every process a test starts; all are ended by pid in teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.arrow_shuffle.mp_worker", *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    def end_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.end_all()


def _line(proc: subprocess.Popen[str], timeout_s: float = DEADLINE_S) -> str:
    """The process's next stdout line, or a failure after ``timeout_s`` (not a hung test)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        pytest.fail(f"pid {proc.pid} printed no line within {timeout_s:.0f}s")


def _address(proc: subprocess.Popen[str]) -> list[object]:
    return list(json.loads(_line(proc))["address"])


def test_2x2_exchange_union_equals_input(procs: Procs, tmp_path: Path) -> None:
    rows = 60_000
    producers = [procs.start("produce", str(m), "2", str(rows), str(BUFFER)) for m in range(2)]
    addresses = json.dumps([_address(p) for p in producers])
    outs = [tmp_path / f"r{r}.arrow" for r in range(2)]
    consumers = [procs.start("consume", str(r), str(BUFFER), addresses, str(outs[r])) for r in range(2)]
    for c in consumers:
        out, _ = c.communicate(timeout=DEADLINE_S)
        assert "DONE" in out, out
    tables = [pa.ipc.open_file(str(o)).read_all() for o in outs]
    got = pa.concat_tables(tables).sort_by([("map", "ascending"), ("seq", "ascending")])
    expected = pa.concat_tables([pa.Table.from_batches([rows_of(m, 0, rows)]) for m in range(2)]).sort_by(
        [("map", "ascending"), ("seq", "ascending")]
    )
    assert got.equals(expected)
    # each reducer got a disjoint share, and a non-trivial one
    assert all(t.num_rows > rows // 4 for t in tables)


def test_killed_producer_gives_every_consumer_a_typed_error(procs: Procs, tmp_path: Path) -> None:
    producers = [procs.start("produce", str(m), "2", "0", str(BUFFER), "endless") for m in range(2)]
    addresses = json.dumps([_address(p) for p in producers])
    consumers = [
        procs.start("consume", str(r), str(BUFFER), addresses, str(tmp_path / f"r{r}.arrow"))
        for r in range(2)
    ]
    for c in consumers:
        assert _line(c).strip() == "DATA"
    assert all(c.poll() is None for c in consumers)  # reading, endlessly, until the kill
    os.kill(producers[0].pid, signal.SIGKILL)
    for r, c in enumerate(consumers):
        out, _ = c.communicate(timeout=DEADLINE_S)  # the endless read ends: the loss was detected
        assert out.startswith("ERROR PeerLostError"), out
        assert "mp-app/s0/m0a0" in out  # names the lost partition
        assert not (tmp_path / f"r{r}.arrow").exists()  # nothing reported complete


def test_killed_consumer_fails_the_producer_instead_of_hanging(procs: Procs, tmp_path: Path) -> None:
    producer = procs.start("produce", "0", "2", "0", str(BUFFER), "endless")
    addresses = json.dumps([_address(producer)])
    consumers = [
        procs.start("consume", str(r), str(BUFFER), addresses, str(tmp_path / f"r{r}.arrow"))
        for r in range(2)
    ]
    for c in consumers:
        assert _line(c).strip() == "DATA"
    assert producer.poll() is None  # writing endlessly, blocked on its readers, until the kill
    os.kill(consumers[0].pid, signal.SIGKILL)
    line = _line(producer)  # the endless write ends: the consumer's loss failed it
    assert line.startswith("PRODUCER-ERROR ChannelClosedError"), line


def test_hung_producer_is_detected_by_keepalive_timeout(procs: Procs, tmp_path: Path) -> None:
    """SIGSTOP keeps the sockets open: only the missing keepalives reveal the hang (the real-time
    end-to-end check of what ``test_clock`` drives on a fake clock)."""
    producer = procs.start("produce", "0", "1", "0", str(BUFFER), "endless")
    addresses = json.dumps([_address(producer)])
    consumer = procs.start("consume", "0", str(BUFFER), addresses, str(tmp_path / "r0.arrow"))
    assert _line(consumer).strip() == "DATA"
    assert consumer.poll() is None
    os.kill(producer.pid, signal.SIGSTOP)
    out, _ = consumer.communicate(timeout=DEADLINE_S)
    assert out.startswith("ERROR PeerLostError"), out
    assert "no data for 2.0s" in out  # silence past peer_timeout_s (2 s in the workers' config), not EOF
    assert "mp-app/s0/m0a0" in out
    assert producer.poll() is None  # the producer is alive (stopped): the consumer gave up on silence
    assert not (tmp_path / "r0.arrow").exists()
