"""The console's pure parts: the SVG chart's coordinates, the list's query and the action
fields checked as the CLI checks them, and JSON values."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from fairq.errors import InvalidInput
from fairq.web import charts, data


def test_chart_scales_and_gaps() -> None:
    c = charts.wait_and_share(["a", "b", "c", "d"], [None, 2.0, 7.0, None], [0.5, None, 1.0, 0.0])
    wait, share = c.series
    assert wait.top == 10.0 and share.top == 100.0
    assert len(wait.dots) == 2 and len(share.dots) == 3  # a bucket without claims: no point
    bottom = charts.HEIGHT - charts.BOTTOM
    assert share.dots[-1][1] == bottom and share.dots[1][1] == charts.TOP  # 0% and 100%
    assert wait.dots[0][0] < wait.dots[1][0]
    assert not c.empty
    assert charts.wait_and_share(["a"], [None], [None]).empty


@pytest.mark.parametrize("top,nice", [(0.0, 1.0), (0.3, 0.5), (3.0, 5.0), (42.0, 50.0),
                                      (120.0, 200.0)])
def test_nice_tops(top: float, nice: float) -> None:
    assert charts._nice(top) == nice


def test_tenant_query() -> None:
    q = data.TenantQuery.parse({"q": "acme", "sort": "weight", "order": "desc", "page": "3",
                                "per_page": "100", "queue": "emails"})
    assert (q.search, q.sort, q.desc, q.page, q.per_page, q.queue) == (
        "acme", "weight", True, 3, 100, "emails")
    assert data.TenantQuery.parse({}) == data.TenantQuery()
    for bad, match in (({"sort": "reason"}, "computed for the page only"),
                       ({"order": "up"}, "asc or desc"), ({"page": "0"}, "page"),
                       ({"per_page": "5000"}, "per_page"), ({"page": "x"}, "integer"),
                       ({"queue": "q" * 201}, "limit is 200")):
        with pytest.raises(InvalidInput, match=match):
            data.TenantQuery.parse(bad)


def test_tenant_settings_are_checked_like_the_cli() -> None:
    """The form and the JSON become one patch, checked by fairq.validation.tenant_patch."""
    p, version = data.patch_from("acme", {"weight": "2.5", "max_running": "", "rate": "",
                                          "csrf": "x", "version": "3"}, form=True)
    assert (p.fields, p.weight, version) == ({"weight"}, 2.5, 3)
    assert data.patch_from("acme", {"rate": "unlimited"}, form=True)[0].rate is None
    assert data.patch_from("acme", {"rate": None}, form=False)[0].rate is None  # JSON null
    assert data.patch_from("acme", {"max_running": 0}, form=False)[0].max_running == 0
    for bad, match, form in (({}, "give at least one", True),
                             ({"weight": "0"}, "weight must be between", True),
                             ({"weight": "nan"}, "weight", True), ({"weight": True}, "number", False),
                             ({"max_running": "-1"}, "max_running", True), ({"rate": "fast"}, "number", True),
                             ({"rate": "0"}, "rate must be between", True),
                             ({"weight": 2, "bogus": 1}, "unknown tenant setting", False),
                             ({"weight": 2, "version": "1"}, "unknown tenant setting", False)):
        with pytest.raises(InvalidInput, match=match):
            data.patch_from("acme", bad, form=form)


def test_job_filters_and_ids() -> None:
    assert data.job_filters({"status": "failed", "tenant": "acme"}) == {
        "status": "failed", "tenant": "acme", "task": None, "queue": None, "limit": 100}
    with pytest.raises(InvalidInput, match="status must be one of"):
        data.job_filters({"status": "lost"})
    with pytest.raises(InvalidInput):
        data.job_id("0")
    assert data.job_id("42") == 42


def test_jsonable() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert data.jsonable({"at": at, "x": (1, math.inf), 2: [math.nan]}) == {
        "at": "2026-01-02T03:04:05+00:00", "x": [1, None], "2": [None]}
