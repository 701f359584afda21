"""Under ``heartbeat.detector=phi`` a silence reported early is acted on by the driver only once it
has lasted the full ``heartbeat.timeout`` and the executor has not registered again (review of
issue 37 item 2: an agent that stalled 0.4 s, its JVM healthy, had the executor killed)."""

from __future__ import annotations

from heartbeat import EventKind, ExecutorEvent
from heartbeat.scheduler import ManualScheduler
from spark_plugin.processes.driver import EventRouter

TIMEOUT_S = 2.0


def _event(kind: EventKind, executor_id: str) -> ExecutorEvent:
    return ExecutorEvent(kind, executor_id, "h", "inst", 1_700_000_000.0, "")


def _router() -> tuple[EventRouter, ManualScheduler, list[str]]:
    killed: list[str] = []
    scheduler = ManualScheduler()
    router = EventRouter(
        lambda: "app-1", None, kill=killed.append, kill_after_s=TIMEOUT_S, scheduler=scheduler
    )
    return router, scheduler, killed


def test_an_early_timeout_is_acted_on_once_the_full_timeout_passed() -> None:
    router, scheduler, killed = _router()
    router(_event(EventKind.HEARTBEAT_TIMEOUT, "3"))
    router(_event(EventKind.HEARTBEAT_TIMEOUT, "3"))  # told twice: one kill
    scheduler.advance(TIMEOUT_S - 0.01)
    assert killed == []
    scheduler.advance(0.02)
    assert killed == ["3"]
    scheduler.advance(10 * TIMEOUT_S)
    assert killed == ["3"]


def test_an_executor_that_registers_again_meanwhile_is_not_killed() -> None:
    router, scheduler, killed = _router()
    router(_event(EventKind.HEARTBEAT_TIMEOUT, "4"))
    router(_event(EventKind.UNREACHABLE, "5"))
    scheduler.advance(TIMEOUT_S / 2)
    router(_event(EventKind.REREGISTERED, "4"))  # its agent answers again: the JVM was fine
    scheduler.advance(TIMEOUT_S)
    assert killed == ["5"]


def test_a_kill_still_deferred_when_the_router_closes_is_dropped() -> None:
    """The application is ending: a kill asked for after the driver-side process stopped would
    reach a JVM that no longer listens (or a later application's executor of the same id)."""
    router, scheduler, killed = _router()
    router(_event(EventKind.HEARTBEAT_TIMEOUT, "7"))
    router.close()
    scheduler.advance(10 * TIMEOUT_S)
    assert killed == []


def test_without_a_delay_the_kill_is_immediate_as_before() -> None:
    killed: list[str] = []
    router = EventRouter(lambda: "app-1", None, kill=killed.append)
    router(_event(EventKind.HEARTBEAT_TIMEOUT, "6"))
    assert killed == ["6"]


class _Link:
    def __init__(self, age_s: float) -> None:
        self.age_s = age_s

    def pulse_age_s(self) -> float:
        return self.age_s


def test_phi_without_a_view_of_the_jvm_reads_a_pause_as_a_freeze_only_after_the_timeout() -> None:
    """Review of issue 37 item 2: with no JVM pid, phi mode fell back to 'a pulse within one
    interval', so any GC pause longer than 0.1 s silenced the agent and had a healthy executor
    suspected within half a second."""
    from spark_plugin.processes.executor import jvm_alive
    from spark_plugin.settings.config import from_spark_conf

    config = from_spark_conf(
        [
            ("spark.arrowbeat.authenticate.secret", "s" * 32),
            ("spark.arrowbeat.heartbeat.detector", "phi"),
            ("spark.arrowbeat.heartbeat.interval", "100ms"),
            ("spark.arrowbeat.heartbeat.timeout", "2s"),
        ]
    )
    link = _Link(1.0)  # a 1 s GC pause
    healthy = jvm_alive(config, {}, link)  # type: ignore[arg-type]
    assert healthy()
    link.age_s = 2.5  # past the timeout: a freeze
    assert not healthy()
