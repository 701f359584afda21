"""Issue 36, item 4, the agent process's side of a moved RM, without a JVM: an agent that cannot
reach its RM asks its JVM (``rm-unreachable <address>``, at most once a second on a manual clock),
and the JVM's answer (``rm <host:port>``) reaches the agent; nothing else on the link does."""

from __future__ import annotations

import io

from arrowbeat_base.clock import ManualClock
from spark_plugin.errors import JvmCommandError
from spark_plugin.jvm.sidecar import JvmChannel, JvmLink
from spark_plugin.processes.executor import ASK_RM_EVERY_S, rm_unreachable_reporter


def test_only_a_well_formed_rm_line_reaches_the_agent() -> None:
    lines = b"p 1\nrm 10.0.0.7\nrm 10.0.0.7:1 2\nrm 10.0.0.7:4;x\nrm [::1]:40123\napp x\nrm 10.0.0.7:40123\n"
    link = JvmLink(io.BytesIO(lines))
    told: list[str] = []
    link.on_rm_address(told.append)
    link.start()
    assert link.gone.wait(10.0)
    assert told == ["[::1]:40123", "10.0.0.7:40123"]


def test_a_failed_handler_does_not_end_the_link() -> None:
    link = JvmLink(io.BytesIO(b"rm 10.0.0.7:1\np 3\n"))

    def broken(address: str) -> None:
        raise RuntimeError("the agent's loop is gone")

    link.on_rm_address(broken)
    link.start()
    assert link.gone.wait(10.0)
    assert link.running_tasks() == 3  # the pulse after it was still read


def test_the_jvm_is_asked_at_most_once_a_second_with_the_address_dialled() -> None:
    clock = ManualClock()
    asked: list[str] = []
    report = rm_unreachable_reporter(asked.append, clock)
    for _ in range(10):  # ten failed attempts within a second
        report("127.0.0.1:4000")
        clock.jump(ASK_RM_EVERY_S / 20)
    assert asked == ["127.0.0.1:4000"]
    clock.jump(ASK_RM_EVERY_S)
    report("127.0.0.1:4000")
    assert asked == ["127.0.0.1:4000"] * 2


def test_the_command_is_written_whole_and_a_bad_address_never() -> None:
    out = io.BytesIO()
    channel = JvmChannel(out)
    report = rm_unreachable_reporter(channel.rm_unreachable, ManualClock())
    report("127.0.0.1:4000")
    assert out.getvalue() == b"ARROWBEAT-CMD rm-unreachable 127.0.0.1:4000\n"
    try:
        channel.rm_unreachable("127.0.0.1:4000\nARROWBEAT-CMD kill-executor 1")
    except JvmCommandError:
        pass
    else:
        raise AssertionError("an address with a newline was written")
    assert out.getvalue() == b"ARROWBEAT-CMD rm-unreachable 127.0.0.1:4000\n"
