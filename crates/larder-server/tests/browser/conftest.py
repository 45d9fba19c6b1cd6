"""Fixtures for the status page's browser tests: a real `larder serve` (the binary cargo
builds, or $LARDER_BIN) on loopback ports of its own, load for it over HTTP and memcached's
protocol, and headless Debian Chromium driven by Selenium through Debian's chromedriver.

Both browser binaries are named explicitly, so Selenium Manager never looks for (or downloads)
a browser or a driver; scripts/install-browser-deps.sh installs them. A missing one fails the
tests loudly: they are never skipped."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[4]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH, HEIGHT = 1400, 1000
TEST_SECONDS = 120

# Selenium Manager is not to be asked for anything, even if a path above went missing.
os.environ.setdefault("SE_OFFLINE", "true")
os.environ.setdefault("SE_AVOID_STATS", "true")


def larder_bin() -> str:
    b = os.environ.get("LARDER_BIN") or str(ROOT / "target" / "debug" / "larder")
    if not os.path.isabs(b):
        b = str(ROOT / b)
    if not os.path.exists(b):
        pytest.fail(f"no larder binary at {b}: build it with `cargo build -p larder-server`")
    return b


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.05) -> Any:
    """Polls `check` until it returns something truthy; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except Exception as e:  # a stale element or a refused connection: try again
            last = e
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(every)


class Server:
    """A `larder serve` on a fixed pair of loopback ports and a data directory, which can be
    stopped (SIGTERM) and started again on both."""

    def __init__(self, base: Path, token: Optional[str] = None) -> None:
        self.base = base
        self.data = base / "data"
        self.port = free_port()
        self.mc_port = free_port()
        self.token = token
        self.token_file: Optional[Path] = None
        if token is not None:
            self.token_file = base / "token"
            self.token_file.write_text(token + "\n")
        self.proc: "Optional[subprocess.Popen[bytes]]" = None
        self.runs = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def origin(self) -> str:
        return self.url

    def args(self) -> List[str]:
        a = [
            larder_bin(), "serve",
            "--data-dir", str(self.data),
            "--listen", f"127.0.0.1:{self.port}",
            "--memcache-listen", f"127.0.0.1:{self.mc_port}",
            # a small ring, so that a few seconds of load fill several volumes and turn it
            "--volume-size", "2MiB", "--volume-count", "8",
            "--memory-capacity", "2MiB",
            "--max-body-memory", "64MiB",
            "--fsync", "never",
        ]
        if self.token_file is not None:
            a += ["--auth-token", str(self.token_file)]
        return a

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None
        self.runs += 1
        log = open(self.base / f"server-{self.runs}.log", "wb")
        self.proc = subprocess.Popen(self.args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"larder exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.request("GET", "/_larder/health", auth=False)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            pytest.fail(f"larder did not become healthy in 30 s:\n{self.log_tail()}")
        # Keep traces of requests slower than 3 ms, so that the slow panel has some to show.
        status, body = self.request("POST", "/_larder/slow?threshold=3ms")
        assert status == 200, body

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                pytest.fail("larder did not stop within 20 s of SIGTERM")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self) -> str:
        logs = sorted(self.base.glob("server-*.log"))
        return logs[-1].read_text(errors="replace")[-4000:] if logs else ""

    def request(self, method: str, path: str, body: Optional[bytes] = None, auth: bool = True,
                timeout: float = 5) -> "tuple[int, bytes]":
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if auth and self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stats(self) -> Dict[str, Any]:
        status, body = self.request("GET", "/_larder/stats")
        assert status == 200, body
        return json.loads(body)


