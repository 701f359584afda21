"""The streaming soak's figures (``spark_plugin.jobs.streaming_soak``), without Spark: what a
process's growth per 1,000 shuffles and its descriptor growth are, from which samples, and how the
samples stay bounded over a run of hours."""

from __future__ import annotations

from array import array

import pytest

from spark_plugin.jobs import streaming_soak
from spark_plugin.jobs.streaming_soak import Series, SoakResult, growth, median_slope, slope

MIB = 2**20


def _result(shuffles: int, *series: Series) -> SoakResult:
    return SoakResult(shuffles=shuffles, series={i: s for i, s in enumerate(series)})


def _line(kind: str, shuffles: range, rss_mib: float, mib_per_shuffle: float, fds: int = 10) -> Series:
    s = Series(kind, kind)
    for n in shuffles:
        s.add(n, int((rss_mib + mib_per_shuffle * n) * MIB), fds)
    return s


def test_slope_is_least_squares_and_refuses_too_few_points() -> None:
    assert slope([(0, 1.0), (1, 3.0), (2, 5.0), (3, 7.0)]) == pytest.approx(2.0)
    assert slope([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)]) == pytest.approx(0.2)  # noise: a small slope
    assert slope([(0, 1.0), (1, 2.0)]) is None
    assert slope([(5, 1.0), (5, 2.0), (5, 3.0)]) is None


def test_median_slope_is_theil_sen_and_refuses_too_few_points() -> None:
    assert median_slope([(0, 1.0), (1, 3.0), (2, 5.0), (3, 7.0)]) == pytest.approx(2.0)
    # one outlier moves a least-squares slope, not the median of the pairs' slopes
    assert median_slope([(0, 0.0), (1, 1.0), (2, 2.0), (3, 30.0), (4, 4.0)]) == pytest.approx(1.0)
    assert median_slope([(0, 1.0), (1, 2.0)]) is None
    assert median_slope([(5, 1.0), (5, 2.0), (5, 3.0)]) is None


def test_a_one_off_step_in_the_floor_is_not_read_as_a_slope_and_a_leak_still_is() -> None:
    """The long soak's driver JVM: flat, one 21 MiB step a fifth into the window (a pool of
    threads made once), flat again. The least-squares slope of its floor reads a leak."""

    def stepped(leak_mib_per_shuffle: float) -> Series:
        s = Series("driver JVM", "driver JVM")
        for n in range(0, 10_001, 20):
            step = 21.0 if n >= 6_000 else 0.0
            s.add(n, int((1_536 + step + leak_mib_per_shuffle * n) * MIB), 400)
        return s

    (flat,) = growth(_result(10_000, stepped(0.0)))
    assert flat.rss_floor_ls_mib_per_1k is not None and flat.rss_floor_ls_mib_per_1k > 3.0
    assert flat.rss_mib_per_1k == pytest.approx(0.0, abs=0.01)
    (leaking,) = growth(_result(10_000, stepped(0.003)))
    assert leaking.rss_mib_per_1k == pytest.approx(3.0, abs=0.01)


def test_growth_is_measured_after_the_warm_up_only() -> None:
    # 100 MiB of warm-up growth over the first 500 shuffles, then 3 MiB per 1,000.
    s = Series("python driver", "python driver")
    for n in range(0, 1001, 10):
        s.add(n, int((200 + (100 * n / 500 if n < 500 else 100 + 0.003 * (n - 500))) * MIB), 25)
    (g,) = growth(_result(1000, s))
    assert g.rss_mib_per_1k == pytest.approx(3.0)
    assert g.rss_start_mib == pytest.approx(300.0) and g.fds_growth == 0
    (early,) = growth(_result(1000, s), warm_up=0.0)
    assert early.rss_mib_per_1k is not None and early.rss_mib_per_1k > 100  # the warm-up would dominate


def test_descriptor_growth_is_from_medians_so_one_sample_mid_close_does_not_decide_it() -> None:
    s = _line("agent", range(500, 1001, 10), 140.0, 0.0, fds=17)
    s.fds[1] = s.fds[-1] = 30  # samples taken while a stream's sockets were still closing
    (g,) = growth(_result(1000, s))
    assert g.fds_growth == 0 and g.fds_end == 30
    leaking = _line("agent", range(500, 1001, 10), 140.0, 0.0)
    for i in range(len(leaking.fds)):
        leaking.fds[i] = 17 + i // 5  # one descriptor every 50 shuffles
    (g,) = growth(_result(1000, leaking))
    assert g.fds_growth == 9


def test_a_process_that_did_not_live_through_the_window_gets_no_figure() -> None:
    replaced = _line("Python worker", range(500, 700, 10), 150.0, 1.0)
    whole = _line("Python worker", range(0, 1001, 10), 150.0, 0.0)
    by_label = {g.label: g for g in growth(_result(1000, replaced))}
    assert by_label["Python worker"].rss_mib_per_1k is None and by_label["Python worker"].fds_growth is None
    (g,) = growth(_result(1000, whole))
    assert g.rss_mib_per_1k == pytest.approx(0.0)


def test_thinning_halves_the_samples_and_keeps_the_first_and_the_last() -> None:
    s = _line("driver JVM", range(11), 500.0, 1.0)
    s.thin()
    assert list(s.shuffles) == [0, 2, 4, 6, 8, 10]
    s = _line("driver JVM", range(10), 500.0, 1.0)
    s.thin()
    assert list(s.shuffles) == [0, 2, 4, 6, 8, 9]
    assert len(s.rss) == len(s.fds) == len(s.shuffles)


def test_timings_are_median_and_p95_per_mode() -> None:
    r = SoakResult(times={"pipelined": {name: array("d") for name in streaming_soak.TIMINGS}})
    r.times["pipelined"]["run_s"].extend(float(i) for i in range(1, 101))
    assert streaming_soak.timings(r) == {"pipelined": {"run_s": (50.5, 96.0)}}
