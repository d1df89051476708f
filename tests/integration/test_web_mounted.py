"""The console mounted inside a FastAPI app (examples/fastapi_console/app.py) under /ops, through
Starlette's TestClient on a real database: every link, form and static file under the prefix,
403 without access (the body not read), a reader who sees no action and is refused every one,
an operator whose actions are logged with her name on ``fairq.web.audit``, and the CSRF check
still on."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import re
from collections.abc import Iterator
from html import unescape
from types import ModuleType
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

import fairq
from fairq.errors import InvalidInput
from fairq.web import Access, console
from fairq.web import security as sec
from tests.integration.test_web import scene
from tests.support.paths import REPO

EXAMPLE = REPO / "examples" / "fastapi_console" / "app.py"
PASSWORDS = {"olga": "olga-password", "rita": "rita-password"}
ODD = "team/a%2Fb c"  # a name with / and %: still one path segment under the prefix
ODD_URL = "team%2Fa%252Fb%20c"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_console_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


@pytest.fixture
def ids(app: fairq.App) -> dict[str, int]:
    found = scene(app)
    app.enqueue("t", tenant=ODD)
    return found


@pytest.fixture
def host(app: fairq.App) -> Any:
    return load_example().create_host(app, csrf_secret="s" * 32)


def browser(host: Any, user: str | None = None) -> TestClient:
    """A client of the host app, logged in through the host's own (toy) login."""
    c = TestClient(host, base_url="http://127.0.0.1")
    if user is not None:
        r = c.post("/login", data={"name": user, "password": PASSWORDS[user]},
                   follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/ops/"
    return c


def urls(page: str) -> list[str]:
    return [unescape(u) for u in re.findall(r'(?:href|src|action)="([^"]*)"', page)]


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no action form on the page"
    return found.group(1)


def post_raw(web: Any, path: str) -> tuple[int, int]:
    """POST a form to the ASGI app ``web`` itself: (the status, how often it read the body)."""
    reads: list[int] = []
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        return {"type": "http.request", "body": b"csrf=x", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1),
             "headers": [(b"host", b"127.0.0.1"),
                         (b"content-type", b"application/x-www-form-urlencoded")]}
    asyncio.run(web(scope, receive, send))
    return sent[0]["status"], len(reads)


def action_posts(ids: dict[str, int]) -> list[str]:
    failed = ids["failed"]
    return [f"/ops/jobs/{failed}/retry", f"/ops/jobs/{failed}/cancel", "/ops/tenants/oops/retry",
            "/ops/tenants/noisy/cancel", "/ops/tenants/small"]


