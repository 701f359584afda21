"""The driver plugin's supervision of its driver-side process, and the executor plugin's of its
agent (``Supervision.java``), on a fake clock: when the process is hung, when a restart may start
(a sliding window, never a cap per application) and how a failed restart backs off. A small Java
main (``java/SupervisionCheck.java``) drives the class with fake millisecond readings; no Spark
application, no waiting. Needs a JDK and the launcher jar: marked ``spark``, out of ``make unit``
(as ``test_protocol_contract``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).parents[2]
LAUNCHER_JAR = Path(
    os.environ.get("ARROWBEAT_LAUNCHER_JAR", ROOT / ".cache" / "launcher" / "arrowbeat-launcher.jar")
)
Run = Callable[..., list[str]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Runs requests (one line each) through one fresh ``SupervisionCheck``; its answers."""
    if shutil.which("javac") is None or not LAUNCHER_JAR.exists():
        pytest.skip("needs javac and the launcher jar (make .cache/launcher/arrowbeat-launcher.jar)")
    import pyspark

    classpath = ":".join([str(LAUNCHER_JAR), str(Path(pyspark.__file__).parent / "jars" / "*")])
    classes = tmp_path_factory.mktemp("supervision-check")
    source = Path(__file__).parent / "java" / "SupervisionCheck.java"
    subprocess.run(
        ["javac", "--release", "17", "-cp", classpath, "-d", str(classes), str(source)], check=True
    )

    def check(*requests: str) -> list[str]:
        done = subprocess.run(
            ["java", "-Xmx32m", "-cp", f"{classes}:{classpath}", "arrowbeat.SupervisionCheck"],
            input="\n".join(requests) + "\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        answers = done.stdout.splitlines()
        assert len(answers) == len(requests), done.stderr
        return answers

    return check


def test_a_pulse_unanswered_past_the_bound_is_a_hang_and_an_answer_ends_the_wait(run: Run) -> None:
    checks = [f"hung {t} 500" for t in range(500, 6001, 500)]
    answers = run("policy 5000 10 600000 30000", "pulse 0", "pulse 500", *checks, "answer", "hung 6500 500")
    judged = dict(zip(range(500, 6001, 500), answers[3:-2], strict=True))
    assert [t for t, hung in judged.items() if hung == "true"] == [5500, 6000], judged  # > 5000 ms after 0
    assert answers[-1] == "false"  # answered: nothing waits
    # Answers keep coming: never hung, however long it runs.
    beats = [x for t in range(0, 60_000, 500) for x in (f"pulse {t}", "answer", f"hung {t + 250} 500")]
    assert "true" not in run("policy 5000 10 600000 30000", *beats)


def test_a_late_check_means_this_jvm_was_paused_and_convicts_nobody(run: Run) -> None:
    """A pulse written just before this JVM froze for 30 s is unanswered when it thaws; the late
    check judges nothing and waits the full bound again (the answer then comes, or not)."""
    after = range(31_000, 36_001, 500)
    answers = run(
        "policy 5000 10 600000 30000",
        "pulse 0",
        "hung 500 500",
        "hung 30500 500",  # 30 s later: our own pause
        *(f"hung {t} 500" for t in after),
    )
    judged = dict(zip(after, answers[4:], strict=True))
    assert answers[2:4] == ["false", "false"]
    assert [t for t, hung in judged.items() if hung == "true"] == [36_000], judged  # 5000 ms after 30500


def test_an_executor_jvm_frozen_past_its_agents_bound_kills_no_agent_when_it_thaws(run: Run) -> None:
    """The executor plugin's policy (the agent's 5 s bound, its own restart limits). The JVM froze
    for 10 s after writing a pulse whose answer the agent wrote at once, but the frozen JVM never
    read: at the thaw the wait looks 10 s old. The first check is late and judges nothing; the
    answer read after the thaw ends the wait, and pulses answered as before never convict."""
    thawed = [x for t in range(10_600, 30_000, 500) for x in (f"pulse {t}", f"hung {t + 100} 500", "answer")]
    answers = run(
        "policy 5000 5 300000 30000",
        "pulse 0",
        "answer",
        "pulse 500",
        "hung 550 500",  # the last check before the freeze
        "hung 10550 500",  # the first after it: 10 s late
        *thawed,
    )
    assert answers[4:6] == ["false", "false"]
    assert "true" not in answers, answers
    # The agent itself stopped at the thaw (or earlier, with its JVM): convicted a bound after it.
    stuck = run(
        "policy 5000 5 300000 30000",
        "pulse 500",
        "hung 550 500",
        "hung 10550 500",
        *(f"hung {t} 500" for t in range(11_050, 16_100, 500)),
    )
    # 16050 is the first check more than 5000 ms after the late one at 10550.
    assert stuck[-2:] == ["false", "true"] and "true" not in stuck[:-1], stuck


def test_without_an_announced_bound_nothing_is_ever_hung(run: Run) -> None:
    """An older driver-side process answers no pulse; its ready line announces no ``hang_ms``."""
    policy, *answers = run(
        "from-ready pulse_ms=500", "pulse 0", *(f"hung {t} 500" for t in range(500, 20_000, 500))
    )
    assert policy.startswith("Policy[hangMs=0,") and set(answers) == {"ok", "false"}
    assert run("from-ready hang_ms=4000 restart_max=3 restart_window_ms=x restart_backoff_ms=-1") == [
        "Policy[hangMs=4000, maxRestarts=3, windowMs=600000, backoffMaxMs=30000]"
    ]


def test_restarts_are_limited_by_a_sliding_window_never_for_good(run: Run) -> None:
    answers = run(
        "policy 5000 3 10000 30000",
        "next 0",
        "attempt 0",
        "succeeded",
        "next 100",
        "attempt 100",
        "succeeded",
        "next 200",
        "attempt 200",
        "succeeded",
        "next 300",  # three in the window: the fourth waits until the first leaves it
        "next 9999",
        "next 10000",
        "attempt 10000",
        "succeeded",
        "next 10050",  # now 100, 200 and 10000 are in the window: wait for 100's to leave
        "next 500000",
        "attempt 500000",
        "succeeded",  # much later: free again, and again, ...
        "next 500001",
    )
    nexts = [a for r, a in zip(answers[1:], answers[1:], strict=True) if a != "ok"]
    assert nexts == ["0", "100", "200", "10000", "10000", "10000", "10100", "500000", "500001"]


def test_six_deaths_in_a_row_restart_at_once_under_the_default_policy(run: Run) -> None:
    requests = ["policy 10000 10 600000 30000"]
    for k in range(6):
        requests += [f"next {k * 3000}", f"attempt {k * 3000}", "succeeded"]
    answers = run(*requests)
    assert [a for a in answers if a != "ok"] == [str(k * 3000) for k in range(6)]


def test_a_failed_restart_is_retried_after_a_capped_doubling_backoff(run: Run) -> None:
    answers = run(
        "policy 5000 100 600000 3000",
        "attempt 0",
        "failed 0",
        "next 0",
        "attempt 1000",
        "failed 1000",
        "next 1000",
        "attempt 3000",
        "failed 3000",
        "next 3000",
        "attempt 6000",
        "failed 6000",
        "next 6000",  # capped at 3000
        "attempt 9000",
        "succeeded",
        "next 9000",  # a success forgets the failures
        "backoff 1",
        "backoff 2",
        "backoff 40",
    )
    assert [a for a in answers if a != "ok"] == [
        "1000",
        "3000",
        "6000",
        "9000",
        "9000",
        "1000",
        "2000",
        "3000",
    ]


def test_a_failed_first_start_is_retried_unless_it_cannot_succeed(run: Run) -> None:
    """Issue 36, item 4: a first start that missed the start-up timeout (a loaded node), crashed or
    ended any other way is retried, as restarts are; only a missing interpreter and a process that
    refused its settings (``protocol.NOT_STARTED``: the same settings fail again) are final.
    Before, every failed first start left the application or the executor unmonitored for life."""
    from spark_plugin.jvm.protocol import NOT_STARTED
    from spark_plugin.processes.executor import AGENT_ENDED

    answers = run(
        "retries-start timeout",
        "retries-start exit 1",
        f"retries-start exit {AGENT_ENDED}",
        "retries-start exit 137",
        f"retries-start exit {NOT_STARTED}",
        "retries-start missing",
    )
    assert answers == ["true", "true", "true", "true", "false", "false"]
