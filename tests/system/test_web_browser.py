"""The console in a real browser: ``fairq web --demo`` (the demo's live workload, actions
allowed) as a subprocess on a test database, driven by headless Debian Chromium through
chromedriver. It reads the reasons the tenant list shows (the noisy tenant at its cap, small
tenants waiting their turn, the rate-limited one), logs in with the token, retries the failed job
and sees it queued, and changes a weight and sees it in the table.

Screenshots of the overview and a tenant page are saved in the test's folder, and into the
folder FAIRQ_WEB_SCREENSHOTS names (docs/web.md: ``FAIRQ_WEB_SCREENSHOTS=docs/web``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import REPO
from tests.support.prom import free_port
from tests.support.skip_summary import INSTALL

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "browser-test-token-0123456789"
WAIT_S = 60  # an upper bound on a loaded box; the waits end at the event


def _missing() -> str | None:
    for path in (CHROMIUM, DRIVER):
        if not os.access(path, os.X_OK):
            return path
    return None


pytestmark = pytest.mark.skipif(_missing() is not None,
                                reason=f"chromium and chromedriver are needed: {INSTALL}")


@pytest.fixture
def console(dsn: str) -> Iterator[str]:
    """``fairq web --demo`` on the test database; its base URL once it answers."""
    port = free_port()
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_WEB_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "fairq", "web", "--demo", "--port", str(port)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the app and the workload are set up
        assert "fairq web: serving schema fairq_demo" in line, line
        deadline = time.monotonic() + WAIT_S
        while True:  # the listening socket comes right after that line
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
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1360,900",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, check: Callable[[], Any], what: str, reload: bool = False) -> Any:
    """Wait for ``check()`` to be truthy (reloading the page between tries when asked)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def probe(_: Any) -> Any:
        try:
            found = check()
        except WebDriverException:
            found = None
        if not found and reload:
            driver.refresh()
        return found

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.3).until(probe, message=what)


def reasons(driver: Any) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    return {row.get_attribute("data-tenant"): row.find_element(
                By.CSS_SELECTOR, "[data-col=reason]").text
            for row in driver.find_elements(By.CSS_SELECTOR, "#tenants tbody tr[data-tenant]")}


def shot(driver: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    driver.save_screenshot(str(path))
    out = os.environ.get("FAIRQ_WEB_SCREENSHOTS")
    if out:
        shutil.copy(path, Path(REPO, out, name))


def test_console_in_chromium(console: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(console + "/")
    assert until(d, lambda: d.find_element(By.ID, "workers-alive").text == "1", "a live worker",
                 reload=True)
    # The tenant list: the noisy tenant held at its cap, small tenants waiting their turn,
    # tenant-2 at its rate limit (each as soon as the workload shows it).
    d.get(console + "/tenants")
    seen: dict[str, set[str]] = {}

    def story() -> bool:
        for tenant, reason in reasons(d).items():
            seen.setdefault(tenant, set()).add(reason)
        return ("at_cap" in seen.get("tenant-1", set())
                and any("waiting_turn" in seen.get(f"tenant-{i}", set()) for i in range(3, 8))
                and "rate_limited" in seen.get("tenant-2", set()))

    until(d, story, f"the demo's reasons (seen so far: {seen})", reload=True)
    # From here on the page must not reload itself between an action and the check of its
    # answer (a reload drops the notice): the refresh box off, as an operator may untick it.
    d.execute_script("window.sessionStorage.setItem('fairq-refresh', 'off')")
    # The failed job: found through the jobs page, retried after logging in with the token.
    d.get(console + "/jobs?status=failed&tenant=tenant-3")
    link = until(d, lambda: d.find_elements(By.CSS_SELECTOR, "#jobs tbody tr[data-job] a"),
                 "the failed job", reload=True)[0]
    job_id = link.text
    link.click()
    until(d, lambda: d.find_element(By.ID, "job-status").text == "failed", "the failed job's page")
    assert "503" in d.find_element(By.ID, "last-error").text
    d.find_element(By.LINK_TEXT, "Log in").click()
    d.find_element(By.ID, "token").send_keys(TOKEN)
    d.find_element(By.ID, "login").click()
    until(d, lambda: d.find_elements(By.ID, "retry"), "the job page after the login")
    d.find_element(By.ID, "retry").click()
    until(d, lambda: d.find_element(By.ID, "notice").text == "Job queued again.",
          "the retry's notice")
    assert d.current_url.split("?")[0].endswith(f"/jobs/{job_id}")
    assert d.find_element(By.ID, "job-status").text in ("queued", "running", "done")
    # A weight changed on the tenant page shows in the table.
    d.get(console + "/tenants/tenant-4")
    d.find_element(By.ID, "set-weight").send_keys("3.5")
    d.find_element(By.ID, "save").click()
    until(d, lambda: d.find_element(By.ID, "notice").text.startswith("Settings saved"),
          "the settings' notice")
    assert d.find_element(By.ID, "weight").text == "3.5"
    d.get(console + "/tenants?sort=weight&order=desc")
    weights = until(d, lambda: {row.get_attribute("data-tenant"): row.find_element(
                        By.CSS_SELECTOR, "[data-col=weight]").text
                    for row in d.find_elements(By.CSS_SELECTOR, "#tenants tbody tr[data-tenant]")},
                    "the tenant table")
    assert weights["tenant-4"] == "3.5" and weights["tenant-1"] == "10"
    # Screenshots: the overview and the noisy tenant's page.
    d.get(console + "/")
    shot(d, tmp_path, "overview.png")
    d.get(console + "/tenants/tenant-1")
    assert d.find_element(By.CSS_SELECTOR, "#explain [data-col=reason]").text in (
        "at_cap", "waiting_turn", "running")
    shot(d, tmp_path, "tenant.png")
    d.get(console + "/tenants")
    shot(d, tmp_path, "tenants.png")
