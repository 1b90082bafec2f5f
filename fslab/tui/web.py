"""``fslab tui --web``: the same dashboard, served to a browser.

textual-serve runs ``fslab tui`` once per browser tab, in a child process
with the server's working directory and environment (so the same
``fslab.toml`` and run store), and relays its screen over a websocket. fslab
adds the guard: bound to loopback the dashboard is as private as the machine
(reach it from elsewhere through an SSH tunnel); bound to any other interface a
token is required. The printed URL carries it (``/?token=...``); the first page
opened with it sets a cookie that the page's websocket and static files then
carry. Any request without the right token gets 403.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import shlex
import socket
import sys

from aiohttp import web
from textual_serve.server import Server

COOKIE = "fslab_token"
LOOPBACK = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_host(host: str) -> str:
    """The name a browser uses for ``host``: this machine's name for a wildcard address."""
    return socket.gethostname() if host in ("0.0.0.0", "::", "") else host


class DashboardServer(Server):
    """textual-serve's server, quiet, with fslab's token check in front of every route."""

    def __init__(self, command: str, host: str, port: int, token: str | None) -> None:
        shown = public_host(host)
        super().__init__(command, host=host, port=port, title="fslab",
                         public_url=f"http://{'[' + shown + ']' if ':' in shown else shown}:{port}")
        self.token = token

    def initialize_logging(self) -> None:  # requests are not news; errors still reach stderr
        import logging

        logging.basicConfig(level="WARNING", format="%(message)s")

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._check_token)
        return app

    @web.middleware
    async def _check_token(self, request: web.Request, handler):
        if self.token is not None:
            given = request.query.get("token") or request.cookies.get(COOKIE) or ""
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise web.HTTPForbidden(text="fslab dashboard: this address needs the token that "
                                             "fslab tui --web printed (open the URL it printed)\n")
        response = await handler(request)
        if self.token is not None and "token" in request.query and isinstance(response, web.Response):
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict")
        return response

    async def on_startup(self, app: web.Application) -> None:
        """Nothing to say yet: the URL is printed once the server listens (:meth:`serve`)."""

    def serve(self, debug: bool = False) -> None:
        """Listen until Ctrl+C (or SIGTERM), then stop the dashboards it started."""
        import asyncio
        import signal

        self.debug = debug
        self.initialize_logging()
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.request_exit)
        web.run_app(self._make_app(), host=self.host, port=self.port, handle_signals=False, loop=loop,
                    print=lambda *args: self.say_where())

    def say_where(self) -> None:
        url = self.public_url + "/" + (f"?token={self.token}" if self.token else "")
        lines = [f"fslab dashboard on {url}"]
        if is_loopback(self.host):
            lines.append(f"from another machine: ssh -L {self.port}:localhost:{self.port} USER@{socket.gethostname()}, "
                         f"then open http://localhost:{self.port}/" + (f"?token={self.token}" if self.token else ""))
        lines.append("Ctrl+C stops it")
        print("\n".join(lines), flush=True)


def serve(host: str, port: int, token: str | None, tick: float) -> None:
    """Serve the dashboard until Ctrl+C. Off loopback a token is always
    required (one is made when none is given)."""
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(16)
    command = shlex.join([sys.executable, "-m", "fslab", "tui", "--tick", str(tick)])
    DashboardServer(command, host, port, token).serve()
