"""``fslab tui --web``: the same dashboard, served to a browser.

textual-serve runs ``fslab tui`` once per browser tab, in a child process
with the server's working directory and environment (so the same
``fslab.toml`` and run store), and relays its screen over a websocket. fslab
adds the guard: bound to loopback only this machine reaches the dashboard
(from elsewhere: an SSH tunnel; with other users on the machine: ``--token``);
bound to any other interface a token is required. The printed URL carries it (``/?token=...``); the first page
opened with it sets a cookie that the page's websocket and static files then
carry. Any request without the right token gets 403.

The page's own addresses (its scripts, its websocket) are built from the
address the browser used, so the page works however it was reached: by host
name, by IP address, or as ``localhost`` at the near end of a tunnel. Without a
token, only requests addressed to a loopback name are answered, so that a web
page elsewhere cannot reach the dashboard by pointing its own domain name at
127.0.0.1; and a websocket opened from a page of another origin is refused.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import os
import secrets
import shlex
import socket
import sys
import time
from urllib.parse import urlsplit

import aiohttp_jinja2
from aiohttp import hdrs, web
from textual_serve.server import Server

from fslab.core.text import ascii_whole
from fslab.execution.local import child_pids

LOOPBACK = ("localhost", "127.0.0.1", "::1")
STOP_WAIT_S = 5.0  # at Ctrl+C, how long the open dashboards get to quit


def is_loopback(host: str) -> bool:
    if host in LOOPBACK or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def public_host(host: str) -> str:
    """The name a browser uses for ``host``: this machine's name for a wildcard address."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


def url_host(host: str) -> str:
    """``host`` as it is written in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


def refused(reason: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=f"fslab dashboard: {reason}\n")


class DashboardServer(Server):
    """textual-serve's server, quiet, with fslab's guard in front of every
    route, page addresses taken from each request, and a prompt Ctrl+C."""

    def __init__(self, command: str, host: str, port: int, token: str | None) -> None:
        super().__init__(command, host=host, port=port, title="fslab",
                         public_url=f"http://{url_host(public_host(host))}:{port}")
        self.token = token
        self.cookie = f"fslab_token_{port}"  # per port: two dashboards on one machine keep their own
        self.sessions: set[asyncio.Task] = set()  # the websocket handlers, each driving one dashboard
        self.exiting = False

    def initialize_logging(self) -> None:  # requests are not news; errors still reach stderr
        import logging

        logging.basicConfig(level="WARNING", format="%(message)s")

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        if self.token is not None:
            given = request.query.get("token") or request.cookies.get(self.cookie) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise refused("this address needs the token that fslab tui --web printed (open the URL it printed)")
        elif not is_loopback(request.url.host or ""):
            raise refused("without a token this dashboard answers only to localhost or 127.0.0.1 "
                          "(through an SSH tunnel from another machine)")
        if request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
            origin = request.headers.get(hdrs.ORIGIN)
            if origin is not None and urlsplit(origin).netloc != request.host:
                raise refused(f"a page from {origin} may not open this dashboard")
            return await self._session(request, handler)
        response = await handler(request)
        if self.token is not None and "token" in request.query and isinstance(response, web.Response):
            response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict")
        return response

    async def _session(self, request: web.Request, handler):
        """One browser tab's dashboard, remembered so that Ctrl+C can end it."""
        task = asyncio.current_task()
        self.sessions.add(task)
        try:
            return await handler(request)
        finally:
            self.sessions.discard(task)

    @aiohttp_jinja2.template("app_index.html")
    async def handle_index(self, request: web.Request) -> dict:
        """textual-serve's page, its script and websocket addresses on the host the browser asked for."""
        site = f"{request.scheme}://{request.host}"
        websocket = ("wss" if request.scheme == "https" else "ws") + f"://{request.host}"
        size = request.query.get("fontsize", "16")
        return {
            "font_size": 16 if (points := ascii_whole(size, 3)) is None else points,
            "app_websocket_url": websocket + str(request.app.router["websocket"].url_for()),
            "config": {"static": {"url": site + "/static/"}},
            "application": {"name": self.title},
        }

    async def on_startup(self, app: web.Application) -> None:
        """Nothing to say yet: the URL is printed once the server listens (:meth:`serve`)."""

    async def on_shutdown(self, app: web.Application) -> None:
        """Ctrl+C: end every open dashboard now (textual-serve asks each to
        quit), waiting a few seconds at most, instead of waiting for the
        browser tabs to close."""
        sessions = list(self.sessions)
        for task in sessions:
            task.cancel()
        if sessions:
            await asyncio.wait(sessions, timeout=STOP_WAIT_S + 1)
        # textual-serve never waits for a dashboard's process: wait here until they are gone and let the
        # loop see their pipes close. A process transport still open when the loop closes is closed by the
        # garbage collector later, which then printed a traceback ("Event loop is closed") on Ctrl+C.
        deadline = time.monotonic() + STOP_WAIT_S
        while child_pids(os.getpid()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)

    def request_exit(self) -> None:
        """Ctrl+C (or SIGTERM): stop. Once only: a second Ctrl+C while the
        dashboards quit (a few seconds at most) made the server exit with 1
        halfway through."""
        if not self.exiting:
            self.exiting = True
            super().request_exit()

    def serve(self, debug: bool = False) -> None:
        """Listen until Ctrl+C (or SIGTERM, or SIGHUP), then stop the dashboards it started."""
        import signal

        self.debug = debug
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        # SIGHUP: its terminal or SSH session closed, which killed it without stopping its dashboards
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self.request_exit)
        web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                    shutdown_timeout=STOP_WAIT_S + 2, print=lambda *args: self.say_where())

    def say_where(self) -> None:
        query = f"?token={self.token}" if self.token else ""
        lines = [f"fslab dashboard on {self.public_url}/{query}"]
        if is_loopback(self.host):
            # the far end as the server listens: localhost may name 127.0.0.1 alone there, not ::1
            far = f"[{self.host}]" if ":" in self.host else "localhost"
            lines.append(f"from another machine: ssh -L {self.port}:{far}:{self.port} USER@{socket.gethostname()}, "
                         f"then open http://localhost:{self.port}/{query}")
        lines.append("Ctrl+C stops it")
        print("\n".join(lines), flush=True)


def dashboard_command(tick: float) -> str:
    """The command each browser tab runs: this Python's fslab, the same tick;
    exec'd, so the dashboard is the server's own child and sees it go."""
    return "exec " + shlex.join([sys.executable, "-m", "fslab", "tui", "--tick", repr(tick)])


def serve(host: str, port: int, token: str | None, tick: float) -> None:
    """Serve the dashboard until Ctrl+C. Off loopback a token is always
    required (one is made when none is given)."""
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(16)
    DashboardServer(dashboard_command(tick), host, port, token).serve()
