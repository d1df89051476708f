"""What no request may cost the console (fairq.web.limits): a body past 1 MiB refused with 413
unread, on every route, logged in or not; an unexpected failure answered with a fixed text and
the security headers, logged on one line; a bad body 400 or 415 (not 403) once the caller may
act; a logout only with its CSRF token. Both consoles: ``fairq web``'s and the mounted one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

import fairq
from fairq.web import Access, console, data, limits
from fairq.web import security as sec
from fairq.web.server import create_app
from tests.integration.test_web import TOKEN, login

BIG = limits.MAX_BODY + 1
BEARER = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    a.tenants.set("acme", weight=2)
    yield a
    a.close()


def own(app: fairq.App) -> Starlette:
    return create_app(app, guard=sec.Guard(TOKEN, True), hosts=sec.allowed_hosts("127.0.0.1", []))


def mounted(app: fairq.App) -> Starlette:
    host = Starlette()
    host.mount("/ops", console(app, authorize=lambda r: Access("olga", read=True, act=True)))
    return host


def headers_ok(response: Any) -> None:
    for k, x in sec.HEADERS.items():
        assert response.headers.get(k) == x, (k, response.status_code)


def call(asgi: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, int]:
    """One POST straight through ASGI; (status, how many times the body was asked for)."""
    asked, status = 0, 0

    async def receive() -> dict[str, Any]:
        nonlocal asked
        asked += 1
        return {"type": "http.request", "body": b" " * 65536, "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1"), *headers],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
    asyncio.run(asgi(scope, receive, send))
    return status, asked


@pytest.mark.parametrize("path", ["/api/tenants/acme", "/tenants/acme", "/login", "/logout",
                                  "/static/console.css", "/no/such/page"])
def test_a_declared_large_body_is_refused_unread_on_every_route(app: fairq.App, path: str) -> None:
    length = [(b"content-length", str(300 * 2**20).encode()),
              (b"content-type", b"application/json")]
    assert call(own(app), path, length) == (413, 0)
    assert call(mounted(app), "/ops" + path, length) == (413, 0)
    r = TestClient(own(app), base_url="http://127.0.0.1").post(path, content=b" " * BIG)
    assert r.status_code == 413 and "over 1024 KiB" in r.text
    headers_ok(r)


def test_a_large_body_without_a_length_is_cut_where_it_passes_the_limit(app: fairq.App) -> None:
    """Chunked: counted as it comes; refused once past 1 MiB, the rest never asked for."""
    status, asked = call(own(app), "/api/tenants/acme",
                         [(b"content-type", b"application/json"),
                          (b"authorization", f"Bearer {TOKEN}".encode())])
    assert status == 413 and asked == limits.MAX_BODY // 65536 + 1
    c = TestClient(own(app), base_url="http://127.0.0.1")

    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b" " * 65536

    r = c.post("/api/tenants/acme", content=chunks(), headers={**BEARER,
               "content-type": "application/json"})
    assert r.status_code == 413 and r.json() == {"error": limits.TOO_LARGE}
    headers_ok(r)
    assert app.tenants.get("acme").weight == 2


def test_an_unexpected_failure_is_a_fixed_answer_with_the_headers_and_one_log_line(
        app: fairq.App, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail\nsecond line")

    monkeypatch.setattr(data, "overview", broken)
    for asgi, root in ((own(app), ""), (mounted(app), "/ops")):
        c = TestClient(asgi, base_url="http://127.0.0.1", raise_server_exceptions=False)
        for path in ("/api/overview", "/"):
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="fairq.web"):
                r = c.get(root + path)
            assert r.status_code == 500, (root, path)
            assert "secret" not in r.text and "the console failed (reference" in r.text
            headers_ok(r)
            errors = [x for x in caplog.records if x.levelno >= logging.ERROR]
            assert len(errors) == 1 and errors[0].exc_info is None
            line = errors[0].getMessage()
            assert "RuntimeError: secret detail second line" in line and "\n" not in line
            ref = line.split("(ref ", 1)[1].split(")", 1)[0]
            assert ref in r.text


def test_a_bad_body_is_400_or_415_once_the_caller_may_act(app: fairq.App) -> None:
    for asgi, root in ((own(app), ""), (mounted(app), "/ops")):
        c = TestClient(asgi, base_url="http://127.0.0.1")
        if root:  # the mounted console: the CSRF token of its pages
            page = c.get(root + "/tenants/acme").text
            csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        else:  # fairq web's: a session's
            csrf = login(c)
        auth = {sec.CSRF_HEADER: csrf}
        json_type = {**auth, "content-type": "application/json"}
        deep = c.post(root + "/api/tenants/acme", content=b"[" * 200_000, headers=json_type)
        assert deep.status_code == 400 and deep.json() == {"error": "the body is not JSON"}
        headers_ok(deep)
        assert c.post(root + "/api/tenants/acme", content=b"{", headers=json_type
                      ).status_code == 400
        assert c.post(root + "/api/tenants/acme", content=b"[1]", headers=json_type
                      ).json() == {"error": "the body must be a JSON object"}
        form = c.post(root + "/api/tenants/acme", data={"weight": "3"}, headers=auth)
        assert form.status_code == 415
        page_form = c.post(root + "/tenants/acme", content=b'{"weight": 3}', headers=json_type)
        assert page_form.status_code == 415
    bearer = TestClient(own(app), base_url="http://127.0.0.1").post(
        "/api/tenants/acme", content=b"[" * 200_000, headers={**BEARER,
                                                             "content-type": "application/json"})
    assert bearer.status_code == 400
    # Who may not act is refused before the body matters: 403, bad body or not.
    anon = TestClient(own(app), base_url="http://127.0.0.1")
    r = anon.post("/api/tenants/acme", content=b"[" * 10, headers={"content-type":
                                                                 "application/json"})
    assert r.status_code == 403
    assert app.tenants.get("acme").weight == 2


def test_logout_needs_its_csrf_token(app: fairq.App) -> None:
    c = TestClient(own(app), base_url="http://127.0.0.1")
    csrf = login(c)
    r = c.post("/logout", data={}, follow_redirects=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = c.post("/logout", data={"csrf": csrf + "x"}, follow_redirects=False)
    assert r.status_code == 403
    assert f'value="{csrf}"' in c.get("/").text  # still logged in
    r = c.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and "fairq_session" in r.headers["set-cookie"]
    c.cookies.clear()
    assert "log out" not in c.get("/").text
