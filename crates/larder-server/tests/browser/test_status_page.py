"""The status page at /_larder/ in a real (headless) Chromium: it draws live figures under
load without a console error or a request to another host, its door counts agree with
/_larder/stats, it follows a restart of the server without a reload, and it asks for the
bearer token when the server wants one, showing nothing until it has the right one.

Run: scripts/install-python-deps.sh && scripts/install-browser-deps.sh &&
     target/python/bin/pytest -q crates/larder-server/tests/browser"""

from __future__ import annotations

import re
import time
from typing import Any, Optional

from selenium.webdriver.common.by import By

# The fixtures (conftest.py): `browser` (headless Chromium), `make_server` (a larder serve on
# loopback ports of its own) and `kit` (wait_for, Load: the background load, root).
Browser = Any
Server = Any


def rate(b: Browser) -> float:
    t = (b.text("rate-total") or "").strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kMG]?)", t)
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def hits_http(b: Browser) -> Optional[str]:
    return b.text("hits-http")


def open_page(b: Browser, server: Server) -> None:
    b.driver.get(server.url + "/_larder/")


def test_live_page_under_load(browser: Browser, make_server: Any, kit: Any) -> None:
    wait_for, Load = kit.wait_for, kit.Load
    screenshot = kit.root / "docs" / "img" / "status-page.png"
    server = make_server()
    load = Load(server).__enter__()
    began = time.monotonic()
    try:
        open_page(browser, server)
        opened = time.monotonic()
        wait_for("body data-ready=1", lambda: browser.ready() == "1", 5)
        # within 5 s of the page's load, not 5 s more
        wait_for("a non-zero #rate-total", lambda: rate(browser) > 0, max(0.1, 5 - (time.monotonic() - opened)))
        # charts with several seconds in them before the picture
        time.sleep(max(0.0, 8 - (time.monotonic() - began)))
        assert load.error is None, load.error
        assert rate(browser) > 0
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        assert browser.driver.save_screenshot(str(screenshot)), "the screenshot was not saved"
        # what the page shows besides the rate: the ring's segments, slow and hot keys
        assert browser.js("return document.querySelectorAll('#ring svg path.seg-bg').length") == 8
        assert "http" in (browser.text("hot") or "")
    finally:
        load.stop()
    assert load.error is None, load.error
    assert load.requests > 100, f"only {load.requests} requests of load"

    # once the load stops the page's count catches up with the server's within a refresh
    def agree() -> bool:
        want = str(server.stats()["doors"]["http"]["hit"])
        got = hits_http(browser)
        return got == want and want != "0"

    wait_for("#hits-http to match /_larder/stats doors.http.hit", agree, 3)
    assert re.fullmatch(r"[0-9]+", hits_http(browser) or ""), hits_http(browser)
    assert re.fullmatch(r"[0-9]+", browser.text("hits-memcache") or ""), browser.text("hits-memcache")

    browser.gather()
    noisy = [e for e in browser.console if e.get("level") in ("SEVERE", "WARNING")]
    assert not noisy, f"console errors or warnings: {noisy}"
    assert browser.requests, "no network request was logged"
    foreign = [u for u in browser.requests if not (u.startswith(server.origin + "/") or u.startswith("data:"))]
    assert not foreign, f"requests to other origins: {foreign}"
    assert any("/_larder/series?since=" in u for u in browser.requests)
    assert any(u.startswith(server.origin + "/_larder/hot?n=10") for u in browser.requests)
    assert any(u.startswith(server.origin + "/_larder/slow?n=10") for u in browser.requests)


def test_page_follows_a_restart(browser: Browser, make_server: Any, kit: Any) -> None:
    wait_for, Load = kit.wait_for, kit.Load
    server = make_server()
    with Load(server) as load:
        open_page(browser, server)
        opened = time.monotonic()
        wait_for("body data-ready=1", lambda: browser.ready() == "1", 5)
        # within 5 s of the page's load, not 5 s more
        wait_for("a non-zero #rate-total", lambda: rate(browser) > 0, max(0.1, 5 - (time.monotonic() - opened)))
        assert load.error is None, load.error
    browser.js("window.__larderSamePage = 1;")
    first_run = browser.js("return document.body.dataset.started;")
    assert first_run == str(server.stats()["started_ms"])

    server.stop()
    wait_for("#conn-state to say disconnected", lambda: "disconnected" in (browser.text("conn-state") or ""), 5)
    assert browser.ready() == "0"

    server.start()  # the same port and data directory
    with Load(server) as load:
        wait_for("#conn-state back to connected", lambda: browser.text("conn-state") == "connected", 10)
        wait_for("body data-ready=1 again", lambda: browser.ready() == "1", 5)
        wait_for("a new non-zero #rate-total", lambda: rate(browser) > 0, 8)
        assert load.error is None, load.error
    assert browser.js("return window.__larderSamePage;") == 1, "the page was reloaded"
    # the series started over with the new run: none of the old run's seconds are drawn
    stats = server.stats()
    assert browser.js("return document.body.dataset.started;") == str(stats["started_ms"]) != first_run
    points = int(browser.js("return document.body.dataset.points;"))
    assert 0 < points <= stats["uptime_seconds"] + 2, (points, stats["uptime_seconds"])

    # the counts are the new run's, not the old run's plus the new
    def agree() -> bool:
        return hits_http(browser) == str(server.stats()["doors"]["http"]["hit"])

    wait_for("#hits-http to match the restarted server's stats", agree, 3)


def test_token_form(browser: Browser, make_server: Any, kit: Any) -> None:
    wait_for, Load = kit.wait_for, kit.Load
    server = make_server(token="s3cret-token")
    with Load(server) as load:
        open_page(browser, server)
        form = wait_for("the token form", lambda: browser.driver.find_element(By.ID, "token-form").is_displayed(), 5)
        assert form
        assert browser.ready() == "0"
        assert not (hits_http(browser) or ""), "a figure is shown without the token"
        assert not re.search(r"[0-9]", browser.text("rate-total") or ""), browser.text("rate-total")
        assert not browser.driver.find_element(By.ID, "dash").is_displayed()

        def submit(token: str) -> None:
            field = browser.driver.find_element(By.ID, "token")
            field.clear()
            field.send_keys(token)
            browser.driver.find_element(By.ID, "token-submit").click()

        submit("wrong-token")
        wait_for("the form again, saying the token was refused",
                 lambda: browser.driver.find_element(By.ID, "token-form").is_displayed()
                 and "refused" in (browser.text("token-msg") or ""), 5)
        assert browser.ready() == "0"
        assert not (hits_http(browser) or "")

        browser.gather()
        seen = len(browser.console)
        submit(server.token or "")
        wait_for("body data-ready=1 with the right token", lambda: browser.ready() == "1", 5)
        assert not browser.driver.find_element(By.ID, "token-form").is_displayed()
        wait_for("#hits-http digits", lambda: re.fullmatch(r"[0-9]+", hits_http(browser) or ""), 3)
        assert browser.js("return sessionStorage.getItem('larder.token');") == server.token
        assert load.error is None, load.error

    def agree() -> bool:
        return hits_http(browser) == str(server.stats()["doors"]["http"]["hit"])

    wait_for("#hits-http to match /_larder/stats", agree, 3)
    # every data request carried the token: no 401 (nor any other error) once it was given
    browser.gather()
    late = [e for e in browser.console[seen:] if e.get("level") in ("SEVERE", "WARNING")]
    assert not late, f"console errors after the right token: {late}"
    assert any(u.startswith(server.origin + "/_larder/stats") for u in browser.requests)
