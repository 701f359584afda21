"""The live page: every executor's liveness as the ResourceManager sees it, in a browser.

The driver-side process (``spark_plugin.processes.driver``) serves it next to the RM. Two parts:

- :class:`LiveView`, what the page shows, as JSON and without HTTP: the RM's executor table (the
  columns of ``arrowbeat executors``, ``views.executor_rows``) with a *health* per executor (see
  :func:`health`), each executor's RTTs over the last ``rtt_window_s``, and the last
  ``max_events`` lifecycle events. It is an RM event-bus subscriber (``rm.subscribe``): it
  appends to bounded deques and returns, so it never slows the other subscribers.
- :class:`LivePage`, the HTTP server (aiohttp) on a thread and event loop of its own: a slow,
  flooding or garbage-sending client ties up at most the page's loop, never the RM's heartbeat
  loop. Requests are small GETs: header lines and counts are bounded, bodies are never read, an
  idle keep-alive ends after a few seconds, and a sweep each second closes connections older
  than ``MAX_CONNECTION_S`` (a request sent byte by byte) and the newest beyond
  ``MAX_CONNECTIONS``. A malformed request gets its 400 and at most one log line a minute.

Access (:func:`page_token`): the page token is ``HMAC-SHA256(secret, "arrowbeat live page")``,
never the secret itself, so seeing the URL does not let anyone speak to the RM or the shuffle.
``GET /?token=T`` sets it as an ``HttpOnly``, ``SameSite=Strict`` cookie and redirects to ``/``
(the token leaves the address bar); any request then needs that cookie or ``?token=T`` (for
``curl``), else 401. The URL with the token is logged once at start-up; the SparkConf, which the
Spark UI's Environment page shows, carries the URL without it (``spark.arrowbeat.ui.url``).
With ``spark.arrowbeat.ssl.enabled`` the page is HTTPS with the RM's certificate (and the
cookie ``Secure``), so the token never crosses the network in clear.
Everything the page loads comes from this server (a strict Content-Security-Policy): the chart
library (uPlot, MIT, ``web/uPlot.LICENSE``) is vendored, and text from the wire (ids, hosts,
details) is shown as text, never as markup.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arrowbeat_base.clock import SYSTEM_CLOCK, Clock
from arrowbeat_base.rate_log import RateLog
from heartbeat import ExecutorEvent, HeartbeatRecord, one_line

if TYPE_CHECKING:
    from aiohttp import web

    from heartbeat.executor_info import ExecutorInfo

log = logging.getLogger("arrowbeat.live_page")

WEB = Path(__file__).parent / "web"
STATIC = {  # name -> content type: the only files served
    "live.js": "text/javascript",
    "live.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
MAX_CONNECTIONS = 32
MAX_CONNECTION_S = 60.0
KEEPALIVE_S = 5.0
MAX_POINTS_SENT = 120
"""RTT points per executor in one answer (a longer history is thinned), so a poll stays small."""
_TOKEN_CONTEXT = b"arrowbeat live page"


class _OncePerCause(logging.Filter):
    """aiohttp logs each malformed request with a traceback: pass one record per message every
    ``every_s``, so a peer sending garbage cannot fill the driver's log."""

    def __init__(self, every_s: float = 60.0, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__()
        self._rate = RateLog(None, every_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if len(self._rate) > 100 or self._rate.admit(str(record.msg)[:80]) is None:
            return False  # past 100 causes, nothing more: the table stays small
        record.exc_info, record.exc_text = None, None  # one line: the peer's bytes are no stack
        return True


_HTTP_LOG = logging.getLogger("arrowbeat.live_page.http")
_HTTP_LOG.addFilter(_OncePerCause())
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
}


def page_token(secret: str) -> str:
    """The page's access token: derived from the application's secret, which it never reveals.

    The same secret gives the same token, so a restarted driver-side process (same secret, same
    port) keeps the logged URL valid."""
    return hmac.new(secret.encode(), _TOKEN_CONTEXT, hashlib.sha256).hexdigest()[:32]


def health(state: str, age_s: float | None, timeout_s: float, degraded: bool = False) -> str:
    """``ok``, ``amber`` (a live executor silent past half the timeout, or one recorded ``DEGRADED``:
    slower than its peers), ``red`` (silent past the
    timeout, or timed out, unreachable, or without an agent) or ``gone`` (it left on purpose or
    was replaced by a newer registration)."""
    if state == "RUNNING":
        if age_s is not None and age_s > timeout_s:
            return "red"
        if degraded or (age_s is not None and age_s > timeout_s / 2):
            return "amber"
        return "ok"
    if state in ("TIMEOUT", "UNREACHABLE", "UNMONITORED"):
        return "red"
    return "gone"


def _thin(points: Sequence[tuple[float, float]], limit: int) -> list[tuple[float, float]]:
    if len(points) <= limit:
        return list(points)
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


class LiveView:
    """What the page shows; subscribe it to the RM's bus, read it from any thread."""

    def __init__(
        self,
        executors: Callable[[], list[ExecutorInfo]],
        interval_s: float,
        timeout_s: float,
        *,
        app_id: Callable[[], str] = lambda: "",
        rm_address: str = "",
        clock: Clock = SYSTEM_CLOCK,
        rtt_window_s: float = 300.0,
        max_events: int = 500,
        max_tracked: int = 2000,
    ) -> None:
        self._executors = executors
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._app_id = app_id
        self._rm_address = rm_address
        self._clock = clock
        self._window_s = rtt_window_s
        self._max_points = max(10, int(rtt_window_s / interval_s) + 1)
        self._max_tracked = max_tracked
        self._lock = threading.Lock()
        self._rtts: dict[str, collections.deque[tuple[float, float]]] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_events)
        self._seq = 0
        self._degraded: dict[str, str] = {}
        """Executors recorded DEGRADED and not since RECOVERED or gone: the evidence."""

    def __call__(self, event: object) -> None:
        """The bus subscriber: an answered heartbeat's RTT, or a lifecycle event."""
        if isinstance(event, HeartbeatRecord):
            with self._lock:
                series = self._rtts.get(event.executor_id)
                if series is None:
                    if len(self._rtts) >= self._max_tracked:  # executor churn: forget the oldest
                        del self._rtts[next(iter(self._rtts))]
                    series = self._rtts[event.executor_id] = collections.deque(maxlen=self._max_points)
                series.append((round(event.ts, 3), round(event.rtt_ms, 3)))
        elif isinstance(event, ExecutorEvent):
            with self._lock:
                self._track_degraded(event)
                self._seq += 1
                self._events.append(
                    {
                        "seq": self._seq,
                        "ts": round(event.ts, 3),
                        "kind": event.kind.value,
                        "executor_id": one_line(event.executor_id, 64),
                        "host": one_line(event.host, 64),
                        "instance_id": one_line(event.instance_id, 64),
                        "detail": one_line(event.detail, 300),
                    }
                )

    def _track_degraded(self, event: ExecutorEvent) -> None:
        executor_id = one_line(event.executor_id, 64)
        if event.kind.value == "DEGRADED":
            if executor_id in self._degraded or len(self._degraded) < self._max_tracked:
                self._degraded[executor_id] = one_line(event.detail, 300)
        elif event.kind.value in ("RECOVERED", "UNREGISTERED", "SPARK_REMOVED", "SPARK_LOST"):
            self._degraded.pop(executor_id, None)

    def executors_json(self) -> dict[str, Any]:
        """``/api/executors``: the RM's table now, with health and RTT history per executor."""
        from spark_plugin.tools.views import executor_rows

        now = self._clock.time()
        infos = self._executors()
        rows = executor_rows(infos, now)
        registered = {one_line(e.executor_id, 64): e.registered_at for e in infos}
        since = now - self._window_s
        with self._lock:
            history = {eid: [p for p in series if p[0] >= since] for eid, series in self._rtts.items()}
            degraded = dict(self._degraded)
        for row in rows:
            age = row["heartbeat_age_s"]
            if age is None and row["state"] == "RUNNING" and registered.get(row["executor_id"]):
                age = round(max(0.0, now - registered[row["executor_id"]]), 3)  # none answered yet
            row["age_s"] = age
            row["degraded"] = degraded.get(row["executor_id"])  # the evidence, or None
            row["health"] = health(row["state"], age, self.timeout_s, row["degraded"] is not None)
            row["rtt_history"] = _thin(history.get(row["executor_id"], []), MAX_POINTS_SENT)
        return {
            "now": round(now, 3),
            "app_id": self._app_id(),
            "rm_address": self._rm_address,
            "interval_s": self.interval_s,
            "timeout_s": self.timeout_s,
            "rtt_window_s": self._window_s,
            "executors": rows,
        }

    def events_json(self, after: int = 0) -> dict[str, Any]:
        """``/api/events``: the kept lifecycle events with ``seq`` above ``after``, oldest first."""
        with self._lock:
            events = [e for e in self._events if e["seq"] > after]
            last = self._seq
        return {"now": round(self._clock.time(), 3), "last_seq": last, "events": events}


