"""The streaming soak's figures as a long run reports them, without Spark: the ``RESULT``-named
figures (``figures``), the ``INTERIM`` line a run of hours logs as it goes (so a run stopped early
still tells its growth), and the Python driver's allocation trace (``--tracemalloc-from``)."""

from __future__ import annotations

import tracemalloc

import pytest

from spark_plugin.jobs import streaming_soak
from spark_plugin.jobs.streaming_soak import Series, SoakResult

MIB = 2**20


def _line(kind: str, shuffles: range, rss_mib: float, mib_per_shuffle: float, fds: int = 10) -> Series:
    s = Series(kind, kind)
    for n in shuffles:
        s.add(n, int((rss_mib + mib_per_shuffle * n) * MIB), fds)
    return s


def _result(shuffles: int, *series: Series) -> SoakResult:
    return SoakResult(shuffles=shuffles, series={i: s for i, s in enumerate(series)})


def test_figures_name_the_worst_process_of_each_kind_and_the_worst_descriptor_growth() -> None:
    r = _result(
        1000,
        _line("agent", range(0, 1001, 10), 140.0, 0.001),
        _line("agent", range(0, 1001, 10), 140.0, 0.004),
        _line("driver JVM", range(0, 1001, 10), 500.0, 0.02),
        _line("python driver", range(0, 1001, 10), 300.0, 0.0),
    )
    f = streaming_soak.figures(r)
    assert f["rss_mib_per_1k_shuffles_max"] == "20.00" and f["rss_worst_kind"] == "driver JVM"
    assert f["rss_mib_per_1k_shuffles_max_python"] == "4.00"  # the JVM is not a Python process
    assert f["rss_mib_per_1k_shuffles.agent"] == "4.00"
    assert f["rss_mib_per_1k_shuffles.python_driver"] == "0.00"
    assert f["fds_growth_max"] == "0" and f["fds_worst_kind"] == "none"


def test_an_interim_line_carries_the_figures_so_far() -> None:
    r = _result(400, _line("driver-side arrowbeat", range(0, 401, 10), 200.0, 0.002))
    r.by_mode = {"materialized": 200, "pipelined": 200}
    line = streaming_soak.interim_line(r, 600.0)
    pairs = dict(p.split("=", 1) for p in line.split()[1:])
    assert line.startswith("INTERIM ")
    assert pairs["minutes"] == "10.0" and pairs["shuffles"] == "400" and pairs["pipelined_shuffles"] == "200"
    assert pairs["wrong_batches"] == "0" and pairs["failed_batches"] == "0"
    assert pairs["rss_mib_per_1k_shuffles.driver_side_arrowbeat"] == "2.00"


def _kept_per_shuffle(into: list[bytes]) -> None:
    into.append(bytes(64 * 1024))


def test_tracing_lists_what_was_allocated_since_it_started_and_is_still_alive() -> None:
    if tracemalloc.is_tracing():
        pytest.skip("this process is traced already")
    r = SoakResult(shuffles=100)
    kept: list[bytes] = []
    streaming_soak.start_tracing(r, frames=4)
    for r.shuffles in range(101, 121):
        _kept_per_shuffle(kept)
    streaming_soak.finish_tracing(r)
    assert not tracemalloc.is_tracing()
    assert (r.traced_from, r.traced_to) == (100, 120)
    assert r.traced_bytes >= 20 * 64 * 1024
    assert "bytes(64 * 1024)" in r.traced[0]  # the allocating line, the largest site
    streaming_soak.finish_tracing(r)  # a second end (the query's thread and the caller): nothing more
    assert (r.traced_from, r.traced_to) == (100, 120)


def _worker(mib_per_shuffle: float) -> Series:
    """A reused Python worker sampled after each batch: 141 MiB (plus any leak), or 35 MiB more
    when its last task's memory was not given back yet, as happened late in a measured run."""
    s = Series("Python worker", "worker")
    for n in range(500, 1001, 10):
        held = 35 if n > 800 and n % 20 == 0 else 0
        s.add(n, int((141 + held + mib_per_shuffle * n) * MIB), 7)
    return s


def test_memory_a_task_still_holds_is_not_growth_but_a_rising_floor_is() -> None:
    (g,) = streaming_soak.growth(_result(1000, _worker(0.0)))
    assert g.rss_mib_per_1k == pytest.approx(0.0)
    assert g.rss_all_mib_per_1k is not None and g.rss_all_mib_per_1k > 30  # every sample: "a leak"
    (leaking,) = streaming_soak.growth(_result(1000, _worker(0.003)))
    assert leaking.rss_mib_per_1k == pytest.approx(3.0)


def test_the_floor_is_the_lowest_point_of_each_span() -> None:
    points = [(0.0, 5.0), (1.0, 3.0), (2.0, 9.0), (3.0, 4.0), (4.0, 8.0)]
    assert streaming_soak.floor(points, bins=2) == [(1.0, 3.0), (3.0, 4.0)]
    assert streaming_soak.floor([], bins=2) == []
    assert streaming_soak.floor([(7.0, 1.0)], bins=2) == [(7.0, 1.0)]
