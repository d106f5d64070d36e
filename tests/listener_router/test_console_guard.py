"""A console that refuses strangers, on a real ``chalk run`` (RabbitMQ) and in a real browser:
bound beyond loopback it does not start without a token (unless ``public = true``), and
warns either way; tokens too short or copied from the docs are refused; reads need the
token (a login form keeps it in the tab), ``/metrics`` needs none from loopback and takes a
bearer token from elsewhere; a Host not on the allow-list is refused; wrong tokens are
slowed down per client address; every response carries the security headers, and the page
runs no script but its own."""

from __future__ import annotations

import http.client
import re
import subprocess
import time
from pathlib import Path

import pytest
from listener_router_helpers import (
    free_port,
    start_service,
    stop_service,
    wait_for_log,
    wait_until,
    write_config,
    write_test_workflows,
)

from listener_router import push_records
from listener_router.watch._guard import EXAMPLE_TOKENS, MAKE_ONE

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.broker]

TOKEN = "the-controls-token-of-this-test"
READ = "the-read-token-of-this-test"
DOCS = Path(__file__).resolve().parents[2]


def _outside_address() -> str | None:
    """An address of this machine that is not loopback (None when it has none)."""
    done = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        address = line.split()[3].split("/")[0]
        if not address.startswith("127."):
            return address
    return None


