"""The CLI's counts match the database: a group counts every tenant in it, configured or known
only by its jobs."""

from __future__ import annotations

import pytest

import fairq
from fairq.cli import main


def test_groups_list_counts_tenants_known_by_their_jobs(
    capsys: pytest.CaptureFixture[str], dsn: str
) -> None:
    with fairq.App(dsn) as app:
        app.groups.set("enterprise", weight=3.0)
        app.tenants.set("big", group="enterprise")
        app.tenants.set("configured", weight=2.0)  # its own settings, the default group
        for tenant in ("configured", "a", "b", "c", "d", "e", "big"):
            app.enqueue("t", tenant=tenant)
            app.enqueue("t", tenant=tenant, queue="other")  # two queues: still one tenant
        counts = {g.name: g.tenants for g in app.groups.list()}
    assert counts == {"default": 6, "enterprise": 1}

    assert main(["--dsn", dsn, "groups", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["default"][2] == "6" and rows["enterprise"][2] == "1"
