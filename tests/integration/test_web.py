"""The operator console (``fairq web``) through Starlette's TestClient on a real database: each
page and its JSON twin, the list's reasons and shares against ``tenants explain`` and
``fairq stats``, the page-only facts, escaping, the refusals (read-only, login, CSRF, Host) and
the actions, and the console's role with exactly the grants of docs/roles.md."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from starlette.testclient import TestClient

import fairq
from fairq.admin import roles
from fairq.metrics.stats import tenant_stats
from fairq.policies import get_policy
from fairq.store import console
from fairq.store.workers import register_worker
from fairq.web import security as sec
from fairq.web.server import create_app

TOKEN = "t0ken-" + "x" * 20
XSS = "<script>alert(1)</script>"
WEIGHTED = get_policy("weighted")


def client(app: fairq.App, *, actions: bool = True, token: str | None = TOKEN) -> TestClient:
    web = create_app(app, guard=sec.Guard(token, actions),
                     hosts=sec.allowed_hosts("127.0.0.1", []))
    return TestClient(web, base_url="http://127.0.0.1")


def scene(app: fairq.App) -> dict[str, int]:
    """noisy at its cap, slow rate limited, oops with a failed job, small waiting its turn, a
    tenant named like a script tag; a live worker in the registry."""
    register_worker(app.store, "w1", queues=("default",), policy="weighted", beat_seconds=60)
    app.tenants.set("noisy", max_running=1)
    app.tenants.set("slow", rate=0.01, burst=1)
    app.enqueue_many("t", [("noisy", None)] * 5)
    assert [j.tenant for j in app.store.claim(WEIGHTED, queue="default", batch=1, worker="w")] \
        == ["noisy"]
    app.enqueue_many("t", [("slow", None)] * 2)
    assert [j.tenant for j in app.store.claim(WEIGHTED, queue="default", batch=1, worker="w")] \
        == ["slow"]
    failing = app.enqueue("t", tenant="oops", payload={"report": 1})
    (job,) = app.store.claim(WEIGHTED, queue="default", batch=1, worker="w")
    assert job.id == failing
    app.store.finish_failed([(job.id, job.attempts, "boom: <b>bad</b>", None)], final=[job.id])
    app.enqueue("t", tenant="small")
    xss_job = app.enqueue("t", tenant=XSS, payload={"x": XSS})
    return {"failed": failing, "xss": xss_job}


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


def facts_asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on the console's costly per-tenant read: the list grows by each call's tenant count."""
    asked: list[int] = []
    real = console._facts

    def spy(store: Any, cur: Any, page: list[dict[str, Any]], window_s: float) -> Any:
        asked.append(len(page))
        return real(store, cur, page, window_s)

    monkeypatch.setattr(console, "_facts", spy)
    return asked


def login(c: TestClient, token: str = TOKEN) -> str:
    """Log in through the form; returns the session's CSRF token (read from a page)."""
    page = c.get("/login").text
    nonce = re.search(r'name="csrf" value="([^"]+)"', page)
    assert nonce
    r = c.post("/login", data={"token": token, "csrf": nonce.group(1), "next": "/tenants"},
               follow_redirects=False)
    assert r.status_code == 303, r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    found = re.search(r'name="csrf" value="([^"]+)"', c.get("/").text)
    assert found
    return found.group(1)


def test_pages_reasons_and_contract(app: fairq.App) -> None:
    ids = scene(app)
    c = client(app, actions=False)
    for path in ("/", "/tenants", "/tenants/noisy", "/jobs", f"/jobs/{ids['failed']}",
                 "/jobs?status=failed", "/api/overview", "/api/jobs", f"/api/jobs/{ids['failed']}",
                 "/api/tenants/noisy"):
        r = c.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert r.headers["content-security-policy"] == sec.CSP
    listed = c.get("/api/tenants").json()
    assert isinstance(listed, list)
    for row in listed:
        assert {"tenant", "reason", "weight", "cap", "queued", "running", "share",
                "wait"} <= row.keys()
    by = {r["tenant"]: r for r in listed}
    assert by["noisy"]["reason"] == "at_cap"
    assert by["slow"]["reason"] == "rate_limited"
    assert by["small"]["reason"] == "waiting_turn"
    assert by["oops"]["reason"] == "no_jobs"
    for name, row in by.items():  # the list says what `fairq tenants explain` says
        assert row["reason"] == app.tenants.explain(name, "default").reason, name
    assert by["noisy"]["queued"] == 4 and by["noisy"]["running"] == 1 and by["noisy"]["cap"] == 1
    one = c.get("/api/tenants/noisy").json()
    assert [e["reason"] for e in one["explain"]] == ["at_cap"]
    overview = c.get("/api/overview").json()
    assert overview["workers_alive"] == 1
    assert overview["claims_per_s"] == pytest.approx(3 / 60)  # noisy, slow, oops: just now
    assert overview["queues"][0]["failed"] == 1 and overview["queues"][0]["running"] == 2
    page = c.get("/tenants").text
    assert 'class="reason at_cap"' in page and 'class="reason rate_limited"' in page


