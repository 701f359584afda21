"""The live page without Spark: the token rule, the health rule, the view's bounds (on a manual
clock), and the HTTP server over loopback with an in-process RM and real agents."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arrowbeat_base.clock import ManualClock
from harness.procs import wait_until
from heartbeat import (
    AgentThread,
    EventKind,
    ExecutorEvent,
    HeartbeatRecord,
    HeartbeatServices,
    ResourceManagerServer,
)
from heartbeat.executor_info import ExecutorInfo
from heartbeat.payload import Payload, slots_provider, static_provider
from spark_plugin.settings import tls
from spark_plugin.tools.live_page import LivePage, LiveView, health, page_token, start_live_page
from tests.heartbeat.conftest import DEADLINE_S, SECRET

pytestmark = pytest.mark.timeout(60)
LIVE = HeartbeatServices(interval_s=0.1, timeout_s=3.0, rpc_failure_threshold=2)
"""Heartbeats every 0.1 s and a 3 s timeout: a silenced agent turns red within seconds, and a live
one reads ``ok`` (its last heartbeat under half the timeout) even when both cores are busy, which
a 0.5 s timeout (``ok`` only under 0.25 s) did not promise."""


def test_the_page_token_is_derived_from_the_secret_and_reveals_nothing_of_it() -> None:
    secret = "an-application-secret-0123456789"
    token = page_token(secret)
    assert token == page_token(secret), "a restarted driver-side process keeps the logged URL valid"
    assert len(token) == 32 and int(token, 16) >= 0
    assert token != page_token(secret + "x")
    assert secret not in token and token not in secret


@pytest.mark.parametrize(
    ("state", "age", "expected"),
    [
        ("RUNNING", None, "ok"),
        ("RUNNING", 0.9, "ok"),
        ("RUNNING", 1.0, "ok"),  # exactly half the timeout: not yet
        ("RUNNING", 1.01, "amber"),
        ("RUNNING", 2.0, "amber"),
        ("RUNNING", 2.01, "red"),
        ("TIMEOUT", 0.1, "red"),
        ("UNREACHABLE", 0.1, "red"),
        ("UNMONITORED", None, "red"),
        ("UNREGISTERED", 30.0, "gone"),
        ("REPLACED", 30.0, "gone"),
    ],
)
def test_health_turns_amber_past_half_the_timeout_and_red_past_it(
    state: str, age: float | None, expected: str
) -> None:
    assert health(state, age, timeout_s=2.0) == expected


def info(
    executor_id: str, clock: ManualClock, last: float | None, registered_ago: float = 60
) -> ExecutorInfo:
    payload = Payload(slots_total=4, slots_busy=1, rss_bytes=5 << 20, metrics={"shuffle_pool_segments": 10.0})
    return ExecutorInfo(
        executor_id, "h", "i", "RUNNING", clock.time() - registered_ago, last, 1.5, payload, 42
    )


def test_the_view_ages_each_executor_keeps_a_window_of_rtts_and_bounded_events() -> None:
    clock = ManualClock()
    table: list[ExecutorInfo] = []
    view = LiveView(lambda: table, 0.5, 2.0, clock=clock, rtt_window_s=10.0, max_events=3)
    for i in range(30):  # 15 s of heartbeats every 0.5 s: the last 10 s are kept
        view(HeartbeatRecord("1", "h", "i", clock.time(), 1.0 + i, Payload()))
        clock.jump(0.5)
    table[:] = [
        info("1", clock, clock.time() - 1.5),
        info("2", clock, None, registered_ago=0.25),
        info("3", clock, clock.time() - 9),
    ]
    body = view.executors_json()
    rows = {r["executor_id"]: r for r in body["executors"]}
    assert [rows[e]["health"] for e in "123"] == ["amber", "ok", "red"]
    assert rows["1"]["age_s"] == 1.5 and rows["2"]["age_s"] == 0.25  # no answer yet: since registration
    history = rows["1"]["rtt_history"]
    assert history[-1][1] == 30.0 and clock.time() - history[0][0] <= 10.0 + 1e-6
    assert rows["2"]["rtt_history"] == []
    assert rows["1"]["slots_total"] == 4 and rows["1"]["rss_bytes"] == 5 << 20
    assert (body["interval_s"], body["timeout_s"]) == (0.5, 2.0)

    for n in range(5):
        view(ExecutorEvent(EventKind.REGISTERED, str(n), "h\x1b[31m", "i", clock.time(), "d" * 1000))
    events = view.events_json()["events"]
    assert [e["seq"] for e in events] == [3, 4, 5], "the last max_events are kept"
    assert events[0]["host"] == "h\\x1b[31m" and len(events[0]["detail"]) < 400, "wire text made one line"
    assert [e["seq"] for e in view.events_json(after=4)["events"]] == [5]


def test_a_degraded_executor_is_marked_amber_with_its_evidence_until_it_recovers_or_goes() -> None:
    clock = ManualClock()
    table = [info("1", clock, clock.time() - 0.2), info("2", clock, clock.time() - 0.2)]
    view = LiveView(lambda: table, 0.5, 2.0, clock=clock)

    def rows() -> dict[str, dict[str, Any]]:
        return {r["executor_id"]: r for r in view.executors_json()["executors"]}

    evidence = "slower than its peers: JVM pulse lateness 49.5 ms vs the peers' 0.50 ms"
    view(ExecutorEvent(EventKind.DEGRADED, "1", "h", "i", clock.time(), evidence))
    now = rows()
    assert (now["1"]["health"], now["1"]["degraded"]) == ("amber", evidence)
    assert (now["2"]["health"], now["2"]["degraded"]) == ("ok", None)
    view(ExecutorEvent(EventKind.RECOVERED, "1", "h", "i", clock.time(), "back in line"))
    assert (rows()["1"]["health"], rows()["1"]["degraded"]) == ("ok", None)
    view(ExecutorEvent(EventKind.DEGRADED, "2", "h", "i", clock.time(), evidence))
    view(ExecutorEvent(EventKind.SPARK_REMOVED, "2", "h", "i", clock.time(), "replaced"))
    assert rows()["2"]["degraded"] is None
    assert health("RUNNING", 0.1, 2.0, degraded=True) == "amber"
    assert health("TIMEOUT", 0.1, 2.0, degraded=True) == "red"


# ---- over HTTP, with an in-process RM and real agents on loopback ---------------------------------


class Page:
    def __init__(self, page: LivePage, token: str) -> None:
        self.page = page
        self.token = token
        host, port = page.url.split("://", 1)[1].rstrip("/").rsplit(":", 1)
        self.host, self.port = host, int(port)

    def get(self, path: str, cookie: str = "", method: str = "GET") -> http.client.HTTPResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        conn.request(method, path, headers={"Cookie": cookie} if cookie else {})
        response = conn.getresponse()
        response.body = response.read()  # type: ignore[attr-defined]
        conn.close()
        return response

    def cookie(self) -> str:
        first = self.get(f"/?token={self.token}")
        assert first.status == 303 and first.getheader("Location") == "/"
        set_cookie = first.getheader("Set-Cookie") or ""
        assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        return set_cookie.split(";", 1)[0]

    def json(self, path: str, cookie: str) -> Any:
        response = self.get(path, cookie)
        assert response.status == 200, response.body  # type: ignore[attr-defined]
        return json.loads(response.body)  # type: ignore[attr-defined]


@pytest.fixture
def served() -> Iterator[tuple[ResourceManagerServer, str, Page]]:
    rm = ResourceManagerServer(LIVE, secret=SECRET)
    address = rm.start()
    page = start_live_page(
        SECRET,
        rm.executors,
        rm.subscribe,
        host="127.0.0.1",
        port=0,
        interval_s=LIVE.interval_s,
        timeout_s=LIVE.timeout_s,
        app_id=lambda: "app-test",
        rm_address=address,
    )
    assert page is not None
    try:
        yield rm, address, Page(page, page_token(SECRET))
    finally:
        page.stop()
        rm.stop(grace_s=0.2)


def test_without_the_token_every_path_is_401_and_with_it_the_page_shows_the_rm(
    served: tuple[ResourceManagerServer, str, Page],
) -> None:
    _, address, page = served
    assert SECRET not in page.page.url_with_token
    for path in ("/", "/api/executors", "/api/events", "/static/live.js", "/nothing", "/?token=wrong"):
        refused = page.get(path)
        assert refused.status == 401, path
        assert refused.getheader("Content-Security-Policy"), "security headers on refusals too"
    assert page.get("/api/executors", cookie=f"arrowbeat_page_{page.port}=wrong").status == 401
    assert page.get("/", method="POST").status == 405

    cookie = page.cookie()
    document = page.get("/", cookie)
    assert document.status == 200 and b'id="executor-rows"' in document.body  # type: ignore[attr-defined]
    assert "default-src 'none'" in (document.getheader("Content-Security-Policy") or "")
    assert document.getheader("Cache-Control") == "no-store"
    for name in ("live.js", "live.css", "uPlot.iife.min.js", "uPlot.min.css"):
        assert page.get(f"/static/{name}", cookie).status == 200, name
    assert page.get("/static/..%2flive_page.py", cookie).status == 404
    assert page.get("/static/live.html", cookie).status == 404
    assert page.json(f"/api/executors?token={page.token}", "")["rm_address"] == address  # for curl
    assert page.get("/api/events?after=x", cookie).status == 400


def test_executors_and_events_follow_real_agents_and_a_silent_one_turns_red(
    served: tuple[ResourceManagerServer, str, Page],
) -> None:
    rm, address, page = served
    cookie = page.cookie()
    healthy = [True]
    providers = [slots_provider(4, lambda: 1), static_provider({"rss_bytes": 64 << 20})]
    agents = [
        AgentThread(address, SECRET, "1", services=LIVE, payload_providers=providers),
        AgentThread(
            address, SECRET, "2", services=LIVE, payload_providers=providers, is_healthy=lambda: healthy[0]
        ),
    ]
    try:
        for agent in agents:
            agent.start()

        def rows() -> dict[str, dict[str, Any]]:
            return {r["executor_id"]: r for r in page.json("/api/executors", cookie)["executors"]}

        def answering() -> bool:
            now = rows()
            return len(now) == 2 and all(len(r["rtt_history"]) >= 3 for r in now.values())

        assert wait_until(answering, DEADLINE_S)
        now = rows()
        assert {r["state"] for r in now.values()} == {"RUNNING"}
        assert all(r["age_s"] is not None and r["rss_bytes"] == 64 << 20 for r in now.values())
        assert now["1"]["slots_total"] == 4 and now["1"]["slots_busy"] == 1

        healthy[0] = False  # agent 2 stops answering: HEARTBEAT_TIMEOUT
        assert wait_until(lambda: rows()["2"]["health"] == "red", DEADLINE_S)
        assert rows()["2"]["state"] == "TIMEOUT" and rows()["1"]["health"] == "ok"

        def kinds() -> set[tuple[str, str]]:
            return {(e["kind"], e["executor_id"]) for e in page.json("/api/events", cookie)["events"]}

        # The state changes at once; its event reaches the page from the RM's event thread.
        expected = {("REGISTERED", "1"), ("REGISTERED", "2"), ("HEARTBEAT_TIMEOUT", "2")}
        assert wait_until(lambda: expected <= kinds(), DEADLINE_S), kinds()
    finally:
        healthy[0] = True
        for agent in agents:
            agent.stop()
    assert rm.executors(), "the RM itself was only read"


def closed(peer: socket.socket) -> bool:
    peer.settimeout(0.05)
    try:
        return peer.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slow_and_garbage_clients_are_cut_off_and_others_are_served() -> None:
    token = "t" * 32
    page = LivePage(LiveView(list, 0.5, 2.0), token, max_connection_s=1.0)
    page.start()
    peers: list[socket.socket] = []
    try:
        client = Page(page, token)
        slow = socket.create_connection((client.host, client.port), timeout=10)
        peers.append(slow)
        slow.sendall(b"GET /api/executors HT")  # and never more
        opened = time.monotonic()
        garbage = socket.create_connection((client.host, client.port), timeout=10)
        peers.append(garbage)
        garbage.sendall(b"GET /" + b"A" * 70_000 + b" HTTP/1.1\r\n\r\n")
        assert b" 400 " in garbage.recv(100), "an oversized request line is refused"
        assert client.json(f"/api/executors?token={token}", "")["executors"] == [], "others are served"
        assert wait_until(lambda: closed(slow), DEADLINE_S)
        assert time.monotonic() - opened >= 0.9, "cut off for its age, not before"
    finally:
        for peer in peers:
            peer.close()
        page.stop()


def test_connections_beyond_the_bound_are_closed() -> None:
    token = "t" * 32
    page = LivePage(LiveView(list, 0.5, 2.0), token, max_connections=4)
    page.start()
    try:
        client = Page(page, token)
        peers = [socket.create_connection((client.host, client.port), timeout=10) for _ in range(10)]
        try:
            assert wait_until(lambda: sum(closed(p) for p in peers) >= 6, DEADLINE_S)
        finally:
            for peer in peers:
                peer.close()
        assert client.json(f"/api/executors?token={token}", "")["executors"] == []
    finally:
        page.stop()


def test_a_port_in_use_leaves_the_page_off_with_one_error_and_nothing_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        page = start_live_page(
            SECRET,
            list,
            lambda view: None,
            host="127.0.0.1",
            port=port,
            interval_s=0.5,
            timeout_s=2.0,
            app_id=lambda: "",
            rm_address="",
        )
    assert page is None
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "live page off" in errors[0], errors
    assert not any(t.name == "arrowbeat-live-page" for t in threading.enumerate())


def test_with_tls_the_page_is_https_only_and_its_cookie_secure() -> None:
    material = tls.generate_self_signed()
    page = LivePage(LiveView(list, 0.5, 2.0), "t" * 32, ssl_context=tls.server_context(material))
    page.start()
    try:
        assert page.url.startswith("https://")
        host, port = page.url.removeprefix("https://").rstrip("/").rsplit(":", 1)
        context = tls.client_context(material)

        def get(path: str) -> http.client.HTTPResponse:
            conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
            conn.sock = context.wrap_socket(
                socket.create_connection((host, int(port)), timeout=10), server_hostname=material.server_name
            )
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            conn.close()
            return response

        assert get("/api/executors").status == 401
        first = get(f"/?token={'t' * 32}")
        assert first.status == 303 and "Secure" in (first.getheader("Set-Cookie") or "")
        assert get(f"/api/executors?token={'t' * 32}").status == 200
        plain = Page(page, "t" * 32)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.get("/api/executors")
    finally:
        page.stop()
