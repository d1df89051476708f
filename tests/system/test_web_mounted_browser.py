"""The console mounted in a FastAPI app, in a real browser: examples/fastapi_console/app.py run
by uvicorn as a subprocess on a test database with a few tenants and jobs, driven by headless
Debian Chromium through chromedriver. The operator logs in through the host's own login, follows
the console's links under /ops (tenants, a tenant, jobs), sees its stylesheet and script loaded
from /ops/static, retries a failed job and changes a weight (both seen in the database, the
retry in the audit log with her name); the reader sees no action.

Screenshots are saved in the test's folder, and into the folder FAIRQ_WEB_SCREENSHOTS names
(``FAIRQ_WEB_SCREENSHOTS=docs/web``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fairq
from tests.integration.test_web import scene
from tests.support.paths import REPO
from tests.support.prom import free_port
from tests.support.skip_summary import INSTALL
from tests.system.test_web_browser import WAIT_S, _missing, browser, shot, until

__all__ = ["browser"]  # the fixture, shared with test_web_browser.py

EXAMPLE_DIR = REPO / "examples" / "fastapi_console"
HEADER_BACKGROUND = "rgb(29, 34, 48)"  # header.top in fairq/web/static/console.css

pytestmark = pytest.mark.skipif(_missing() is not None,
                                reason=f"chromium and chromedriver are needed: {INSTALL}")


@dataclass
class Host:
    """The example app's URL, and the lines its process printed (read as they come)."""

    base: str
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def wait_for(self, pattern: str) -> str:
        """The first line matching ``pattern``, once printed (an event, not a sleep)."""
        with self.changed:
            found = self.changed.wait_for(
                lambda: next((x for x in self.lines if re.search(pattern, x)), None),
                timeout=WAIT_S)
        assert found, f"no line {pattern!r} in {self.lines}"
        return found


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    yield a
    a.close()


