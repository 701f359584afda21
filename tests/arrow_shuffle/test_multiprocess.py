"""M producer x N consumer processes over the real transport, and a producer killed mid-stream."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from .mp_worker import rows_of

ROOT = Path(__file__).resolve().parents[2]
BUFFER = 64 * 1024


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


def _address(proc: subprocess.Popen[str]) -> list[object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return list(json.loads(line)["address"])


def test_2x2_exchange_union_equals_input(procs: Procs, tmp_path: Path) -> None:
    rows = 60_000
    producers = [procs.start("produce", str(m), "2", str(rows), str(BUFFER)) for m in range(2)]
    addresses = json.dumps([_address(p) for p in producers])
    outs = [tmp_path / f"r{r}.arrow" for r in range(2)]
    consumers = [procs.start("consume", str(r), str(BUFFER), addresses, str(outs[r])) for r in range(2)]
    for c in consumers:
        out, _ = c.communicate(timeout=60)
        assert "DONE" in out, out
    tables = [pa.ipc.open_file(str(o)).read_all() for o in outs]
    got = pa.concat_tables(tables).sort_by([("map", "ascending"), ("seq", "ascending")])
    expected = pa.concat_tables([pa.Table.from_batches([rows_of(m, 0, rows)]) for m in range(2)]).sort_by(
        [("map", "ascending"), ("seq", "ascending")]
    )
    assert got.equals(expected)
    # each reducer got a disjoint share, and a non-trivial one
    assert all(t.num_rows > rows // 4 for t in tables)


def test_killed_producer_gives_every_consumer_a_typed_error_quickly(procs: Procs, tmp_path: Path) -> None:
    producers = [procs.start("produce", str(m), "2", "0", str(BUFFER), "endless") for m in range(2)]
    addresses = json.dumps([_address(p) for p in producers])
    consumers = [
        procs.start("consume", str(r), str(BUFFER), addresses, str(tmp_path / f"r{r}.arrow"))
        for r in range(2)
    ]
    for c in consumers:
        assert c.stdout is not None
        assert c.stdout.readline().strip() == "DATA"
    killed_at = time.monotonic()
    os.kill(producers[0].pid, signal.SIGKILL)
    for r, c in enumerate(consumers):
        out, _ = c.communicate(timeout=10)
        elapsed = time.monotonic() - killed_at
        assert out.startswith("ERROR PeerLostError"), out
        assert "mp-app/s0/m0a0" in out  # names the lost partition
        assert elapsed < 5.0
        assert not (tmp_path / f"r{r}.arrow").exists()  # nothing reported complete


def test_killed_consumer_fails_the_producer_instead_of_hanging(procs: Procs, tmp_path: Path) -> None:
    producer = procs.start("produce", "0", "2", "0", str(BUFFER), "endless")
    addresses = json.dumps([_address(producer)])
    consumers = [
        procs.start("consume", str(r), str(BUFFER), addresses, str(tmp_path / f"r{r}.arrow"))
        for r in range(2)
    ]
    for c in consumers:
        assert c.stdout is not None
        assert c.stdout.readline().strip() == "DATA"
    killed_at = time.monotonic()
    os.kill(consumers[0].pid, signal.SIGKILL)
    assert producer.stdout is not None
    line = producer.stdout.readline()
    assert line.startswith("PRODUCER-ERROR ChannelClosedError"), line
    assert time.monotonic() - killed_at < 5.0


def test_hung_producer_is_detected_by_keepalive_timeout(procs: Procs, tmp_path: Path) -> None:
    """SIGSTOP keeps the sockets open: only the missing keepalives reveal the hang."""
    producer = procs.start("produce", "0", "1", "0", str(BUFFER), "endless")
    addresses = json.dumps([_address(producer)])
    consumer = procs.start("consume", "0", str(BUFFER), addresses, str(tmp_path / "r0.arrow"))
    assert consumer.stdout is not None
    assert consumer.stdout.readline().strip() == "DATA"
    stopped_at = time.monotonic()
    os.kill(producer.pid, signal.SIGSTOP)
    out, _ = consumer.communicate(timeout=10)
    assert out.startswith("ERROR PeerLostError"), out
    assert "no data for" in out
    assert time.monotonic() - stopped_at < 5.0  # peer_timeout_s=2 in the workers' config
