"""``fslab tui --web``: the dashboard served over HTTP by a real ``fslab``
process and opened in a real headless Chromium through Playwright; the guard
(token, host name, origin) checked with plain HTTP requests."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import pytest

from .conftest import BUILTIN_PLUGINS
from .runs_helpers import fslab
from .test_tui_helpers import complete_config, history

pytest.importorskip("textual_serve")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# Headless Chromium in a sandbox without network: no background connections, no GPU.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def finished_run(runs) -> str:
    """A completed run recorded through fslab's own run store and event log, as
    a worker records one: created queued, started, its events (and summary),
    results.json, the end event, completed. Returns its id."""
    from fslab.core.eventlog import EventLog
    from fslab.core.files import atomic_write_json
    from fslab.core.runstore import create_run

    run = create_run(runs, "nca", complete_config())
    run.write_status(state="running", started=time.time(), pid=os.getpid())
    log = EventLog(run, echo=False)
    for event in history():
        log.write(event["event"], **{k: v for k, v in event.items() if k not in ("event", "time")})
    test = {f"{e['shots']}-shot": {"accuracy": e["accuracy"], "ci95": e["ci95"]}
            for e in history() if e.get("split") == "test"}
    atomic_write_json(run.path / "results.json", {"run": run.id, "method": "nca", "test": test})
    log.write("end", results=test)
    log.close()
    run.write_status(state="completed", ended=time.time(), exit_code=0)
    assert run.state() == "completed"
    return run.id


@pytest.fixture
def served(tmp_path):
    """A project with one completed run, and a way to start the web dashboard
    on it; yields (start, run id). Every server still running at the end is
    stopped as Ctrl+C would stop it."""
    project = tmp_path / "project"
    run_id = finished_run(project / "runs")
    env = {**os.environ, "FSLAB_PLUGINS": BUILTIN_PLUGINS}
    env.pop("FSLAB_CONFIG", None)
    started = []

    def start(*options: str) -> tuple[str, int, subprocess.Popen]:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "fslab", "tui", "--web", "--port", str(port), *options],
                                   cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        started.append(process)
        first = process.stdout.readline()
        assert first.startswith("fslab dashboard on http://"), first + process.stdout.read()
        return first.split(" on ", 1)[1].strip(), port, process

    yield start, run_id
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=20)


def status_of(url: str, **headers: str) -> int:
    request = urllib.request.Request(url, headers={k.replace("_", "-"): v for k, v in headers.items()})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.slow
def test_a_browser_shows_the_runs_table_and_a_request_without_the_token_is_refused(served):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no Chromium here: install Debian's chromium package (.ci/run does)")
    start, run_id = served
    url, port, server = start("--token", "s3cret-token")
    assert url == f"http://127.0.0.1:{port}/?token=s3cret-token"
    assert status_of(f"http://127.0.0.1:{port}/") == 403
    assert status_of(f"http://127.0.0.1:{port}/?token=wrong-token") == 403
    assert status_of(url) == 200

    frames: list[bytes] = []
    # Opened as localhost, the name at the near end of an SSH tunnel, while the server printed 127.0.0.1:
    # the page's scripts and websocket must follow the name the browser used, and the cookie with them.
    tunnelled = url.replace("127.0.0.1", "localhost")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900})
            page.on("websocket", lambda ws: ws.on(
                "framereceived", lambda data: frames.append(data if isinstance(data, bytes) else data.encode())))
            page.goto(tunnelled)
            page.wait_for_selector("body.-first-byte", timeout=30_000)  # the page's terminal got the screen
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # the runs table, as the server streams it to the page
                shown = b"".join(frames)
                if run_id.encode() in shown and b"completed" in shown and b"71.07" in shown:
                    break
                page.wait_for_timeout(200)
            assert f"ws://localhost:{port}/ws" in page.content()
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
        finally:
            browser.close()
    shown = b"".join(frames)
    assert run_id.encode() in shown and b"completed" in shown and b"71.07" in shown  # id, state, 5-shot test
    assert cookies[f"fslab_token_{port}"] == "s3cret-token"  # what the page's websocket carried

    stopped = time.monotonic()
    os.killpg(server.pid, signal.SIGINT)  # Ctrl+C in its terminal
    assert server.wait(timeout=20) == 0
    assert time.monotonic() - stopped < 10
    assert "Traceback" not in server.stdout.read()



def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            found.append(int(entry))
    return found


@contextlib.contextmanager
def a_tab_open(start, *, needs_proc: bool = False):
    """A server started by ``start`` and one Chromium tab whose dashboard runs: yields
    (server, page); the browser is closed after the block. Skipped without Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip("no Chromium here: install Debian's chromium package (.ci/run does)")
    if needs_proc and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    url, _, server = start()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            frames: list[bytes] = []
            page.on("websocket", lambda ws: ws.on(
                "framereceived", lambda data: frames.append(data if isinstance(data, bytes) else data.encode())))
            page.goto(url)
            page.wait_for_selector("body.-first-byte", timeout=30_000)  # a dashboard runs for the tab
            # and has mounted its screen: its header's title is drawn once the header is there (a Ctrl+C a
            # moment earlier met Textual's Header mounting, whose NoMatches traceback went to the server's output)
            deadline = time.monotonic() + 30
            while b"fslab" not in b"".join(frames) and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            yield server, page
        finally:
            browser.close()


