"""Attacks on the heartbeat's gRPC wire, on 127.0.0.1, in-process and as real processes.

No secret on the wire: a process squatting the RM's port (as in the gap while the RM restarts)
learns nothing it can use and is refused, and the agent registers once the real RM is back; a
unary call's token works once, for one RM instance, within its window; the RM proves itself on
every reply. Wire text is checked before it is recorded and escaped before it is logged; every
refusal is a status and one log line per cause. Every loop here is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import grpc.aio
import pytest

from harness.heartbeat_processes import AgentProcess, RmProcess
from harness.procs import wait_until
from heartbeat import (
    AgentThread,
    EventKind,
    HeartbeatAuthenticationError,
    MalformedMessageError,
    ManualClock,
    ProtocolVersionError,
    RegistrationTimeoutError,
    ResourceManagerServer,
    RetryPolicy,
)
from heartbeat.agent.main import SECRET_ENV, SecretError, parse_args, read_secret
from heartbeat.rm.admin import list_executors
from heartbeat.wire import auth as _auth
from heartbeat.wire.codec import (
    CALL_PROOF_KEY,
    CALL_TOKEN_KEY,
    CONNECT_METHOD,
    HELLO_METHOD,
    LIST_EXECUTORS_METHOD,
)
from heartbeat.wire.io_loop import submit
from heartbeat.wire.proto import heartbeat_pb2 as pb

from .conftest import DEADLINE_S, FAST, SECRET
from .fakes import Collector, ServedRm, served_rm
from .wire import (
    EOF,
    Squatter,
    hello,
    message,
    raw_http2_call,
    raw_stream,
    raw_unary,
    register_frame,
    secret_forms,
    status_of,
)

pytestmark = pytest.mark.timeout(180)
RETRY = RetryPolicy(min_delay_s=0.02, max_delay_s=0.1, deadline_s=DEADLINE_S, attempt_timeout_s=0.5)
KEY = _auth.SharedSecret(SECRET)
INJECTION = "bye\nARROWBEAT-CMD kill 1"


def free_port() -> int:
    probe = ResourceManagerServer(FAST, secret=SECRET)
    address = probe.start()
    probe.stop(grace_s=0.0)
    return int(address.rsplit(":", 1)[1])


def assert_no_raw_line(lines: list[str]) -> None:
    """Nothing from the wire started a line of its own."""
    assert not [line for line in lines if line.lstrip().startswith("ARROWBEAT-CMD")]


@pytest.fixture
def quiet_rm() -> Iterator[ServedRm]:
    """An RM whose refusals are all logged (a fresh refusal log per test)."""
    with served_rm(FAST, SECRET, grace_s=0.1) as served:
        yield served


# ---- a port squatter ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    [
        "fake-rm",
        "refuse:UNAUTHENTICATED",
        "refuse:ALREADY_EXISTS",
        "refuse:INVALID_ARGUMENT",
        "silent",
        "version:3",
    ],
)
def test_a_port_squatter_learns_nothing_reusable_and_the_agent_registers_when_the_rm_is_back(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    squatter = Squatter(port, mode).start()
    agent = AgentThread(address, SECRET, "victim", services=FAST, retry_policy=RETRY)
    rm: ResourceManagerServer | None = None
    try:
        with caplog.at_level(logging.DEBUG, logger="heartbeat"):
            agent.start()
            assert wait_until(lambda: len(squatter.calls(CONNECT_METHOD)) >= 3, DEADLINE_S), "3 attempts"
            assert agent.registration is None and agent.error is None, "refused, and still trying"
            squatter.stop()

            seen = squatter.everything()
            assert not [form for form in secret_forms(SECRET) if form in seen], "the secret leaked"
            assert not [k for c in squatter.calls() for k, _ in c.metadata if k.startswith("x-arrowbeat")]
            assert set(squatter.agent_message_kinds()) <= {"register"}, "no payload before the RM's proof"
            registers = squatter.registers()
            assert bool(registers) == (mode in ("fake-rm",) or mode.startswith("refuse:"))

            rm = ResourceManagerServer(FAST, secret=SECRET, port=port)
            events = Collector()
            rm.subscribe(events)
            assert rm.start() == address
            for captured in registers[:3]:  # what it collected is worth nothing to the real RM
                replay = raw_stream(address, [message(register=captured)])
                assert replay.code == grpc.StatusCode.UNAUTHENTICATED, replay
            assert agent.wait_registered(DEADLINE_S)
            events.wait_event(EventKind.REGISTERED, "victim", DEADLINE_S)
            assert [e.executor_id for e in events.events] == ["victim"], "no replay registered anything"
    finally:
        agent.stop()
        squatter.stop()
        if rm is not None:
            rm.stop(grace_s=0.1)
    assert all("\n" not in r.getMessage() for r in caplog.records)
    assert_no_raw_line(caplog.text.splitlines())
    warned = [
        r
        for r in caplog.records
        if r.name == "heartbeat.agent.async_agent"
        and r.module == "async_agent"
        and r.levelno == logging.WARNING
    ]  # the outage's own lines (agent_outage) aside
    if mode in ("fake-rm", "refuse:UNAUTHENTICATED", "version:3"):
        assert len(warned) == 1, "one warning for the whole stretch of refusals"
        assert ("protocol version mismatch" in warned[0].getMessage()) == (mode == "version:3")


def test_a_restart_gap_squatter_against_an_agent_process(tmp_path: Path) -> None:
    """The issue's attack with real processes: the agent (secret from an owner-only file) loses
    its RM, meets a squatter on the port, refuses it, and registers with the restarted RM."""
    secret = "gap-" + os.urandom(8).hex()
    secret_file = tmp_path / "secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    first = ResourceManagerServer(FAST, secret=secret)
    address = first.start()
    port = int(address.rsplit(":", 1)[1])
    agent = AgentProcess(address, "gap", FAST, secret, secret_file=secret_file, capture_stderr=True)
    squatter: Squatter | None = None
    second: ResourceManagerServer | None = None
    try:
        agent.wait_line("READY", DEADLINE_S)
        first.stop(grace_s=0.0)
        squatter = Squatter(port, "fake-rm").start()
        assert wait_until(lambda: len(squatter.registers()) >= 2, DEADLINE_S)
        squatter.stop()
        assert not [form for form in secret_forms(secret) if form in squatter.everything()]
        assert set(squatter.agent_message_kinds()) == {"register"}
        second = ResourceManagerServer(FAST, secret=secret, port=port, known_executors=["gap"])
        assert second.start() == address
        line = agent.wait_line("REGISTERED", DEADLINE_S)
        assert second.epoch in line
    finally:
        agent.reap()
        first.stop()
        if squatter is not None:
            squatter.stop()
        if second is not None:
            second.stop(grace_s=0.1)
    warnings = [line for line in agent.stderr_lines if " WARNING heartbeat." in line]  # not gRPC core's
    proofs = [line for line in warnings if "did not prove" in line]
    assert len(proofs) == 1, agent.stderr_lines
    # And the outage, said when it began and when it ended (issue 36: no longer DEBUG only).
    outage = [line for line in warnings if line not in proofs]
    assert len(outage) == 2 and "agent gap lost the RM at" in outage[0], agent.stderr_lines
    assert "agent gap registered with the RM at" in outage[1], agent.stderr_lines
    assert not [line for line in agent.stderr_lines if secret in line]


def test_list_executors_refuses_a_squatter_and_its_token_is_worth_nothing_to_the_real_rm() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    squatter = Squatter(port).start()
    try:
        with pytest.raises(HeartbeatAuthenticationError, match="did not prove"):
            list_executors(address, SECRET)
    finally:
        squatter.stop()
    assert not [form for form in secret_forms(SECRET) if form in squatter.everything()]
    [call] = squatter.calls(LIST_EXECUTORS_METHOD)
    token = dict(call.metadata)[CALL_TOKEN_KEY]
    assert isinstance(token, str)
    rm = ResourceManagerServer(FAST, secret=SECRET, port=port)
    try:
        assert rm.start() == address
        code, details = status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", token))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "not issued by this RM" in details
        assert list_executors(address, SECRET) == []
    finally:
        rm.stop(grace_s=0.1)


# ---- unary call tokens --------------------------------------------------------------------


def test_a_unary_token_works_once_for_its_method_and_body_and_the_reply_is_proved(quiet_rm: ServedRm) -> None:
    _, address, _ = quiet_rm
    challenge = hello(address)
    token, nonce = _auth.call_token(KEY, LIST_EXECUTORS_METHOD, challenge, b"")
    reply, trailing = raw_unary(address, LIST_EXECUTORS_METHOD, b"", token)
    proof = bytes.fromhex(trailing[CALL_PROOF_KEY])
    assert _auth.reply_proof_ok(KEY, LIST_EXECUTORS_METHOD, challenge, nonce, reply, proof)
    code, details = status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", token))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "used already" in details

    other = hello(address)
    for method, body in [(HELLO_METHOD, b""), (LIST_EXECUTORS_METHOD, b"\x08\x01")]:
        wrong, _ = _auth.call_token(KEY, method, other, body)  # made for another method or body
        code, _ = status_of(partial(raw_unary, address, LIST_EXECUTORS_METHOD, b"", wrong))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    good, _ = _auth.call_token(KEY, LIST_EXECUTORS_METHOD, other, b"")
    assert status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", good))[0] == grpc.StatusCode.OK


@pytest.mark.parametrize(
    "token",
    [None, "", "garbage", "00.11.22", "zz" * 40, "a" * 4000, "wrong-secret"],
)
def test_a_missing_malformed_or_forged_token_is_unauthenticated(
    quiet_rm: ServedRm, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    _, address, _ = quiet_rm
    if token == "wrong-secret":
        token, _ = _auth.call_token(_auth.SharedSecret("not-it"), LIST_EXECUTORS_METHOD, hello(address), b"")
    with caplog.at_level(logging.WARNING, logger="heartbeat"):
        for _ in range(3):
            code, details = status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", token))
            assert code == grpc.StatusCode.UNAUTHENTICATED and SECRET not in details
        assert list_executors(address, SECRET) == []  # others are served
    [line] = caplog.records
    assert "no valid proof of the secret" in line.getMessage() and "(0 more" in line.getMessage()


def test_a_stale_challenge_is_refused_on_the_rm_s_clock() -> None:
    clock = ManualClock()
    rm = ResourceManagerServer(FAST, secret=SECRET, clock=clock, call_window_s=60.0)
    address = rm.start()
    try:
        old = hello(address)
        clock.jump(60.5)
        token, _ = _auth.call_token(KEY, LIST_EXECUTORS_METHOD, old, b"")
        code, details = status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", token))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "stale challenge" in details
        fresh, _ = _auth.call_token(KEY, LIST_EXECUTORS_METHOD, hello(address), b"")
        assert (
            status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, b"", fresh))[0] == grpc.StatusCode.OK
        )
    finally:
        rm.stop(grace_s=0.1)


def test_the_replay_cache_is_bounded_and_forgets_only_expired_challenges() -> None:
    clock = ManualClock()
    cache = _auth.ReplayCache(clock, max_entries=3)
    assert all(cache.first_use(bytes([i]), expires_at=10.0) for i in range(3))
    assert not cache.first_use(b"\x00", 10.0), "a replay"
    with pytest.raises(_auth.ReplayCacheFull):
        cache.first_use(b"\x09", 10.0)
    clock.jump(10.5)
    assert cache.first_use(b"\x09", 20.0) and len(cache) == 1


# ---- protocol version ---------------------------------------------------------------------


def test_another_protocol_version_is_failed_precondition_naming_both(quiet_rm: ServedRm) -> None:
    _, address, events = quiet_rm
    result = raw_stream(address, [register_frame("old", version=1)])
    assert result.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "version 1" in result.details and "RM speaks 2" in result.details
    # An agent of protocol 1 sent the secret as metadata and no version: refused the same way.
    v1 = pb.AgentMessage(register=pb.RegisterRequest(executor_id="v1", host="h")).SerializeToString()
    legacy = raw_stream(address, [v1], metadata=(("x-arrowbeat-secret", SECRET),))
    assert legacy.code == grpc.StatusCode.FAILED_PRECONDITION and "version 0" in legacy.details
    code, details = status_of(lambda: hello(address, version=7))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "version 7" in details
    assert events.events == []


def test_a_version_refusal_reaches_the_caller_typed() -> None:
    port = free_port()
    squatter = Squatter(port, "version:3").start()
    policy = RetryPolicy(min_delay_s=0.02, max_delay_s=0.05, deadline_s=1.0, attempt_timeout_s=0.5)
    agent = AgentThread(f"127.0.0.1:{port}", SECRET, "v", services=FAST, retry_policy=policy)
    try:
        agent.start()
        assert not agent.wait_registered(DEADLINE_S)
        assert isinstance(agent.error, RegistrationTimeoutError)
        assert isinstance(agent.error.last_error, ProtocolVersionError)
        assert "version 3" in str(agent.error.last_error) and "agent speaks 2" in str(agent.error.last_error)
    finally:
        agent.stop()
        squatter.stop()


# ---- the handshake's deadline and cap; silent, dripping and garbage peers -----------------


def test_silent_streams_are_capped_and_cut_at_the_handshake_deadline() -> None:
    rm = ResourceManagerServer(FAST, secret=SECRET, register_timeout_s=1.0, max_pending_handshakes=3)
    events = Collector()
    rm.subscribe(events)
    address = rm.start()
    holding = threading.Event()

    async def hold(count: int) -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
            calls = [ch.stream_stream(CONNECT_METHOD, None, None)(None, timeout=10.0) for _ in range(count)]
            for call in calls:
                assert await call.read() is not EOF  # the challenge; then say nothing
            holding.set()
            for call in calls:
                with contextlib.suppress(grpc.aio.AioRpcError):  # raised for the non-OK status
                    for _ in range(10):
                        if await call.read() is EOF:
                            break
            return [await call.code() for call in calls]

    try:
        held = submit(hold(3))
        assert holding.wait(DEADLINE_S)
        crowded = raw_stream(address, [register_frame("late")])
        assert crowded.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "in progress" in crowded.details
        assert held.result(DEADLINE_S) == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3
        agent = AgentThread(address, SECRET, "after", services=FAST, retry_policy=RETRY)
        try:
            agent.start()
            assert agent.wait_registered(DEADLINE_S)
        finally:
            agent.stop()
    finally:
        rm.stop(grace_s=0.1)
    assert [e.executor_id for e in events.events if e.kind is EventKind.REGISTERED] == ["after"]


def test_silent_dripping_and_garbage_tcp_peers_do_not_stop_agents(quiet_rm: ServedRm, tmp_path: Path) -> None:
    _, address, events = quiet_rm
    host, port = address.rsplit(":", 1)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    silent = [socket.create_connection((host, int(port)), timeout=5.0) for _ in range(20)]
    dripping = [socket.create_connection((host, int(port)), timeout=5.0) for _ in range(20)]
    stop = threading.Event()

    def drip() -> None:
        for index in range(len(preface)):  # bounded: one byte per socket per 0.2 s, at most 24 rounds
            if stop.wait(0.2):
                return
            for sock in dripping:
                with contextlib.suppress(OSError):
                    sock.sendall(preface[index : index + 1])

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    marker = tmp_path / "executed"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    try:
        with socket.create_connection((host, int(port)), timeout=5.0) as junk:
            junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096))
            junk.settimeout(DEADLINE_S)
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and junk.recv(65536):  # the server hangs up on it
                pass
        evil = raw_stream(address, [pickle.dumps(Evil())])
        assert evil.code == grpc.StatusCode.INVALID_ARGUMENT
        code, _ = status_of(lambda: raw_unary(address, LIST_EXECUTORS_METHOD, pickle.dumps(Evil())))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        agent = AgentThread(address, SECRET, "busy", services=FAST, retry_policy=RETRY)
        try:
            agent.start()
            assert agent.wait_registered(DEADLINE_S)
            assert events.wait_for(lambda: len(events.records) >= 3, DEADLINE_S), "heartbeats flow"
        finally:
            agent.stop()
    finally:
        stop.set()
        dripper.join(5.0)
        for sock in silent + dripping:
            sock.close()
    assert not marker.exists(), "nothing from the network was unpickled"


# ---- wire text ----------------------------------------------------------------------------


def unregister_with(reason: str) -> Callable[[pb.RegisterResponse], list[bytes]]:
    def build(registered: pb.RegisterResponse) -> list[bytes]:
        bye = pb.UnregisterRequest(epoch=registered.epoch, instance_id=registered.instance_id, reason=reason)
        return [message(unregister=bye)]

    return build


def test_an_unregister_reason_with_a_newline_is_refused_and_never_logged_raw(
    quiet_rm: ServedRm, caplog: pytest.LogCaptureFixture
) -> None:
    server, address, events = quiet_rm
    with caplog.at_level(logging.DEBUG):  # every logger, every level
        bad = raw_stream(address, [register_frame("r1")], after_registered=unregister_with(INJECTION))
        worse = raw_stream(
            address, [register_frame("r2")], after_registered=unregister_with("x\x1b[2J\u2028y")
        )
        assert list_executors(address, SECRET)  # served meanwhile; whatever was logged is in
    assert bad.code == worse.code == grpc.StatusCode.INVALID_ARGUMENT and "reason" in bad.details
    assert "\n" not in bad.details
    assert events.find(EventKind.UNREGISTERED, "r1") == [], "a refused message is not applied"
    assert all("\n" not in r.getMessage() and "\x1b" not in r.getMessage() for r in caplog.records)
    assert_no_raw_line(caplog.text.splitlines())
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1, "one line for the cause, then rate-limited"
    assert "reason" in refused[0].getMessage() and "ARROWBEAT-CMD" in refused[0].getMessage()
    assert server.executors()  # the registrations themselves stand until they time out


def test_our_own_reason_is_sent_escaped_so_an_orderly_stop_is_recorded(quiet_rm: ServedRm) -> None:
    _, address, events = quiet_rm
    agent = AgentThread(address, SECRET, "tidy", services=FAST, retry_policy=RETRY)
    agent.start()
    assert agent.wait_registered(DEADLINE_S)
    agent.stop(reason=INJECTION + "x" * 2000)
    event = events.wait_event(EventKind.UNREGISTERED, "tidy", DEADLINE_S)
    assert event.detail.startswith("bye\\nARROWBEAT-CMD kill 1") and "\n" not in event.detail
    assert len(event.detail) <= 512


@pytest.mark.parametrize(
    ("executor_id", "host"),
    [("evil\nARROWBEAT-CMD x", "h"), ("e", "\x1b[31mred"), ("x" * 257, "h"), ("tab\there", "h")],
)
def test_ids_and_hosts_from_the_wire_are_checked(
    quiet_rm: ServedRm, executor_id: str, host: str, caplog: pytest.LogCaptureFixture
) -> None:
    server, address, events = quiet_rm
    with caplog.at_level(logging.WARNING):
        result = raw_stream(address, [register_frame(executor_id, host=host)])
        again = raw_stream(address, [register_frame(executor_id, host=host)])
    assert result.code == again.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "printable" in result.details and "\n" not in result.details
    assert server.executors() == [] and events.events == []
    [line] = caplog.records
    assert "malformed message" in line.getMessage() and "\n" not in line.getMessage()


def test_a_metric_name_with_a_newline_is_refused(quiet_rm: ServedRm) -> None:
    _, address, events = quiet_rm

    def heartbeat(registered: pb.RegisterResponse) -> list[bytes]:
        payload = pb.Payload(metrics={"ok": 1.0, "bad\nARROWBEAT-CMD x": 2.0})
        answer = pb.HeartbeatResponse(
            epoch=registered.epoch, instance_id=registered.instance_id, payload=payload
        )
        return [message(heartbeat=answer)]

    result = raw_stream(address, [register_frame("m")], after_registered=heartbeat)
    assert result.code == grpc.StatusCode.INVALID_ARGUMENT and "metric name" in result.details
    assert events.records == []


def test_an_agent_refuses_its_own_bad_id_before_dialling(quiet_rm: ServedRm) -> None:
    _, address, _ = quiet_rm
    agent = AgentThread(address, SECRET, "bad\nid", services=FAST, retry_policy=RETRY)
    try:
        agent.start()
        assert not agent.wait_registered(DEADLINE_S)
        assert isinstance(agent.error, MalformedMessageError)
    finally:
        agent.stop()


def test_a_reason_injection_against_an_rm_process_never_starts_a_line(tmp_path: Path) -> None:
    """The RM as a process with its log on stderr (as the driver-side process's): what a peer
    sends is refused or escaped, so no line of its output starts with a command."""
    rm = RmProcess(FAST, SECRET, log_level="DEBUG")
    try:
        rm.wait_ready(DEADLINE_S)
        bad = raw_stream(rm.address, [register_frame("p1")], after_registered=unregister_with(INJECTION))
        assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
        agent = AgentThread(rm.address, SECRET, "p2", services=FAST, retry_policy=RETRY)
        agent.start()
        assert agent.wait_registered(DEADLINE_S)
        agent.stop(reason=INJECTION)
        rm.events.wait_event(EventKind.UNREGISTERED, "p2", DEADLINE_S)
        # Header bytes no gRPC client would send: a newline in the path and in metadata values.
        list_path = LIST_EXECUTORS_METHOD.encode()
        for path, headers in [
            (list_path, [(CALL_TOKEN_KEY.encode(), b"a\nARROWBEAT-CMD kill 2")]),
            (list_path + b"\nARROWBEAT-CMD kill 3", []),
            (CONNECT_METHOD.encode(), [(b"user-agent", b"x\nARROWBEAT-CMD kill 4")]),
        ]:
            assert b"grpc-status" in raw_http2_call(rm.address, path, headers)
        causes = ("malformed message", "no valid proof of the secret")  # each logged once
        assert wait_until(lambda: all(any(c in line for line in rm.stderr_lines) for c in causes), DEADLINE_S)
    finally:
        rm.reap()
    assert_no_raw_line(rm.stdout_lines + rm.stderr_lines)
    assert not [line for line in rm.stdout_lines + rm.stderr_lines if SECRET in line]


# ---- the secret in no repr, log line or error ---------------------------------------------


def test_the_secret_is_in_no_repr_log_line_or_error(caplog: pytest.LogCaptureFixture) -> None:
    secret = "hunter2-" + os.urandom(8).hex()
    texts: list[str] = []
    with caplog.at_level(logging.DEBUG):
        rm = ResourceManagerServer(FAST, secret=secret)
        address = rm.start()
        good = AgentThread(address, secret, "s1", services=FAST, retry_policy=RETRY)
        policy = RetryPolicy(min_delay_s=0.02, max_delay_s=0.05, deadline_s=0.5, attempt_timeout_s=0.3)
        bad = AgentThread(address, "another-secret", "s2", services=FAST, retry_policy=policy)
        try:
            good.start()
            bad.start()
            assert good.wait_registered(DEADLINE_S)
            assert not bad.wait_registered(DEADLINE_S)
            list_executors(address, secret)
            with pytest.raises(HeartbeatAuthenticationError) as refused:
                list_executors(address, "another-secret")
            inner = good._agent
            texts += [repr(rm), repr(good), repr(bad), repr(inner), repr(vars(rm)), repr(vars(good))]
            texts += [repr(vars(inner)), str(refused.value), repr(bad.error), str(bad.error)]
        finally:
            good.stop()
            bad.stop()
            rm.stop(grace_s=0.1)
    texts.append(caplog.text)
    for form in secret_forms(secret):
        assert not [t for t in texts if form.decode() in t]
    assert "SharedSecret(<hidden>)" in repr(vars(rm))


def test_agent_main_takes_the_secret_from_a_private_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "file-" + os.urandom(8).hex()
    same = _auth.SharedSecret(secret).mac(b"probe")
    monkeypatch.setattr("sys.stdin", io.StringIO(secret + "\n"))
    assert read_secret("-").mac(b"probe") == same
    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    path.chmod(0o644)
    with pytest.raises(SecretError) as loose:
        read_secret(str(path))
    assert str(path) in str(loose.value) and secret not in str(loose.value) and "644" in str(loose.value)
    link = tmp_path / "link"
    link.symlink_to(path)
    path.chmod(0o600)
    with pytest.raises(SecretError):
        read_secret(str(link))  # not followed
    from_file = read_secret(str(path))
    assert repr(from_file) == "SharedSecret(<hidden>)" and from_file.mac(b"probe") == same
    environ = {SECRET_ENV: secret, "OTHER": "1"}
    assert read_secret(None, environ).mac(b"probe") == same
    assert environ == {"OTHER": "1"}, "taken out of the environment children would inherit"
    with pytest.raises(SecretError):
        read_secret(None, {})
    args = parse_args(["--rm", "h:1", "--executor-id", "e", "--secret-file", str(path)])
    assert secret not in repr(args)


def test_proofs_are_bound_to_direction_nonces_and_fields() -> None:
    def agent(rm_nonce: bytes = b"r" * 16, executor_id: str = "e") -> bytes:
        return _auth.agent_proof(
            KEY,
            rm_nonce=rm_nonce,
            agent_nonce=b"a" * 16,
            protocol_version=2,
            executor_id=executor_id,
            host="h",
            pid=1,
            resume_epoch="",
            resume_instance_id="",
        )

    a = agent()
    assert a == agent() and a != agent(rm_nonce=b"R" * 16) and a != agent(executor_id="f")
    r = _auth.rm_proof(
        KEY,
        rm_nonce=b"r" * 16,
        agent_nonce=b"a" * 16,
        executor_id="e",
        epoch="",
        instance_id="",
        interval_ms=2,
        timeout_ms=0,
        resumed=False,
    )
    assert r != a and len(r) == _auth.MAC_BYTES
    # Length prefixes: moving bytes between fields changes the input.
    assert KEY.mac(b"l", "ab", "c") != KEY.mac(b"l", "a", "bc")


def test_the_agent_trusts_no_epoch_before_the_rm_s_proof() -> None:
    """A forged `registered` (fake-rm squatter) is never handed to the core: no registration."""
    port = free_port()
    squatter = Squatter(port, "fake-rm").start()
    seen: list[object] = []
    policy = RetryPolicy(min_delay_s=0.02, max_delay_s=0.05, deadline_s=1.0, attempt_timeout_s=0.5)
    agent = AgentThread(f"127.0.0.1:{port}", SECRET, "t", services=FAST, retry_policy=policy)
    try:
        agent.start()
        assert not agent.wait_registered(DEADLINE_S)
        seen.append(agent.registrations)
    finally:
        agent.stop()
        squatter.stop()
    assert seen == [0]
    assert isinstance(agent.error, RegistrationTimeoutError)
    assert isinstance(agent.error.last_error, HeartbeatAuthenticationError)


def test_a_replaced_refusal_is_final_only_with_the_rms_proof_for_this_attempt() -> None:
    """An agent stops for good on ALREADY_EXISTS at registration only if the refusal carries the
    RM's MAC over both of this attempt's nonces and what it resumed: a squatter, or a proof
    replayed from another attempt, cannot stop it."""
    secret = _auth.SharedSecret(SECRET)
    rm_nonce, agent_nonce = _auth.new_nonce(), _auth.new_nonce()
    text = "replaced by a newer one"

    def check(
        details: str,
        key: _auth.SharedSecret = secret,
        rm: bytes = rm_nonce,
        agent: bytes = agent_nonce,
        executor: str = "3",
        resumed: str = "abc",
    ) -> tuple[bool, str]:
        return _auth.replaced_proof_ok(
            key, details, rm_nonce=rm, agent_nonce=agent, executor_id=executor, resumed=resumed
        )

    details = _auth.with_replaced_proof(
        secret, text, rm_nonce=rm_nonce, agent_nonce=agent_nonce, executor_id="3", resumed="abc"
    )
    assert check(details) == (True, text)
    assert not check(details, rm=_auth.new_nonce())[0]
    assert not check(details, agent=_auth.new_nonce())[0]
    assert not check(details, resumed="abd")[0]
    assert check(details, executor="4") == (False, details)  # kept whole: a bad proof shows
    assert not check(details, key=_auth.SharedSecret("another application's secret"))[0]
    assert check(text) == (False, text)  # a bare status, as a squatter sends
    forged = details[:-3] + ("0" if details[-3] != "0" else "1") + details[-2:]
    assert not check(forged)[0]