@pytest.fixture
def host(dsn: str, app: fairq.App) -> Iterator[tuple[Host, dict[str, int]]]:
    """The example app under uvicorn on the test database (tenants noisy, slow, oops with a
    failed job, small); the job ids."""
    ids = scene(app)
    port = free_port()
    env = {**os.environ, "FAIRQ_DATABASE_URL": dsn, "FAIRQ_SCHEMA": "fairq",
           "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", str(EXAMPLE_DIR), "app:app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    running = Host(f"http://127.0.0.1:{port}")

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with running.changed:
                running.lines.append(line.rstrip())
                running.changed.notify_all()
        with running.changed:
            running.lines.append("<exited>")
            running.changed.notify_all()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        running.wait_for(r"Uvicorn running on|<exited>")
        assert proc.poll() is None, running.lines
        yield running, ids
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(10)


def log_in(d: Any, base: str, name: str) -> None:
    """The host's own (toy) login; it lands on the console at /ops/."""
    from selenium.webdriver.common.by import By

    d.delete_all_cookies()
    d.get(base + "/")
    d.find_element(By.ID, "name").send_keys(name)
    d.find_element(By.ID, "password").send_keys(f"{name}-password")
    d.find_element(By.ID, "login").click()
    until(d, lambda: d.find_element(By.ID, "operator").text == name, f"the console as {name}")
    assert d.current_url == base + "/ops/"


def styled(d: Any) -> None:
    """The stylesheet and the script came from /ops/static and apply."""
    assert d.execute_script(
        "return getComputedStyle(document.querySelector('header.top')).backgroundColor"
    ) == HEADER_BACKGROUND
    hrefs = d.execute_script("return Array.from(document.styleSheets, s => s.href)")
    assert hrefs == [d.current_url.split("/ops/")[0] + "/ops/static/console.css"], hrefs
    # console.js marks the headers it sorts in the page.
    assert d.execute_script("return document.querySelectorAll('th.clickable').length") > 0


def test_mounted_console_in_chromium(host: tuple[Host, dict[str, int]], app: fairq.App,
                                     browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    running, ids = host
    base, d = running.base, browser
    log_in(d, base, "olga")
    until(d, lambda: d.find_element(By.ID, "workers-alive").text == "1", "the overview")
    styled(d)
    d.execute_script("window.sessionStorage.setItem('fairq-refresh', 'off')")
    # The links: Tenants, a tenant's page, Jobs, all under /ops.
    d.find_element(By.LINK_TEXT, "Tenants").click()
    until(d, lambda: d.find_elements(By.CSS_SELECTOR, "#tenants tr[data-tenant]"), "the list")
    assert d.current_url == base + "/ops/tenants"
    styled(d)
    d.find_element(By.CSS_SELECTOR, "#tenants a[href='/ops/tenants/noisy']").click()
    until(d, lambda: d.find_element(By.ID, "tenant-name").text == "noisy", "noisy's page")
    assert d.current_url == base + "/ops/tenants/noisy"
    assert d.find_element(By.CSS_SELECTOR, "#explain [data-col=reason]").text == "at_cap"
    shot(d, tmp_path, "mounted-tenant.png")
    d.find_element(By.LINK_TEXT, "Jobs").click()
    until(d, lambda: d.current_url == base + "/ops/jobs", "the jobs page")
    # The jobs' filter form (GET under /ops), then the failed job, retried.
    Select(d.find_element(By.ID, "status-filter")).select_by_value("failed")
    d.find_element(By.CSS_SELECTOR, "form.filters button").click()
    until(d, lambda: "status=failed" in d.current_url, "the filtered jobs")
    assert d.current_url.startswith(base + "/ops/jobs?")
    job = ids["failed"]
    d.find_element(By.CSS_SELECTOR, f"#jobs a[href='/ops/jobs/{job}']").click()
    until(d, lambda: d.find_element(By.ID, "job-status").text == "failed", "the failed job")
    d.find_element(By.ID, "retry").click()
    until(d, lambda: d.find_element(By.ID, "notice").text == "Job queued again.", "the notice")
    assert d.current_url == f"{base}/ops/jobs/{job}?notice=retried"
    assert app.job(job).status == "queued"  # type: ignore[union-attr]
    running.wait_for(rf"operator='olga' action=retry_job job={job}$")
    # A weight changed from a tenant's form.
    d.get(base + "/ops/tenants/small")
    d.find_element(By.ID, "set-weight").send_keys("3.5")
    d.find_element(By.ID, "save").click()
    until(d, lambda: d.find_element(By.ID, "notice").text.startswith("Settings saved"),
          "the settings' notice")
    assert d.current_url.split("#")[0] == base + "/ops/tenants/small?notice=saved"
    assert app.tenants.get("small").weight == 3.5
    d.get(base + "/ops/tenants")
    styled(d)
    shot(d, tmp_path, "mounted-tenants.png")
    # The reader: the same pages without a single action.
    log_in(d, base, "rita")
    d.get(f"{base}/ops/tenants/oops")
    until(d, lambda: d.find_element(By.ID, "tenant-name").text == "oops", "oops's page")
    styled(d)
    assert d.find_element(By.CSS_SELECTOR, ".badge.ro").text == "read-only"
    assert d.find_elements(By.CSS_SELECTOR, "form[method=post], #save, #retry-all") == []
    shot(d, tmp_path, "mounted-reader.png")
    queued = app.enqueue("t", tenant="oops")
    d.get(f"{base}/ops/jobs/{queued}")
    until(d, lambda: d.find_element(By.ID, "job-status").text == "queued", "a queued job")
    assert d.find_elements(By.CSS_SELECTOR, "form[method=post], #cancel") == []
    # Without a login the host's cookie is gone: the console refuses (403).
    d.delete_all_cookies()
    d.get(base + "/ops/tenants")
    assert "you may not see the fairq console" in d.find_element(By.ID, "error").text