@pytest.mark.slow
def test_a_dashboard_quits_when_its_server_is_killed(served):
    """kill -9 (or the out-of-memory killer) on the server: the open tab's
    dashboard quits within seconds, rather than polling the store forever.
    Ctrl+C reaches the server alone, which ends its dashboards itself."""
    start, _ = served
    with a_tab_open(start, needs_proc=True) as (server, _):
        dashboards = children_of(server.pid)
        assert len(dashboards) == 1
        with open(f"/proc/{dashboards[0]}/cmdline", "rb") as cmdline:
            assert b"fslab\0tui\0--tick" in cmdline.read()  # the dashboard itself, no shell in between
        # out of the terminal's process group: Ctrl+C there is the server's to handle (a dashboard hit by it
        # while its tab closed printed a traceback from threading._shutdown into the server's output)
        assert os.getpgid(dashboards[0]) != os.getpgid(server.pid)
        server.kill()
        server.wait(timeout=10)
        deadline = time.monotonic() + 15
        while os.path.exists(f"/proc/{dashboards[0]}") and time.monotonic() < deadline:
            time.sleep(0.1)
        alive = os.path.exists(f"/proc/{dashboards[0]}")
    if alive:
        os.kill(dashboards[0], signal.SIGKILL)
    assert not alive


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_dashboards_quit_still_exits_with_0(served):
    start, _ = served
    with a_tab_open(start) as (server, _):
        os.killpg(server.pid, signal.SIGINT)
        time.sleep(0.3)
        os.killpg(server.pid, signal.SIGINT)  # impatient, while that dashboard quits
        assert server.wait(timeout=20) == 0
    assert "Traceback" not in server.stdout.read()


@pytest.mark.slow
def test_a_font_size_that_is_no_ascii_number_is_the_default_not_a_server_error(served):
    """?fontsize=² (str.isdigit() takes it, int() does not) or of 5,000 digits was a 500 Internal Server Error."""
    start, _ = served
    url, port, _ = start()
    for size in ("%C2%B2", "9" * 5000, "x", "24"):
        assert status_of(f"{url}?fontsize={size}") == 200, size


def test_off_loopback_a_token_is_made_and_required(served):
    start, _ = served
    url, port, _ = start("--host", "0.0.0.0")
    token = re.fullmatch(r"http://[^/]+:\d+/\?token=([A-Za-z0-9_-]{16,})", url).group(1)
    local = f"http://127.0.0.1:{port}"
    cookie = f"fslab_token_{port}={token}"
    assert status_of(local + "/") == 403
    assert status_of(local + "/ws") == 403
    assert status_of(local + "/static/js/textual.js") == 403
    assert status_of(local + "/static/js/textual.js", Cookie=f"fslab_token_{port + 1}={token}") == 403
    assert status_of(f"{local}/?token={token}") == 200
    assert status_of(local + "/static/js/textual.js", Cookie=cookie) == 200
    # with the token, any name for this machine will do (a host name, an IP address)
    assert status_of(f"{local}/?token={token}", Host=f"gpu-box.example:{port}") == 200