def test_links_forms_and_static_files_live_under_the_prefix(host: Any,
                                                             ids: dict[str, int]) -> None:
    c = browser(host, "olga")
    r = c.get("/ops", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"].endswith("/ops/")
    seen: set[str] = set()
    for path in ("/ops/", "/ops/tenants", "/ops/tenants/oops", f"/ops/tenants/{ODD_URL}",
                 "/ops/jobs", f"/ops/jobs/{ids['failed']}"):
        r = c.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert r.headers["content-security-policy"] == sec.CSP
        found = urls(r.text)
        assert found and all(u.startswith("/ops/") for u in found), (path, found)
        seen.update(found)
    assert {"/ops/static/console.css", "/ops/static/console.js", "/ops/tenants", "/ops/jobs",
            f"/ops/tenants/{ODD_URL}", f"/ops/jobs/{ids['failed']}/retry",
            "/ops/tenants/oops/retry", "/ops/api/tenants"} <= seen
    for link in sorted(seen):  # every link is a page (the POST-only forms excepted)
        if not link.endswith(("/retry", "/cancel", "#settings-form")):
            assert c.get(link).status_code == 200, link
    css = c.get("/ops/static/console.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "header.top" in css.text
    assert c.get("/static/console.css").status_code == 404  # not at the host's root
    assert c.get(f"/ops/api/tenants/{ODD_URL}").json()["tenant"] == ODD
    assert c.get("/ops/no-such-page").status_code == 404


def test_no_access_is_403_for_every_page_and_no_body_is_read(host: Any, app: fairq.App,
                                                             ids: dict[str, int]) -> None:
    c = browser(host)
    for path in ("/ops/", "/ops/tenants", "/ops/jobs", "/ops/api/tenants",
                 f"/ops/jobs/{ids['failed']}"):
        r = c.get(path)
        assert r.status_code == 403, path
        assert "noisy" not in r.text and "you may not see the fairq console" in r.text
    assert c.get("/ops/api/overview").json()["error"].startswith("you may not see")
    # The static files are the wheel's, the same for everybody.
    assert c.get("/ops/static/console.css").status_code == 200
    # An action refused before its body is read: the ASGI receive is never called.
    for access in (None, Access("rita")):
        web = console(app, authorize=lambda r, a=access: a)  # type: ignore[misc]
        status, reads = post_raw(web, f"/jobs/{ids['failed']}/retry")
        assert (status, reads) == (403, 0), access
    assert post_raw(console(app, authorize=lambda r: Access("olga", act=True)),
                    f"/jobs/{ids['failed']}/retry")[1] == 1  # the probe sees a body read
    assert app.job(ids["failed"]).status == "failed"  # type: ignore[union-attr]


def test_a_reader_sees_no_action_and_is_refused_every_one(host: Any, app: fairq.App,
                                                          ids: dict[str, int]) -> None:
    c = browser(host, "rita")
    for path in ("/ops/", "/ops/tenants/oops", f"/ops/jobs/{ids['failed']}", "/ops/jobs"):
        page = c.get(path).text
        assert 'method="post"' not in page and 'name="csrf"' not in page, path
        assert 'id="retry"' not in page and 'id="save"' not in page, path
        assert 'id="operator">rita<' in page and "read-only" in page
        assert "/login" not in page and "log out" not in page  # the host's login, not ours
    assert "fairq_console_csrf" not in c.cookies  # no token for who may not act
    for path in action_posts(ids):
        assert c.post(path, data={"csrf": "x", "weight": "9"}).status_code == 403, path
        assert c.post(path.replace("/ops/", "/ops/api/"), json={"weight": 9},
                      headers={sec.CSRF_HEADER: "x"}).status_code == 403, path
    assert app.job(ids["failed"]).status == "failed"  # type: ignore[union-attr]
    assert app.tenants.get("small").weight == 1.0
    assert app.queue_depth(tenant="noisy").queued == 4


def test_an_operators_actions_are_done_and_logged_with_her_name(
        host: Any, app: fairq.App, ids: dict[str, int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fairq.web.audit")
    c = browser(host, "olga")
    job = ids["failed"]
    page = c.get(f"/ops/jobs/{job}").text
    assert 'id="operator">olga<' in page and 'id="retry"' in page
    r = c.post(f"/ops/jobs/{job}/retry", data={"csrf": csrf_of(page)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ops/jobs/{job}?notice=retried"
    assert "Job queued again." in c.get(r.headers["location"]).text
    assert app.job(job).status == "queued"  # type: ignore[union-attr]
    page = c.get("/ops/tenants/small").text
    r = c.post("/ops/tenants/small", data={"csrf": csrf_of(page), "weight": "2.5",
                                           "max_running": "", "rate": ""},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ops/tenants/small?notice=saved"
    assert app.tenants.get("small").weight == 2.5
    api = c.post("/ops/api/tenants/noisy/cancel", headers={sec.CSRF_HEADER: csrf_of(page)})
    assert api.json() == {"cancelled": 4}
    done = [r for r in caplog.records if r.name == "fairq.web.audit"]
    assert [r.getMessage() for r in done] == [
        f"operator='olga' action=retry_job job={job}",
        "operator='olga' action=set_tenant tenant='small' weight='2.5'",
        "operator='olga' action=cancel_tenant tenant='noisy'"]
    assert [(getattr(r, "operator"), getattr(r, "action")) for r in done] == [  # noqa: B009
        ("olga", "retry_job"), ("olga", "set_tenant"), ("olga", "cancel_tenant")]
    assert getattr(done[1], "changes") == {"weight": "2.5"}  # noqa: B009
    assert all(r.levelno == logging.INFO for r in done)


def test_csrf_is_still_enforced(host: Any, app: fairq.App, ids: dict[str, int],
                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fairq.web.audit")
    job = ids["failed"]
    olga = browser(host, "olga")
    token = csrf_of(olga.get(f"/ops/jobs/{job}").text)
    assert olga.post(f"/ops/jobs/{job}/retry").status_code == 403  # no token
    assert olga.post(f"/ops/jobs/{job}/retry", data={"csrf": token + "x"}).status_code == 403
    assert olga.post(f"/ops/api/jobs/{job}/retry").status_code == 403  # JSON without the header
    assert olga.post("/ops/tenants/small", data={"weight": "7"}).status_code == 403
    # Her token from another browser of hers (another nonce cookie), or with the cookie gone
    # (what a cross-site form sends under SameSite=Strict): refused.
    other = browser(host, "olga")
    assert other.post(f"/ops/jobs/{job}/retry", data={"csrf": token}).status_code == 403
    bare = browser(host, "olga")
    bare.cookies.delete("fairq_console_csrf")
    assert bare.post(f"/ops/jobs/{job}/retry", data={"csrf": token}).status_code == 403
    assert app.job(job).status == "failed"  # type: ignore[union-attr]
    assert app.tenants.get("small").weight == 1.0
    refused = [r.getMessage() for r in caplog.records if r.name == "fairq.web.audit"]
    assert refused and all(m.startswith("operator='olga'") and "refused" in m for m in refused)
    # The right token in the right browser passes.
    assert olga.post(f"/ops/jobs/{job}/retry", data={"csrf": token}).status_code == 200


def test_authorize_async_and_checked(app: fairq.App, ids: dict[str, int],
                                     caplog: pytest.LogCaptureFixture) -> None:
    async def authorize(request: Request) -> Access | None:
        who = request.headers.get("x-user")
        return Access(who, act=who == "ana") if who else None

    host = Starlette()
    host.mount("/admin/queue", console(app, authorize=authorize))
    c = TestClient(host, base_url="http://127.0.0.1")
    page = c.get("/admin/queue/tenants", headers={"x-user": "ana"}).text
    assert 'href="/admin/queue/tenants/oops"' in page
    assert c.get("/admin/queue/tenants").status_code == 403
    assert c.get("/admin/queue/", headers={"x-user": "bob"}).status_code == 200
    # A wrong answer of authorize is a 500 with a fixed text, and one line in the log.
    wrong = Starlette()
    wrong.mount("/ops", console(app, authorize=lambda r: "yes"))  # type: ignore[arg-type,return-value]
    with caplog.at_level(logging.ERROR, logger="fairq.web"):
        r = TestClient(wrong, raise_server_exceptions=False).get("/ops/api/overview")
    assert r.status_code == 500 and r.json()["error"].startswith("the console failed")
    (line,) = [x.getMessage() for x in caplog.records if x.name == "fairq.web"]
    assert "authorize must return fairq.web.Access" in line and "\n" not in line
    denied = Starlette()
    denied.mount("/ops", console(app, authorize=lambda r: Access("x", read=False, act=True)))
    assert TestClient(denied).post(f"/ops/jobs/{ids['failed']}/retry").status_code == 403
    for bad, match in ((lambda: Access(""), "must not be empty"),
                       (lambda: Access("x", act="yes"), "Access.act"),  # type: ignore[arg-type]
                       (lambda: console(app, authorize=None), "authorize must be"),  # type: ignore[arg-type]
                       (lambda: console(app, authorize=lambda r: None, csrf_secret="short"),
                        "at least 16")):
        with pytest.raises(InvalidInput, match=match):
            bad()