def test_share_is_of_recent_claims_as_fairq_stats_has_it(app: fairq.App) -> None:
    scene(app)
    listed = {r["tenant"]: r for r in client(app).get("/api/tenants").json()}
    stats = {s.tenant: s for s in tenant_stats(app)}
    for name in ("noisy", "slow", "oops", "small"):
        got, want = listed[name], stats[name]
        assert (got["share"], got["recent_claims"]) == (
            pytest.approx(want.claim_share) if want.claim_share is not None else None,
            want.recent_claims), name
    assert listed["noisy"]["share"] == pytest.approx(1 / 3)  # 3 claims: noisy, slow, oops
    assert listed["small"]["share"] == 0 and listed["small"]["recent_claims"] == 0


def test_only_the_page_gets_the_costly_columns(app: fairq.App,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    scene(app)
    asked = facts_asked(monkeypatch)
    c = client(app)
    r = c.get("/api/tenants?per_page=2&sort=tenant&order=desc&page=2")
    assert r.status_code == 200 and r.headers["x-total-count"] == "5"
    assert [x["tenant"] for x in r.json()] == ["oops", "noisy"]  # slow, small | oops, noisy | <s>
    assert asked == [2]
    assert [x["tenant"] for x in c.get("/api/tenants?q=OI").json()] == ["noisy"]
    assert c.get("/api/tenants?sort=reason").status_code == 400  # computed per page only


def test_user_text_is_escaped(app: fairq.App) -> None:
    ids = scene(app)
    c = client(app)
    for path in ("/tenants", f"/tenants/{XSS}", f"/jobs/{ids['xss']}", "/jobs",
                 f"/jobs/{ids['failed']}"):
        body = c.get(path).text
        assert XSS not in body and "<b>bad</b>" not in body, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in c.get(f"/jobs/{ids['xss']}").text
    assert c.get("/api/jobs/" + str(ids["xss"])).json()["payload"] == {"x": XSS}


def test_refusals(app: fairq.App) -> None:
    ids = scene(app)
    ro = client(app, actions=False)
    assert ro.post(f"/jobs/{ids['failed']}/retry", data={"csrf": "x"}).status_code == 403
    assert ro.post("/api/tenants/noisy", json={"weight": 2},
                   headers={"authorization": f"Bearer {TOKEN}"}).status_code == 403
    c = client(app)
    # No session, or a session without its CSRF token: refused, nothing changed.
    assert c.post(f"/jobs/{ids['failed']}/retry").status_code == 403
    assert c.post("/api/tenants/noisy", json={"weight": 2}).json()["error"].startswith("log in")
    login(c)
    assert c.post(f"/jobs/{ids['failed']}/retry", data={"csrf": "forged"}).status_code == 403
    assert c.post("/api/tenants/noisy", json={"weight": 2}).status_code == 403
    assert c.post("/api/tenants/noisy", json={"weight": 2},
                  headers={"authorization": "Bearer wrong-token-wrong-token"}).status_code == 403
    assert app.job(ids["failed"]).status == "failed"  # type: ignore[union-attr]
    assert app.tenants.get("noisy").weight == 1.0
    # A wrong token at the login; a login form not loaded from here.
    other = client(app)
    page = other.get("/login").text
    nonce = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    assert other.post("/login", data={"token": "nope", "csrf": nonce}).status_code == 403
    assert client(app).post("/login", data={"token": TOKEN, "csrf": "x"}).status_code == 403
    # Host allowlist: a rebinding name is refused before any handler runs.
    assert c.get("/", headers={"host": "evil.example"}).status_code == 400
    # Names and numbers checked as the CLI checks them.
    assert c.get("/tenants/" + "a" * 201).status_code == 400
    assert "limit is 200" in c.get("/api/tenants/" + "a" * 201).json()["error"]
    assert c.get("/jobs/abc").status_code == 400
    assert c.get("/api/jobs?status=lost").status_code == 400


def test_actions(app: fairq.App) -> None:
    ids = scene(app)
    c = client(app)
    csrf = login(c)
    r = c.post(f"/jobs/{ids['failed']}/retry", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].endswith("notice=retried")
    assert app.job(ids["failed"]).status == "queued"  # type: ignore[union-attr]
    again = c.post(f"/jobs/{ids['failed']}/retry", data={"csrf": csrf})
    assert again.status_code == 400 and "only failed or cancelled jobs" in again.text
    r = c.post("/tenants/small", data={"csrf": csrf, "weight": "2.5", "max_running": "",
                                       "rate": ""}, follow_redirects=False)
    assert r.status_code == 303
    assert app.tenants.get("small").weight == 2.5
    assert {x["tenant"]: x for x in c.get("/api/tenants").json()}["small"]["weight"] == 2.5
    bad = c.post("/tenants/small", data={"csrf": csrf, "weight": "5000"})
    assert bad.status_code == 400 and "weight must be between" in bad.text
    api = c.post("/api/tenants/small", json={"weight": 0}, headers={sec.CSRF_HEADER: csrf})
    assert api.status_code == 400 and "weight" in api.json()["error"]
    ok = c.post("/api/tenants/slow", json={"rate": None, "max_running": 3},
                headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["rate"] is None and ok.json()["max_running"] == 3
    assert c.post("/api/tenants/noisy/cancel", headers={sec.CSRF_HEADER: csrf}).json() \
        == {"cancelled": 4}
    queued = app.enqueue("t", tenant="small")
    assert c.post(f"/api/jobs/{queued}/cancel", headers={sec.CSRF_HEADER: csrf}).status_code == 200
    assert app.job(queued).status == "cancelled"  # type: ignore[union-attr]
    assert c.post(f"/api/jobs/{queued}/cancel", headers={sec.CSRF_HEADER: csrf}).status_code == 400
    assert c.post("/api/tenants/small/retry", headers={sec.CSRF_HEADER: csrf}).json()[
        "retried"] == []


def _as_role(dsn: str, role: str) -> str:
    params = conninfo_to_dict(dsn)
    params["user"] = role
    return make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def console_role(dsn: str) -> Iterator[str]:
    role = f"fq_console_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
    try:
        yield role
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")


def test_console_role_has_exactly_what_it_needs(dsn: str, console_role: str) -> None:
    owner = fairq.App(dsn, schema="fairq")
    ids = scene(owner)
    roles.apply(dsn, "fairq", roles.grant_statements("fairq", console=console_role))
    mine = fairq.App(_as_role(dsn, console_role), schema="fairq")
    try:
        c = client(mine)
        for path in ("/", "/tenants", "/tenants/noisy", "/jobs", f"/jobs/{ids['failed']}"):
            assert c.get(path).status_code == 200, path
        csrf = login(c)
        refused = c.post(f"/api/jobs/{ids['failed']}/retry", headers={sec.CSRF_HEADER: csrf})
        assert refused.status_code == 403 and "role" in refused.json()["error"]
        # With the actions' grants: the CLI's actions work, and nothing else is written.
        roles.apply(dsn, "fairq", roles.grant_statements("fairq", console=console_role,
                                                         console_actions=True))
        assert c.post(f"/api/jobs/{ids['failed']}/retry",
                      headers={sec.CSRF_HEADER: csrf}).json() == {"retried": [ids["failed"]]}
        assert c.post("/api/tenants/newcomer", json={"weight": 3, "max_running": 2, "rate": 5},
                      headers={sec.CSRF_HEADER: csrf}).status_code == 200
        assert c.post("/api/tenants/noisy/cancel", headers={sec.CSRF_HEADER: csrf}).status_code \
            == 200
        role_dsn = _as_role(dsn, console_role)
        for statement in ("DELETE FROM fairq.jobs", "UPDATE fairq.jobs SET payload = '{}'",
                          "UPDATE fairq.settings SET value = '{}'",
                          "INSERT INTO fairq.tenant_groups (tenant_group, weight) VALUES ('g', 1)",
                          "DELETE FROM fairq.workers"):
            with psycopg.connect(role_dsn, autocommit=True) as conn, \
                    pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    finally:
        mine.close()
        owner.close()


def test_hundred_thousand_tenants_page_reads_only_the_page(
        app: fairq.App, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """100,000 tenants, each with a queued job (bulk INSERT): the list reads the facts of its
    page only. The time is printed (docs/web.md has the figure), never asserted."""
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO fairq.jobs (tenant, task) "
                     "SELECT 't' || lpad(g::text, 6, '0'), 't' FROM generate_series(1, 100000) g")
        conn.execute("INSERT INTO fairq.tenant_schedule (queue, tenant) "
                     "SELECT 'default', 't' || lpad(g::text, 6, '0') "
                     "FROM generate_series(1, 100000) g")
        conn.execute("ANALYZE fairq.jobs")
        conn.execute("ANALYZE fairq.tenant_schedule")
    asked = facts_asked(monkeypatch)
    c = client(app)
    c.get("/tenants")  # warm: the pool's connections, the templates
    timings = []
    for path in ("/tenants", "/api/tenants", "/tenants?sort=weight&order=desc&page=1000",
                 "/api/tenants?q=t09999"):
        t0 = time.perf_counter()
        r = c.get(path)
        timings.append(f"{path} {time.perf_counter() - t0:.3f}s")
        assert r.status_code == 200
    assert asked == [50, 50, 50, 50, 10]  # the warm-up's page, then each page's own rows
    assert c.get("/api/tenants").headers["x-total-count"] == "100000"
    assert [x["tenant"] for x in c.get("/api/tenants?q=t09999").json()] == [
        f"t0{n}" for n in range(99990, 100000)]
    t0 = time.perf_counter()  # one tenant's page: `tenants explain`, linear in the queue
    assert c.get("/tenants/t050000").status_code == 200
    timings.append(f"/tenants/t050000 {time.perf_counter() - t0:.3f}s")
    with capsys.disabled():
        print("\n100,000 tenants: " + "; ".join(timings))


def test_beyond_loopback_every_page_needs_the_login(app: fairq.App) -> None:
    scene(app)
    web = create_app(app, guard=sec.Guard(TOKEN, False, login_required=True),
                     hosts=sec.allowed_hosts("0.0.0.0", []))
    c = TestClient(web, base_url="http://127.0.0.1")
    r = c.get("/tenants", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=/tenants"
    assert c.get("/api/tenants").status_code == 401
    assert c.get("/static/console.css").status_code == 200
    assert c.get("/api/tenants", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    login(c)  # a read-only console's login: the pages, still no action
    assert c.get("/tenants").status_code == 200 and "noisy" in c.get("/tenants").text
    assert c.post("/api/tenants/noisy/cancel", headers={
        "authorization": f"Bearer {TOKEN}"}).status_code == 403


def test_names_with_slashes_and_percents_have_their_pages(app: fairq.App) -> None:
    odd = "team/a%2Fb c"
    app.enqueue("t", tenant=odd)
    app.enqueue("t", tenant="team")
    c = client(app)
    page = c.get("/tenants").text
    assert 'href="/tenants/team%2Fa%252Fb%20c"' in page
    assert c.get("/api/tenants/team%2Fa%252Fb%20c").json()["tenant"] == odd
    csrf = login(c)
    r = c.post("/tenants/team%2Fa%252Fb%20c", data={"csrf": csrf, "weight": "4"},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/tenants/team%2Fa%252Fb%20c?")
    assert app.tenants.get(odd).weight == 4.0 and app.tenants.get("team").weight == 1.0
    assert c.post("/api/tenants/team%2Fa%252Fb%20c/cancel",
                  headers={sec.CSRF_HEADER: csrf}).json() == {"cancelled": 1}
    assert app.queue_depth(tenant="team").queued == 1
