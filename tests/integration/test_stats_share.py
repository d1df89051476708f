"""`fairq stats` and the dashboards count the same tenants in a share of weight: those with due
or running jobs now (dashboards/generate.py's weight_share)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import fairq
from fairq.metrics.stats import tenant_stats
from tests.support.db import SCHEMA
from tests.support.paths import REPO


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema=SCHEMA)
    yield a
    a.close()


def test_a_recently_idle_tenant_has_no_weight_share(app: fairq.App, dsn: str) -> None:
    app.tenants.set("whale", weight=1.0)
    app.tenants.set("small", weight=6.0)
    for _ in range(5):
        app.enqueue("t", tenant="whale")
    small = app.enqueue("t", tenant="small")
    app.enqueue("t", tenant="later", delay=3600)  # only a delayed job: competes for nothing
    with psycopg.connect(dsn, autocommit=True) as conn:  # small ran a moment ago, now idle
        conn.execute("UPDATE fairq.jobs SET status = 'done', started_at = now(), "
                     "finished_at = now() WHERE id = %s", (small,))

    rows = {s.tenant: s for s in tenant_stats(app)}

    assert rows["small"].recent_claims == 1 and not rows["small"].active
    assert rows["small"].weight_share is None and rows["later"].weight_share is None
    assert rows["whale"].weight_share == pytest.approx(1.0)  # not 1/7: small is not competing
    generate = (REPO / "dashboards" / "generate.py").read_text()
    assert "due or running" in generate  # the dashboards' definition, stated where it is built