def _request(port: int, path: str, *, host: str = "127.0.0.1", token: str | None = None,
             source: str = "127.0.0.1", header_host: str | None = None,
             method: str = "GET", body: str | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection(host, port, timeout=60, source_address=(source, 0))
    headers = {"Host": header_host or f"{host}:{port}"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return (response.status, {k.lower(): v for k, v in response.getheaders()},
                response.read().decode("utf-8", "replace"))
    finally:
        conn.close()


def _run(tmp_path: Path, broker_url: str, qname, name: str, **http: object):
    folder = write_test_workflows(tmp_path / "workflows")
    config = write_config(
        tmp_path / f"{name}.toml", db=f"sqlite:///{tmp_path / name}.db", broker=broker_url,
        workflows=folder, engine={"runner": "local"}, http=http, node={"name": name},
        listeners=[{"name": "t", "queue": qname("in"), "workflow": "Counting",
                    "batch_size": 20, "max_wait_ms": 50}],
        routers=[{"queue": qname("out")}])
    log = tmp_path / f"{name}.log"
    return config, log, start_service(config, log)


@pytest.mark.parametrize(("http", "words"), [
    ({"listen": "0.0.0.0:{port}"}, "no [http] token is set"),
    ({"listen": "0.0.0.0:{port}", "token": "change-me"}, "an example from the docs"),
    ({"listen": "127.0.0.1:{port}", "token": "short-token"}, "has 11 characters"),
    ({"listen": "127.0.0.1:{port}", "read_token": "operator-token"}, "example from the docs"),
])
def test_a_console_strangers_could_use_does_not_start(tmp_path, broker_url, qname, http, words):
    http = {k: v.format(port=free_port()) for k, v in http.items()}
    _config, log, service = _run(tmp_path, broker_url, qname, "refused", **http)
    try:
        assert service.wait(timeout=120) != 0
    finally:
        stop_service(service)
    said = log.read_text()
    assert words in said and MAKE_ONE in said, said[-2000:]
    assert "metrics and dashboard on" not in said


def test_a_public_console_starts_without_a_token_and_says_so(tmp_path, broker_url, qname):
    port = free_port()
    _config, log, service = _run(tmp_path, broker_url, qname, "public",
                                 listen=f"0.0.0.0:{port}", public=True)
    try:
        wait_for_log(log, "metrics and dashboard on")
        assert re.search(r"WARNING .*reachable from other machines and serves its pages",
                         log.read_text())
        assert _request(port, "/")[0] == 200
        status, _headers, text = _request(port, "/lanes/pause", method="POST",
                                          body="queue=x&token=anything")
        assert status == 403 and "set [http] token" in text
    finally:
        stop_service(service)
    # on loopback nothing is needed and nothing is said
    port = free_port()
    _config, log, service = _run(tmp_path, broker_url, qname, "loopback",
                                 listen=f"127.0.0.1:{port}")
    try:
        wait_for_log(log, "metrics and dashboard on")
        assert _request(port, "/")[0] == 200 and _request(port, "/metrics")[0] == 200
        assert "WARNING" not in log.read_text()
    finally:
        stop_service(service)


def test_every_token_the_docs_show_is_refused():
    shown = set()
    for page in [DOCS / "README.md", *sorted((DOCS / "docs").glob("*.md"))]:
        shown |= set(re.findall(r'^\s*#?\s*(?:read_)?token\s*=\s*"([^"]+)"', page.read_text(),
                                re.M))
    assert shown and shown <= EXAMPLE_TOKENS, shown - EXAMPLE_TOKENS


def test_a_console_beyond_loopback_refuses_strangers(tmp_path, broker_url, qname, chromium):
    outside = _outside_address()
    port = free_port()
    config, log, service = _run(tmp_path, broker_url, qname, "watchtower",
                                listen=f"0.0.0.0:{port}", token=TOKEN, read_token=READ,
                                allowed_hosts=["chalk.test", *([outside] if outside else [])])
    base = f"http://127.0.0.1:{port}/"
    try:
        wait_for_log(log, "metrics and dashboard on")
        assert re.search(r"WARNING .*reachable from other machines: its pages", log.read_text())
        from listener_router import load_settings
        settings = load_settings(config, env={})
        push_records(settings, settings.listeners[0].queue, [{"id": "g-1", "attributes": {}}])

        # reads need a token: a page gets the login form, with nothing of the service on it
        status, headers, text = _request(port, "/")
        assert status == 401 and 'id="chalk-login"' in text and "watchtower" not in text
        assert headers["www-authenticate"].startswith("Bearer")
        for path in ("/panel/jobs", "/record/g-1", "/dead-letter?queue=q&message=m"):
            assert _request(port, path)[0] == 401, path
            assert _request(port, path, token=READ)[0] in (200, 400, 404), path
        assert _request(port, "/panel/jobs", token=TOKEN)[0] == 200   # the controls' opens too
        assert _request(port, "/healthz")[0] == 200
        # /metrics: from loopback without a token; from elsewhere only with the bearer token
        assert _request(port, "/metrics")[0] == 200
        if outside:
            assert _request(port, "/metrics", host=outside, source=outside)[0] == 401
            assert _request(port, "/metrics", host=outside, source=outside, token=READ)[0] == 200
        # a Host not on the list is refused (a DNS-rebinding page), listed ones are not
        assert _request(port, "/metrics", header_host=f"evil.example:{port}")[0] == 400
        assert _request(port, "/healthz", header_host="chalk.test")[0] == 200
        # the security headers are on every answer, refusals too
        for path, token in (("/", None), ("/", READ), ("/metrics", None)):
            _status, headers, _text = _request(port, path, token=token)
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
            assert "frame-ancestors 'none'" in headers["content-security-policy"]
            assert re.search(r"script-src 'sha256-[^']+' 'sha256-[^']+';",
                             headers["content-security-policy"])
        # a notice a link from elsewhere made up is not shown
        status, _headers, text = _request(port, "/?did=paused&on=call+0800+now", token=READ)
        assert status == 200 and "0800" not in text

        # in a browser: the login form, then the page with its panels refreshing
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text)
                if "Content Security Policy" in m.text else None)
        page.goto(base)
        page.wait_for_selector("#chalk-login input[name=token]")
        page.fill("#chalk-login input[name=token]", "a-wrong-token-of-16")
        page.click("#chalk-login button")
        page.wait_for_function("() => document.querySelector('#login-note').textContent")
        assert "wrong token" in page.inner_text("#login-note")
        page.fill("#chalk-login input[name=token]", READ)
        page.click("#chalk-login button")
        page.wait_for_selector("#job-table", timeout=60_000)
        assert page.inner_text("header b") == "watchtower"
        page.wait_for_function("() => document.querySelector('[data-panel=jobs]')"
                               ".dataset.updated", timeout=60_000)   # refreshed with the token
        assert page.input_value("#token") == READ
        # a link to a record's page is opened with the kept token (no form again)
        page.goto(base + "record/g-1")
        page.wait_for_selector("#record-id")
        assert page.inner_text("#record-id") == "g-1"
        # no script but the page's own runs: one put into the page is blocked
        injected = page.evaluate("() => { const s = document.createElement('script');"
                                 " s.textContent = 'window.injected = 1';"
                                 " document.body.appendChild(s); return window.injected; }")
        assert injected is None
        assert any("script-src" in v for v in violations)   # the blocked one, and only it
        assert len(violations) == 1, violations
        # the read token opens no control
        page.goto(base)
        page.wait_for_selector("#lane-table")
        page.locator("#lane-table button:has-text('Pause')").first.click()
        page.wait_for_selector("#refused")
        assert "wrong token" in page.inner_text("#refused")

        # wrong tokens are slowed down for the address that sends them, not for others
        answers = []
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            answers.append(_request(port, "/panel/jobs", token="x" * 20, source="127.0.0.3")[0])
        assert answers.count(401) <= 5 and answers.count(429) >= 1, answers
        status, headers, _text = _request(port, "/panel/jobs", token=READ, source="127.0.0.3")
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert _request(port, "/panel/jobs", token=READ, source="127.0.0.4")[0] == 200
        status, _headers, text = _request(port, "/lanes/pause", method="POST",
                                          body=f"queue=x&token={TOKEN}", source="127.0.0.3")
        assert status == 429 and "too many wrong tokens" in text
        wait_until(lambda: _request(port, "/panel/jobs", token=READ,
                                    source="127.0.0.3")[0] == 200, 30,
                   "the address to be let in again after its wait", every=0.5)
    finally:
        stop_service(service)
    assert READ not in log.read_text() and TOKEN not in log.read_text()
