"""``fslab tui --web``: the dashboard served over HTTP by a real ``fslab``
process and opened in a real headless Chromium through Playwright; the token
guard checked with plain HTTP requests."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import fslab
from .test_tui_helpers import history, write_run

pytest.importorskip("textual_serve")

RUN_ID = "20261124-101500-nca-7f3a"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless Chromium in a sandbox without network: no background connections, no GPU.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def served(tmp_path):
    """A project with one completed run, and a way to start the web dashboard on it."""
    project = tmp_path / "project"
    (project / "runs").mkdir(parents=True)
    write_run(project / "runs", RUN_ID, events=history())
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    started = []

    def serve(*options: str) -> tuple[str, int]:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "fslab", "tui", "--web", "--port", str(port), *options],
                                   cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append(process)
        first = process.stdout.readline()
        assert first.startswith("fslab dashboard on http://"), first + process.stdout.read()
        return first.split(" on ", 1)[1].strip(), port

    yield serve
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def status_of(url: str, cookie: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.slow
def test_a_browser_shows_the_runs_table_and_a_request_without_the_token_is_refused(served):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("no Chromium here: install Debian's chromium package (.ci/run does)")
    url, port = served("--token", "s3cret-token")
    assert url == f"http://127.0.0.1:{port}/?token=s3cret-token"
    assert status_of(f"http://127.0.0.1:{port}/") == 403
    assert status_of(f"http://127.0.0.1:{port}/?token=wrong-token") == 403

    frames: list[bytes] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.on("websocket", lambda ws: ws.on(
                "framereceived", lambda data: frames.append(data if isinstance(data, bytes) else data.encode())))
            page.goto(url)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the dashboard's screen, as the server streams it to the page
                shown = b"".join(frames)
                if RUN_ID.encode() in shown and b"completed" in shown:
                    break
                page.wait_for_timeout(200)
            assert f"ws://127.0.0.1:{port}/ws" in page.content()  # the page's terminal talks to this server
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
        finally:
            browser.close()
    shown = b"".join(frames)
    assert RUN_ID.encode() in shown and b"completed" in shown and b"71.07" in shown  # its id, state, 5-shot test
    assert cookies["fslab_token"] == "s3cret-token"  # what the page's websocket carried


@pytest.mark.slow
def test_off_loopback_a_token_is_made_and_required(served):
    url, port = served("--host", "0.0.0.0")
    token = re.fullmatch(r"http://[^/]+:\d+/\?token=([A-Za-z0-9_-]{16,})", url).group(1)
    local = f"http://127.0.0.1:{port}"
    assert status_of(local + "/") == 403
    assert status_of(local + "/ws") == 403
    assert status_of(local + "/static/js/textual.js") == 403
    assert status_of(f"{local}/?token={token}") == 200
    assert status_of(local + "/static/js/textual.js", cookie=f"fslab_token={token}") == 200


def test_bad_web_options_are_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = fslab("tui", "--web", "--port", str(port), cwd=tmp_path)
    assert in_use.returncode == 2
    assert in_use.stderr.strip() == (f"error: cannot listen on 127.0.0.1:{port}: Address already in use; "
                                     f"choose another --port (or --host)")
    for options, expected in ((["--port", "70000"], "error: --port must be from 1 to 65535, got 70000"),
                              (["--token", "short"], "error: --token must be at least 8 printable characters "
                                                     "without spaces")):
        result = fslab("tui", "--web", *options, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.strip() == expected