@pytest.mark.slow
def test_without_a_token_only_localhost_names_and_pages_are_answered(served):
    start, _ = served
    url, port, _ = start()
    assert url == f"http://127.0.0.1:{port}/"
    assert status_of(url) == 200
    assert status_of(url, Host=f"localhost:{port}") == 200
    # a web page's own domain name pointed at 127.0.0.1 (DNS rebinding)
    assert status_of(url, Host=f"attacker.example:{port}") == 403
    # a websocket opened by a page of another site, or of another origin than the one it asks
    assert websocket_status(port, Origin="http://attacker.example") == 403
    assert websocket_status(port, Origin=f"http://localhost:{port}") == 403
    assert websocket_status(port, Origin=f"http://127.0.0.1:{port}") == 101



def test_a_closed_terminal_stops_the_server_as_ctrl_c_does(served):
    """SIGHUP (its terminal or SSH session closed) killed the server outright, exit -1, without
    stopping the dashboards it started; it now stops as after Ctrl+C."""
    start, _ = served
    url, _, server = start()
    assert status_of(url) == 200
    os.kill(server.pid, signal.SIGHUP)
    assert server.wait(timeout=20) == 0
    assert "Traceback" not in server.stdout.read()


@pytest.mark.slow
def test_an_ipv6_host_may_be_written_in_brackets_as_in_a_url(served):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    start, _ = served
    url, port, server = start("--host", "[::1]")  # was refused: "cannot listen on [::1]:...: Name or service not known"
    assert url == f"http://[::1]:{port}/"
    assert status_of(url) == 200
    # the tunnel's far end is the address it listens on: localhost may name 127.0.0.1 alone there
    assert server.stdout.readline().startswith(f"from another machine: ssh -L {port}:[::1]:{port} ")


def websocket_status(port: int, **headers: str) -> int:
    """The status of a websocket handshake on /ws (the connection is closed at once)."""
    lines = ["GET /ws HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: Upgrade", "Upgrade: websocket",
             "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
             *(f"{name}: {value}" for name, value in headers.items())]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(connection.makefile("rb").readline().split()[1])


def test_bad_web_options_are_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = fslab("tui", "--web", "--port", str(port), cwd=tmp_path)
    assert in_use.returncode == 2
    assert in_use.stderr.strip() == (f"error: cannot listen on 127.0.0.1:{port}: Address already in use; "
                                     f"choose another --port (or --host)")
    port = free_port()
    for options, expected in (
            (["--port", "70000"], "error: --port must be from 1 to 65535, got 70000"),
            (["--token", "short"], "error: --token must be at least 8 printable characters without spaces"),
            (["--host", "192.0.2.1", "--port", str(port)],  # TEST-NET-1: an address no machine here has
             f"error: cannot listen on 192.0.2.1:{port}: Cannot assign requested address; "
             f"give --host an address of this machine")):
        result = fslab("tui", "--web", *options, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.strip() == expected, result.stderr


def test_a_broken_fslab_toml_is_said_before_anything_listens(tmp_path):
    (tmp_path / "fslab.toml").write_text("[project\n")
    result = fslab("tui", "--web", "--port", str(free_port()), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: fslab.toml:1:") and len(result.stderr.strip().splitlines()) == 1


def fslab_in_python(argv: list[str], *, textual_serve: bool) -> subprocess.CompletedProcess:
    """``fslab ARGV`` in a fresh Python, with textual-serve hidden (as if not
    installed) or, when not, stopped right where the server would start
    listening; it prints the heavy modules imported by then."""
    code = textwrap.dedent(f"""
        import sys
        if {textual_serve!r}:
            import fslab.tui.web
            fslab.tui.web.DashboardServer.serve = lambda self: print("SERVING", self.command)
        else:
            sys.modules["textual_serve"] = None
        from fslab.cli import main
        sys.argv = ["fslab", *{argv!r}]
        try:
            main()
        finally:
            print("HEAVY", [m for m in ("torch", "numpy") if m in sys.modules])
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=os.getcwd(), capture_output=True, text=True)


def test_tui_web_imports_no_torch_and_serves_the_same_dashboard(project):
    result = fslab_in_python(["tui", "--web", "--port", str(free_port()), "--tick", "0.5"], textual_serve=True)
    assert result.returncode == 0, result.stderr
    assert f"SERVING exec {sys.executable} -m fslab tui --tick 0.5" in result.stdout
    assert "HEAVY []" in result.stdout


def test_without_textual_serve_it_says_what_to_install(project):
    result = fslab_in_python(["tui", "--web"], textual_serve=False)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: fslab tui --web needs textual-serve: pip install 'fslab[web]'"
