"""The tenant settings form in headless Chromium, and its JSON twin: one patch of the fields
given (burst and group included), a stale form refused instead of overwriting, a refusal shown
beside its field with what was typed kept, an unknown field refused with nothing changed.

The screenshots of the two refusals are saved in the test's folder, and into the folder
FAIRQ_WEB_SCREENSHOTS names (docs/web.md: ``FAIRQ_WEB_SCREENSHOTS=docs/web``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairq
from tests.support.paths import REPO
from tests.support.prom import free_port
from tests.system.test_web_browser import (  # noqa: F401 - fixtures
    TOKEN,
    WAIT_S,
    _missing,
    browser,
    shot,
    until,
)


@pytest.fixture
def web(dsn: str) -> Iterator[str]:
    """``fairq web --allow-actions`` on the test database; its base URL once it answers."""
    port = free_port()
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_WEB_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "fairq", "web", "--allow-actions", "--port",
                             str(port)], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                urllib.request.urlopen(base + "/api/overview", timeout=5).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn)
    try:
        yield a
    finally:
        a.close()


def tenant_row(dsn: str, tenant: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT weight, max_running, rate, burst, tenant_group, version "
                            "FROM fairq.tenants WHERE tenant = %s", (tenant,)).fetchone()


def api(base: str, path: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"authorization": f"Bearer {TOKEN}",
                                          "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def log_in(d: Any, base: str, path: str) -> None:
    from selenium.webdriver.common.by import By

    d.get(f"{base}/login?next={path}")
    d.find_element(By.ID, "token").send_keys(TOKEN)
    d.find_element(By.ID, "login").click()
    until(d, lambda: d.find_elements(By.ID, "settings-form"), "the tenant page after the login")
    d.execute_script("window.sessionStorage.setItem('fairq-refresh', 'off')")


def status(d: Any) -> int:
    """The HTTP status of the page the browser shows."""
    return int(d.execute_script(
        "return performance.getEntriesByType('navigation')[0].responseStatus"))


browser_only = pytest.mark.skipif(_missing() is not None, reason="chromium and chromedriver")


@browser_only
def test_a_stale_form_is_refused_and_keeps_what_was_typed(
        web: str, browser: Any, app: fairq.App, dsn: str, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    d = browser
    app.tenants.set("acme", weight=2, max_running=4)
    log_in(d, web, "/tenants/acme")
    assert d.find_element(By.ID, "set-version").get_attribute("value") == "1"
    app.tenants.set("acme", weight=3)  # another operator, while the page is open
    d.find_element(By.ID, "set-cap").send_keys("7")
    d.find_element(By.ID, "save").click()
    error = until(d, lambda: d.find_elements(By.ID, "form-error"), "the refusal")[0]
    assert "changed meanwhile by another operator" in error.text and error.text.endswith("reload")
    assert status(d) == 409  # the same page, not an error page
    assert d.find_elements(By.ID, "chart") and not d.find_elements(By.ID, "set-cap-error")
    assert d.find_element(By.ID, "set-cap").get_attribute("value") == "7"  # kept
    d.execute_script("arguments[0].scrollIntoView()", d.find_element(By.ID, "settings-form"))
    shot(d, tmp_path, "tenant-stale-form.png")
    assert tenant_row(dsn, "acme") == (3.0, 4, None, None, None, 2)  # nothing overwritten
    # Reloaded, the same save lands.
    d.get(web + "/tenants/acme")
    d.execute_script("window.sessionStorage.setItem('fairq-refresh', 'off')")
    d.find_element(By.ID, "set-cap").send_keys("7")
    d.find_element(By.ID, "save").click()
    until(d, lambda: d.find_element(By.ID, "notice").text.startswith("Settings saved"), "saved")
    assert tenant_row(dsn, "acme") == (3.0, 7, None, None, None, 3)


@browser_only
def test_burst_and_group_from_the_form_and_a_bad_number_beside_its_field(
        web: str, browser: Any, app: fairq.App, dsn: str, tmp_path: Path) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    d = browser
    app.groups.set("enterprise", weight=5)
    app.enqueue("t", tenant="globex")  # known by its jobs only: version 0
    log_in(d, web, "/tenants/globex")
    assert d.find_element(By.ID, "set-version").get_attribute("value") == "0"
    d.find_element(By.ID, "set-weight").send_keys("5_0")
    d.find_element(By.ID, "set-rate").send_keys("4")
    d.find_element(By.ID, "save").click()
    err = until(d, lambda: d.find_elements(By.ID, "set-weight-error"), "the weight's message")[0]
    assert err.text == "weight must be a number, not '5_0'"
    assert d.find_element(By.ID, "set-weight").get_attribute("aria-invalid") == "true"
    assert d.find_element(By.ID, "set-rate").get_attribute("value") == "4"
    assert status(d) == 400 and d.find_elements(By.ID, "chart")
    d.execute_script("arguments[0].scrollIntoView()", d.find_element(By.ID, "settings-form"))
    shot(d, tmp_path, "tenant-bad-number.png")
    assert tenant_row(dsn, "globex") is None
    weight = d.find_element(By.ID, "set-weight")
    weight.clear()
    weight.send_keys("2.5")
    d.find_element(By.ID, "set-burst").send_keys("9")
    Select(d.find_element(By.ID, "set-group")).select_by_visible_text("enterprise")
    d.find_element(By.ID, "save").click()
    until(d, lambda: d.find_element(By.ID, "notice").text.startswith("Settings saved"), "saved")
    assert tenant_row(dsn, "globex") == (2.5, 10, 4.0, 9, "enterprise", 1)
    with psycopg.connect(dsn) as conn:  # and the engine's copy
        assert conn.execute("SELECT weight, rate, burst, tenant_group FROM fairq.tenant_schedule "
                            "WHERE tenant = 'globex'").fetchone() == (2.5, 4.0, 9, "enterprise")
    d.save_screenshot(str(tmp_path / "tenant-form.png"))


def test_the_json_patch_refuses_unknown_fields_and_stale_versions(
        web: str, app: fairq.App, dsn: str) -> None:
    app.groups.set("enterprise", weight=5)
    app.tenants.set("acme", weight=1)
    code, body = api(web, "/api/tenants/acme",
                     {"weight": 2, "burst": 7, "group": "enterprise", "bogus": 1})
    assert code == 400 and "unknown tenant setting(s) 'bogus'" in body["error"]
    assert tenant_row(dsn, "acme") == (1.0, 10, None, None, None, 1)
    for bad, field in (({"weight": "5_0"}, "weight"), ({"weight": "nan"}, "weight"),
                       ({"max_running": "١٢"}, "max_running"), ({"weight": True}, "weight"),
                       ({"weight": 2, "expected_version": "1_0"}, None)):
        code, body = api(web, "/api/tenants/acme", bad)
        assert code == 400 and body["field"] == field, (bad, body)
        assert "\n" not in body["error"]
    assert tenant_row(dsn, "acme") == (1.0, 10, None, None, None, 1)
    code, body = api(web, "/api/tenants/acme", {"burst": 7})  # no rate: refused
    assert code == 400 and "burst" in body["error"]
    code, body = api(web, "/api/tenants/acme", {"rate": 3, "burst": 7, "group": "enterprise",
                                                "expected_version": 1})
    assert code == 200, body
    assert (body["rate"], body["burst"], body["group"], body["version"]) == (3.0, 7,
                                                                             "enterprise", 2)
    code, body = api(web, "/api/tenants/acme", {"weight": 9, "expected_version": 1})
    assert code == 409 and body["error"].endswith("reload")
    assert tenant_row(dsn, "acme") == (1.0, 10, 3.0, 7, "enterprise", 2)
    code, body = api(web, "/api/tenants/acme", {"group": "nope"})
    assert code == 400 and body["field"] == "group"


def test_the_form_fields_become_one_patch() -> None:
    """Blank fields keep, the CSRF token and version are the form's own, numbers are parsed
    strictly, and each refusal names its field (None: the form as a whole)."""
    from fairq.web import data

    patch, version = data.patch_from("acme", {"csrf": "x", "version": "3", "weight": " 2.5 ",
                                              "max_running": "", "rate": "unlimited",
                                              "burst": "", "group": ""}, form=True)
    assert (patch.fields, patch.weight, patch.rate, version) == ({"weight", "rate"}, 2.5, None, 3)
    patch, version = data.patch_from("acme", {"group": "default", "max_running": 0}, form=False)
    assert (patch.fields, patch.group, patch.max_running, version) == (
        {"group", "max_running"}, None, 0, None)
    for fields, form, field in (({"weight": "5_0"}, True, "weight"),
                                ({"max_running": "١٢"}, True, "max_running"),
                                ({"rate": "nan"}, True, "rate"),
                                ({"rate": "unlimited", "burst": "3"}, True, "burst"),
                                ({"version": "x", "weight": "2"}, True, None),
                                ({"version": "-1", "weight": "2"}, True, None),
                                ({"weight": "", "csrf": "x"}, True, None),
                                ({"weight": 2, "bogus": 1}, False, None),
                                ({"weight": 2, "version": 1}, False, None)):
        with pytest.raises(data.FieldError) as refused:
            data.patch_from("acme", fields, form=form)
        assert refused.value.field == field, (fields, str(refused.value))


def test_two_concurrent_console_saves_of_different_fields_both_stay(
        web: str, app: fairq.App, dsn: str) -> None:
    """The console's lost update at 0.1.0 (19 and 17 of 40 lost, both answered 200): two
    POSTs at the same moment, one a weight and one a cap, 40 rounds."""
    import threading

    lost = 0
    for i in range(40):
        tenant = f"c{i}"
        app.tenants.set(tenant, weight=1, max_running=1)
        gate = threading.Barrier(2)
        codes: list[int] = []

        def post(body: dict[str, Any], t: str = tenant, gate: threading.Barrier = gate,
                 codes: list[int] = codes) -> None:
            gate.wait()
            codes.append(api(web, f"/api/tenants/{t}", body)[0])

        threads = [threading.Thread(target=post, args=({"weight": 4},)),
                   threading.Thread(target=post, args=({"max_running": 6},))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert codes == [200, 200]
        row = tenant_row(dsn, tenant)
        assert row is not None
        lost += (row[0] != 4.0) + (row[1] != 6)
    assert lost == 0