class Load:
    """PUTs and GETs over HTTP (keep-alive) and memcached `set`/`get` over a raw socket, from a
    background thread, until stopped (or 120 s at most)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, name="load", daemon=True)
        self.error: Optional[BaseException] = None
        self.requests = 0

    def __enter__(self) -> "Load":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the load thread did not stop"

    def _run(self) -> None:
        import http.client

        rng = random.Random(7)
        headers = {"Authorization": f"Bearer {self.server.token}"} if self.server.token else {}
        conn: Optional[http.client.HTTPConnection] = None
        mc: Optional[socket.socket] = None
        mcf: Any = None
        deadline = time.monotonic() + 120
        i = 0
        while not self.stop_flag.is_set() and time.monotonic() < deadline:
            i += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=5)
                if mc is None:
                    mc = socket.create_connection(("127.0.0.1", self.server.mc_port), timeout=5)
                    mcf = mc.makefile("rb")
                    if self.server.token:
                        # memcached's -Y login, as larder takes it: a first `set` of "user token"
                        cred = b"page " + self.server.token.encode()
                        mc.sendall(b"set auth 0 0 %d\r\n%s\r\n" % (len(cred), cred))
                        line = mcf.readline()
                        assert line == b"STORED\r\n", f"memcached login: {line!r}"
                # a few hot keys, a long tail, and now and then a large value
                hot = rng.random() < 0.6
                k = f"page/{rng.randrange(8) if hot else rng.randrange(400)}"
                if i % 4 == 0:
                    size = 256 * 1024 if i % 97 == 0 else rng.choice((512, 2048, 8192, 24000))
                    conn.request("PUT", "/" + k, body=os.urandom(16) * (size // 16), headers=headers)
                elif i % 11 == 0:
                    conn.request("GET", f"/missing/{i}", headers=headers)
                else:
                    conn.request("GET", "/" + k, headers=headers)
                r = conn.getresponse()
                r.read()
                self.requests += 1
                if i % 3 == 0:
                    mk = f"mc:{rng.randrange(8) if hot else rng.randrange(200)}"
                    if i % 9 == 0:
                        v = b"v" * rng.choice((64, 1024, 4096))
                        mc.sendall(b"set %s 0 0 %d\r\n%s\r\n" % (mk.encode(), len(v), v))
                        line = mcf.readline()
                        assert line == b"STORED\r\n", line
                    else:
                        mc.sendall(b"get %s\r\n" % mk.encode())
                        while True:
                            line = mcf.readline()
                            if not line:
                                raise ConnectionError("memcached door closed")
                            if line == b"END\r\n":
                                break
                            if line.startswith(b"VALUE "):
                                n = int(line.split()[3])
                                mcf.read(n + 2)
                            else:
                                raise AssertionError(f"memcached answered {line!r}")
                    self.requests += 1
            except (OSError, http.client.HTTPException):
                # the server is going away or coming back: reconnect after a pause
                close_all(conn, mcf, mc)
                conn, mc, mcf = None, None, None
                time.sleep(0.1)
            except BaseException as e:  # an assertion: surface it from the test
                self.error = e
                return
            time.sleep(0.002)
        close_all(conn, mcf, mc)


def close_all(*conns: Any) -> None:
    """Closes what is open of a load thread's connections, whatever state they are in."""
    for c in conns:
        try:
            if c is not None:
                c.close()
        except OSError:
            pass


@pytest.fixture(autouse=True)
def time_limit() -> Iterator[None]:
    """Each test, its servers and its browser included, ends within TEST_SECONDS."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the test took longer than {TEST_SECONDS} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TEST_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers a test module needs, by fixture (two conftest.py files in a run would make
    `import conftest` ambiguous)."""
    return SimpleNamespace(root=ROOT, wait_for=wait_for, Load=Load)


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    made: List[Server] = []

    def make(token: Optional[str] = None) -> Server:
        s = Server(tmp_path, token)
        made.append(s)
        s.start()
        return s

    yield make
    for s in made:
        try:
            s.stop()
        finally:
            s.kill()


class Browser:
    """A Selenium-driven headless Chromium, with the browser's console and the DevTools
    network events it logged gathered as the test goes (reading a log empties it)."""

    def __init__(self) -> None:
        for path, what in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromedriver")):
            if not os.access(path, os.X_OK):
                pytest.fail(f"{what} is missing at {path}: run scripts/install-browser-deps.sh")
        try:
            from selenium import webdriver
            from selenium.webdriver.chrome.options import Options
            from selenium.webdriver.chrome.service import Service
        except ImportError:
            pytest.fail("selenium is not installed in this Python: run scripts/install-browser-deps.sh")
        opts = Options()
        opts.binary_location = CHROMIUM
        for a in (
            "--headless=new", "--no-sandbox", f"--window-size={WIDTH},{HEIGHT}",
            "--disable-gpu", "--disable-dev-shm-usage", "--disable-extensions",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--no-first-run", "--no-default-browser-check",
            "--force-device-scale-factor=1", "--hide-scrollbars", "--lang=en-US",
        ):
            opts.add_argument(a)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
        service = Service(executable_path=CHROMEDRIVER, log_output=subprocess.DEVNULL)
        self.driver = webdriver.Chrome(service=service, options=opts)
        self.driver.set_window_size(WIDTH, HEIGHT)
        # The window's frame takes some of its height, even headless: grow it so that the page
        # itself (and so the screenshot) is WIDTH x HEIGHT.
        inner = self.driver.execute_script("return [window.innerWidth, window.innerHeight];")
        if inner != [WIDTH, HEIGHT]:
            self.driver.set_window_size(2 * WIDTH - inner[0], 2 * HEIGHT - inner[1])
        self.driver.set_page_load_timeout(15)
        self.console: List[Dict[str, Any]] = []
        self.requests: List[str] = []

    def gather(self) -> None:
        self.console += self.driver.get_log("browser")
        for e in self.driver.get_log("performance"):
            m = json.loads(e["message"])["message"]
            if m.get("method") == "Network.requestWillBeSent":
                self.requests.append(m["params"]["request"]["url"])

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def text(self, element_id: str) -> Optional[str]:
        return self.js("const e = document.getElementById(arguments[0]); return e ? e.textContent : null;", element_id)

    def ready(self) -> Optional[str]:
        return self.js("return document.body ? document.body.dataset.ready : null;")

    def close(self) -> None:
        self.driver.quit()


@pytest.fixture
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()