class LivePage:
    """The page's HTTP server, on its own thread and loop; ``start`` returns its ``host:port``."""

    def __init__(
        self,
        view: LiveView,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_connection_s: float = MAX_CONNECTION_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.view = view
        self._ssl = ssl_context
        self._max_connections = max_connections
        self._max_connection_s = max_connection_s
        self._token = token
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._address: tuple[str, int] | None = None
        self._cookie = ""
        self._first_seen: dict[object, float] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port/``, without the token: what the SparkConf may show."""
        if self._address is None:
            raise RuntimeError("the live page is not started")
        host, port = self._address
        scheme = "http" if self._ssl is None else "https"
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/"

    @property
    def url_with_token(self) -> str:
        return f"{self.url}?token={self._token}"

    def start(self, timeout_s: float = 10.0) -> str:
        """Bind and serve; returns ``host:port``. Raises ``OSError`` if the port cannot be bound."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="arrowbeat-live-page", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), loop).result(timeout_s)
        except BaseException:
            self.stop()
            raise
        assert self._address is not None
        return f"{self._address[0]}:{self._address[1]}"

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and end the thread; idempotent."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        if self._sweeper is not None:
            loop.call_soon_threadsafe(self._sweeper.cancel)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            try:
                asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout_s)
            except Exception as exc:
                log.warning("stopping the live page: %r", exc)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout_s)
        if not loop.is_running():
            loop.close()

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=4096, middlewares=[self._make_guard()])
        app.router.add_get("/", self._page)
        app.router.add_get("/api/executors", self._executors)
        app.router.add_get("/api/events", self._events)
        app.router.add_get("/static/{name}", self._static)
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=KEEPALIVE_S,
            max_line_size=4096,
            max_field_size=4096,
            max_headers=32,
            logger=_HTTP_LOG,
        )
        await runner.setup()
        self._runner = runner
        sock = socket.create_server(
            (self._host, self._port),
            family=socket.AF_INET6 if ":" in self._host else socket.AF_INET,
            backlog=64,
        )
        bound, port = sock.getsockname()[:2]
        try:
            await web.SockSite(runner, sock, ssl_context=self._ssl).start()
        except BaseException:
            sock.close()
            raise
        # The name it was asked to bind (the driver's host name: what a certificate names and
        # users can reach), or the address bound for a wildcard.
        self._address = (self._host if self._host not in ("", "0.0.0.0", "::") else bound, port)
        self._cookie = f"arrowbeat_page_{port}"  # cookies ignore ports: one per page on a host
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep(runner))

    async def _sweep(self, runner: web.AppRunner) -> None:
        """Close connections that stay too long (a client sending a request byte by byte) and the
        newest beyond ``max_connections``: the page's own bound on what a peer can hold."""
        loop = asyncio.get_running_loop()
        while self._runner is runner and runner.server is not None:
            now = loop.time()
            connections = runner.server.connections
            alive = set(connections)
            self._first_seen = {c: t for c, t in self._first_seen.items() if c in alive}
            for conn in connections:
                self._first_seen.setdefault(conn, now)
            newest = sorted(connections, key=self._first_seen.__getitem__, reverse=True)
            excess = newest[: max(0, len(newest) - self._max_connections)]
            for conn in connections:
                if conn in excess or now - self._first_seen[conn] > self._max_connection_s:
                    transport = conn.transport
                    if transport is not None:
                        transport.close()
            await asyncio.sleep(min(1.0, self._max_connection_s / 4))

    def _authorised(self, request: web.Request) -> bool:
        offered = request.query.get("token") or request.cookies.get(self._cookie) or ""
        return hmac.compare_digest(offered.encode(), self._token.encode())

    def _make_guard(self) -> Any:
        """Every answer gets the security headers; only an authorised GET reaches a handler."""
        from aiohttp import web

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method != "GET" or not self._authorised(request):
                response: web.StreamResponse = web.Response(
                    status=401 if request.method == "GET" else 405,
                    text="arrowbeat live page: open the URL with ?token=... that the driver's log prints\n",
                )
            else:
                try:
                    response = await handler(request)
                except web.HTTPException as exc:
                    response = web.Response(status=exc.status, text=f"{exc.reason}\n")
            response.headers.update(_HEADERS)
            return response

        return guard

    async def _page(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        if "token" in request.query:  # first visit: keep it in a cookie, take it out of the URL
            response = web.Response(status=303, headers={"Location": "/"})
            response.set_cookie(
                self._cookie,
                self._token,
                httponly=True,
                samesite="Strict",
                path="/",
                secure=self._ssl is not None,
            )
            return response
        return web.Response(body=(WEB / "live.html").read_bytes(), content_type="text/html")

    async def _executors(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        return web.json_response(self.view.executors_json())

    async def _events(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        try:
            after = int(request.query.get("after", "0"))
        except ValueError:
            raise web.HTTPBadRequest(reason="after must be an integer") from None
        return web.json_response(self.view.events_json(after))

    async def _static(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound(reason="no such file")
        return web.Response(body=(WEB / name).read_bytes(), content_type=STATIC[name])


def start_live_page(
    secret: str,
    executors: Callable[[], list[ExecutorInfo]],
    subscribe: Callable[[Callable[[object], None]], None],
    *,
    host: str,
    port: int,
    interval_s: float,
    timeout_s: float,
    app_id: Callable[[], str],
    rm_address: str,
    ssl_context: ssl.SSLContext | None = None,
) -> LivePage | None:
    """The driver's one call: the view subscribed, the page served, its URL logged; None (and
    one ERROR line) if the port cannot be bound: the RM and the application run on without it."""
    view = LiveView(executors, interval_s, timeout_s, app_id=app_id, rm_address=rm_address)
    page = LivePage(view, page_token(secret), host, port, ssl_context=ssl_context)
    try:
        page.start()
    except Exception as exc:
        log.error("live page off: cannot serve on %s:%d: %s", host, port, exc)
        return None
    subscribe(view)
    log.info("arrowbeat live page: %s", page.url_with_token)
    return page
