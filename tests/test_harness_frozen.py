"""How the shared frozen-executor run drives its probes (``tests.harness.frozen``), without Spark:
each probe resumes at the phase it asked for, due probes run at once, a failing probe is kept
apart from the others, and a probe left waiting is closed (its ``finally`` runs) and failed."""

from __future__ import annotations

import threading
from collections.abc import Generator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.harness.frozen import THAW_PHASES, FrozenRun, Phase, Probe, _Driver, probes_of


def a_run(tmp_path: Path) -> FrozenRun:
    return FrozenRun(app=cast(Any, None), folder=tmp_path, tables=tmp_path, go=tmp_path / "go")


class Recorder(Probe):
    def __init__(self, *wanted: Phase) -> None:
        super().__init__()
        self.wanted = wanted
        self.seen: list[Phase] = []
        self.threads: set[str] = set()
        self.closed = False

    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        self.seen.append(Phase.READY)
        try:
            for phase in self.wanted:
                yield phase
                self.seen.append(phase)
                self.threads.add(threading.current_thread().name)
        finally:
            self.closed = True


class Failing(Probe):
    def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
        yield Phase.THAWED
        raise AssertionError("the page never turned green")


def test_each_probe_resumes_at_the_phases_it_asked_for(tmp_path: Path) -> None:
    early, late = Recorder(Phase.FROZEN, Phase.ENDED), Recorder(Phase.THAWED)
    driver = _Driver(a_run(tmp_path), [early, late], THAW_PHASES)
    for phase in THAW_PHASES:
        driver.phase(phase)
    driver.close()
    assert early.seen == [Phase.READY, Phase.FROZEN, Phase.ENDED] and early.finished
    assert late.seen == [Phase.READY, Phase.THAWED] and late.finished
    early.verdict()
    late.verdict()


def test_due_probes_run_at_once_alongside_the_runs_own_step(tmp_path: Path) -> None:
    """Both probes and the run's step see each other running: none waits for another."""
    barrier = threading.Barrier(3, timeout=10)

    class Meets(Probe):
        def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
            yield Phase.FROZEN
            barrier.wait()

    first, second = Meets(), Meets()
    driver = _Driver(a_run(tmp_path), [first, second], THAW_PHASES)
    driver.phase(Phase.READY)
    driver.phase(Phase.FROZEN, alongside=barrier.wait)
    first.verdict()
    second.verdict()


def test_a_failing_probe_is_kept_apart(tmp_path: Path) -> None:
    failing, other = Failing(), Recorder(Phase.THAWED, Phase.ENDED)
    driver = _Driver(a_run(tmp_path), [failing, other], THAW_PHASES)
    for phase in THAW_PHASES:
        driver.phase(phase)
    driver.close()
    assert failing.failed_at is Phase.THAWED
    with pytest.raises(AssertionError, match="never turned green"):
        failing.verdict()
    other.verdict()


def test_a_probe_left_waiting_is_closed_and_failed(tmp_path: Path) -> None:
    """The run skipped KILLED (no probe ``kills``): the probe that waited for it fails, and its
    ``finally`` (which stops what it started) has run."""
    waiting = Recorder(Phase.KILLED)
    driver = _Driver(a_run(tmp_path), [waiting], THAW_PHASES)
    for phase in (Phase.READY, Phase.FROZEN, Phase.THAWED, Phase.ENDED):
        driver.phase(phase)
    driver.close()
    assert waiting.closed
    with pytest.raises(AssertionError, match="never reached"):
        waiting.verdict()


def test_a_probe_may_only_ask_for_a_later_phase_of_its_run(tmp_path: Path) -> None:
    backwards, foreign = Recorder(Phase.READY), Recorder(Phase.REMOVED)
    driver = _Driver(a_run(tmp_path), [backwards, foreign], THAW_PHASES)
    driver.phase(Phase.READY)
    driver.close()
    for probe in (backwards, foreign):
        with pytest.raises(AssertionError, match="not a later phase"):
            probe.verdict()


def test_probes_are_found_by_scenario_once_each() -> None:
    class KillSide(Failing):
        scenario = "kill"

    thaw, kill = Recorder(), KillSide()
    module = type("Module", (), {"FROZEN_PROBES": (thaw, kill)})
    assert probes_of([module, module], "thaw") == [thaw]
    assert probes_of([module], "kill") == [kill]
    assert probes_of([object()], "thaw") == []


def test_a_step_runs_while_the_run_waits(tmp_path: Path) -> None:
    """``alongside`` (the run's own wait) overlaps the probes' steps rather than preceding them."""
    stepped = threading.Event()

    class Stamps(Probe):
        def watch(self, run: FrozenRun) -> Generator[Phase, None, None]:
            yield Phase.FROZEN
            stepped.set()

    probe = Stamps()
    driver = _Driver(a_run(tmp_path), [probe], THAW_PHASES)
    driver.phase(Phase.READY)
    # The run's own step waits for the probe's: it sees it only if the two overlap (were the
    # probe's step run after ``alongside``, the wait would end at its deadline, unseen).
    seen: list[bool] = []
    driver.phase(Phase.FROZEN, alongside=lambda: seen.append(stepped.wait(30)))
    assert seen == [True]


def test_start_runs_before_ready_and_stop_always_runs(tmp_path: Path) -> None:
    """``start`` (slow set-up) overlaps the application's start; ``stop`` runs even for a probe
    whose ``start`` failed, which then never watches."""

    class SetUp(Recorder):
        def start(self) -> None:
            self.began = True

        def stop(self) -> None:
            self.stopped = True

    class BrokenSetUp(SetUp):
        def start(self) -> None:
            raise RuntimeError("no session")

    good, broken = SetUp(Phase.ENDED), BrokenSetUp(Phase.ENDED)
    driver = _Driver(a_run(tmp_path), [good, broken], THAW_PHASES)
    for phase in THAW_PHASES:
        driver.phase(phase)
    driver.close()
    assert good.began and good.stopped and good.seen == [Phase.READY, Phase.ENDED]
    good.verdict()
    assert broken.stopped and broken.seen == []
    with pytest.raises(RuntimeError, match="no session"):
        broken.verdict()
