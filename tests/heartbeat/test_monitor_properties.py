"""Property: whatever the interleaving, a monitor notifies at most once and never leaves a final state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from heartbeat import HeartbeatMonitor, ManualScheduler, MonitorState

from .fakes import RecordingListener, RecordingTarget

TIMEOUT = 1.0
THRESHOLD = 3

operations = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.floats(min_value=0.0, max_value=1.5)),
        st.tuples(st.sampled_from(["heartbeat", "failure", "success", "cancel"]), st.just(0.0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_monitor_notifies_at_most_once_and_states_are_one_way(ops: list[tuple[str, float]]) -> None:
    scheduler = ManualScheduler()
    listener = RecordingListener()
    monitor: HeartbeatMonitor[object] = HeartbeatMonitor(
        "t", RecordingTarget(), listener, scheduler.clock, scheduler, TIMEOUT, THRESHOLD
    )
    last_heartbeat = 0.0
    failures = 0
    seen = [MonitorState.RUNNING]
    for op, value in ops:
        was_running = monitor.is_running()
        if op == "advance":
            scheduler.advance(value)
        elif op == "heartbeat":
            monitor.report_heartbeat()
            if was_running:
                last_heartbeat, failures = scheduler.clock.monotonic(), 0
        elif op == "failure":
            monitor.report_rpc_failure()
            failures += 1 if was_running else 0
        elif op == "success":
            monitor.report_rpc_success()
            failures = 0
        else:
            monitor.cancel()
        state = monitor.state
        if seen[-1] is not MonitorState.RUNNING:
            assert state is seen[-1], "a final state never changes"
        seen.append(state)
        if state is MonitorState.RUNNING:
            assert scheduler.clock.monotonic() < last_heartbeat + TIMEOUT, "running past the deadline"
            assert failures < THRESHOLD
    assert len(listener.timeouts) + len(listener.unreachable) <= 1
    assert (monitor.state is MonitorState.TIMEOUT) == (listener.timeouts == ["t"])
    assert (monitor.state is MonitorState.UNREACHABLE) == (listener.unreachable == ["t"])
