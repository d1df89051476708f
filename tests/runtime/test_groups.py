"""Tenant groups: weights at two levels (a group's share among groups, its tenants' within it).

The shares are counted on the database's own record (each claimed job's tenant), from claims
through the store and from real worker processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fairq
from fairq.admin.tenant_file import load_tenant_file_with_groups
from fairq.cli import main
from fairq.errors import InvalidInput
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.fairtools import fill, running_mismatch, sql_rows
from tests.support.paths import REPO, SUPPORT

WORKER = SUPPORT / "worker_proc.py"
BIG = 100_000


@pytest.fixture
def app(dsn: str) -> Any:
    a = fairq.App(dsn, schema="fairq")
    a.store.set_tenants([], defaults=(1.0, BIG))
    yield a
    a.close()


def drain(store: Store, jobs: int, policy: str = "weighted", batch: int = 1) -> Counter[str]:
    """Claim (and finish) ``jobs`` jobs one claim after another; the tenants served."""
    pol = get_policy(policy)
    got: Counter[str] = Counter()
    while sum(got.values()) < jobs:
        claimed = store.claim(pol, queue="default", batch=batch, worker="w")
        assert claimed, "an empty claim while every tenant had work"
        got.update(j.tenant for j in claimed)
        store.finish_done([(j.id, j.attempts) for j in claimed])
    return got


def five_and_one(app: fairq.App) -> None:
    app.groups.set("enterprise", weight=3.0)
    app.groups.set("pro", weight=1.0)
    for i in range(5):
        app.tenants.set(f"e{i}", group="enterprise")
    app.tenants.set("p0", group="pro")


@pytest.mark.parametrize("policy", ["weighted", "drr"])
def test_groups_three_to_one_with_five_and_one_tenants(
        app: fairq.App, store: Store, dsn: str, policy: str) -> None:
    five_and_one(app)
    fill(store, {**{f"e{i}": 400 for i in range(5)}, "p0": 400}, interleave=True)
    got = drain(store, 1200, policy)
    enterprise = sum(n for t, n in got.items() if t.startswith("e"))
    assert 0.70 <= enterprise / 1200 <= 0.80, got
    for i in range(5):                                   # evenly within the group
        assert 0.13 <= got[f"e{i}"] / 1200 <= 0.17, got
    assert running_mismatch(dsn) == []


def test_a_group_does_not_grow_with_its_number_of_tenants(app: fairq.App, store: Store) -> None:
    """Ungrouped tenants are one group ('default', weight 1): ten of them against one tenant of
    a group of weight 1 share half and half, not ten to one."""
    app.groups.set("solo", weight=1.0)
    app.tenants.set("s", group="solo")
    fill(store, {"s": 600, **{f"d{i}": 100 for i in range(10)}}, interleave=True)
    got = drain(store, 600, batch=4)
    assert 0.45 <= got["s"] / 600 <= 0.55, got


def test_a_group_with_one_idle_tenant_does_not_lose_its_share(app: fairq.App, store: Store) -> None:
    app.groups.set("a", weight=1.0)
    app.groups.set("b", weight=1.0)
    app.tenants.set("a_busy", group="a")
    app.tenants.set("a_idle", group="a")
    for t in ("b1", "b2", "b3"):
        app.tenants.set(t, group="b")
    fill(store, {"a_idle": 1})
    drain(store, 1)                           # a_idle has run and is idle now
    time.sleep(1.1)                           # past the factors' refresh interval
    fill(store, {"a_busy": 600, "b1": 200, "b2": 200, "b3": 200}, interleave=True)
    got = drain(store, 800)
    assert 0.45 <= got["a_busy"] / 800 <= 0.55, got
    assert got["a_idle"] == 0


def test_a_group_weight_change_applies_to_the_next_claims(app: fairq.App, store: Store) -> None:
    five_and_one(app)
    fill(store, {**{f"e{i}": 400 for i in range(5)}, "p0": 800}, interleave=True)
    drain(store, 200)
    app.groups.set("pro", weight=3.0)         # now 1:1
    got = drain(store, 800)
    assert 0.45 <= got["p0"] / 800 <= 0.55, got


def test_caps_and_rates_stay_per_tenant_inside_a_group(app: fairq.App, store: Store) -> None:
    five_and_one(app)
    app.tenants.set("e0", max_running=2)
    app.tenants.set("e1", rate=0.01, burst=3)
    fill(store, {f"e{i}": 50 for i in range(5)} | {"p0": 50})
    pol = get_policy("weighted")
    got: Counter[str] = Counter()
    for _ in range(40):
        got.update(j.tenant for j in store.claim(pol, queue="default", batch=5, worker="w"))
    assert got["e0"] == 2 and got["e1"] == 3


def test_groups_through_two_worker_processes(app: fairq.App, dsn: str) -> None:
    five_and_one(app)
    job = {"seconds": 0.01}
    pairs = [(f"e{i}", job) for _ in range(300) for i in range(5)] + [("p0", job)] * 1500
    app.enqueue_many("sleepy", pairs)
    procs = [subprocess.Popen(
        [sys.executable, str(WORKER), dsn, "--policy", "weighted", "--concurrency", "4",
         "--batch", "2", "--poll", "0.5", "--grace", "5"], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, cwd=REPO) for _ in range(2)]
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            (n,) = sql_rows(dsn, "SELECT count(*) FROM fairq.jobs WHERE started_at IS NOT NULL")[0]
            if n >= 1000:
                break
            time.sleep(0.2)
        rows = sql_rows(dsn, "SELECT tenant, count(*) FROM (SELECT tenant FROM fairq.jobs "
                             "WHERE started_at IS NOT NULL ORDER BY started_at, id LIMIT 1000) s "
                             "GROUP BY tenant")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    got = dict(rows)
    assert sum(got.values()) == 1000, got
    enterprise = sum(n for t, n in got.items() if t.startswith("e"))
    assert 0.70 <= enterprise / 1000 <= 0.80, got
    for i in range(5):
        assert 0.12 <= got.get(f"e{i}", 0) / 1000 <= 0.18, got


# -- configuration ----------------------------------------------------------------------------
def test_groups_api(app: fairq.App) -> None:
    assert [(g.name, g.weight, g.configured) for g in app.groups.list()] == [("default", 1.0, False)]
    app.groups.set("enterprise", weight=3.0)
    t = app.tenants.set("acme", group="enterprise")
    assert t.group == "enterprise"
    assert app.tenants.set("acme", weight=2.0).group == "enterprise"   # kept
    assert app.groups.get("enterprise").tenants == 1
    assert app.tenants.set("acme", group=None).group is None           # back to 'default'
    with pytest.raises(InvalidInput):
        app.tenants.set("acme", group="nope")
    for bad in (0, -1.0, float("nan"), 1e9, "3"):
        with pytest.raises(InvalidInput):
            app.groups.set("g", weight=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        app.groups.set("", weight=1.0)
    with pytest.raises(InvalidInput):
        app.groups.get("nope")


def test_toml_groups(tmp_path: Path, app: fairq.App) -> None:
    f = tmp_path / "t.toml"
    f.write_text('[groups.enterprise]\nweight = 3.0\n[tenants.acme]\ngroup = "enterprise"\n'
                 '[tenants.globex]\nweight = 2\n')
    _, tenants, groups = load_tenant_file_with_groups(f)
    assert [(g.name, g.weight) for g in groups] == [("enterprise", 3.0)]
    assert {t.tenant: t.group for t in tenants} == {"acme": "enterprise", "globex": None}
    app.tenants.apply(f)
    assert app.tenants.get("acme").group == "enterprise"
    assert app.groups.get("enterprise").weight == 3.0
    for text in ('[tenants.acme]\ngroup = "nope"\n', '[groups.g]\nweight = 0\n',
                 '[groups.g]\nspeed = 1\n', '[tenants.acme]\ngroup = 3\n', 'groups = 1\n'):
        f.write_text(text)
        with pytest.raises(InvalidInput):
            load_tenant_file_with_groups(f)


def test_cli_groups(capsys: pytest.CaptureFixture[str], dsn: str) -> None:
    assert main(["--dsn", dsn, "groups", "set", "enterprise", "--weight", "3"]) == 0
    assert main(["--dsn", dsn, "tenants", "set", "acme", "--group", "enterprise"]) == 0
    assert "group=enterprise" in capsys.readouterr().out
    assert main(["--dsn", dsn, "groups", "list", "--json"]) == 0
    groups = {g["name"]: g for g in json.loads(capsys.readouterr().out)}
    assert groups["enterprise"]["weight"] == 3.0 and groups["enterprise"]["tenants"] == 1
    for bad in (["groups", "set", "g", "--weight", "0"], ["groups", "set", "g"],
                ["tenants", "set", "acme", "--group", "nope"]):
        assert main(["--dsn", dsn, *bad]) == 2, bad
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err


# -- the reference model ----------------------------------------------------------------------
def _model_shares(groups: dict[str, float], members: dict[str, str | None], backlog: dict[str, int],
                  claims: int, idle: tuple[str, ...] = ()) -> Counter[str]:
    from tests.support.policy_model import ModelJob, QueueModel

    m = QueueModel(default_max_running=BIG)
    for g, w in groups.items():
        m.set_group(g, w)
    for t, g in members.items():
        m.set_tenant_group(t, g)
    ids = iter(range(1, 10**9))
    for t in idle:                       # known, ran once, idle now
        m.enqueue(ModelJob(next(ids), t), now=0.0)
        for j in m.claim(get_policy("weighted"), 1, now=0.0):
            m.finish(j)
    m.enqueue_many([ModelJob(next(ids), t) for t, n in backlog.items() for _ in range(n)], now=0.0)
    m.refresh_groups()
    got: Counter[str] = Counter()
    for _ in range(claims):
        for j in m.claim(get_policy("weighted"), 1, now=0.0):
            got[m.running[j].tenant] += 1
            m.finish(j)
    return got


def test_model_three_to_one_with_five_and_one_tenants() -> None:
    members = {f"e{i}": "enterprise" for i in range(5)} | {"p0": "pro"}
    got = _model_shares({"enterprise": 3.0, "pro": 1.0}, members,
                        dict.fromkeys(members, 1000), 1200)
    assert sum(n for t, n in got.items() if t.startswith("e")) == 900      # 75% exactly
    assert all(got[f"e{i}"] == 180 for i in range(5))


def test_model_an_idle_tenant_does_not_cost_its_group_its_share() -> None:
    members = {"a_busy": "a", "a_idle": "a", "b1": "b", "b2": "b", "b3": "b"}
    got = _model_shares({"a": 1.0, "b": 1.0}, members,
                        {"a_busy": 1000, "b1": 1000, "b2": 1000, "b3": 1000}, 800, idle=("a_idle",))
    assert got["a_busy"] == 400


def test_the_exporter_shows_each_groups_share_against_its_weight(
        app: fairq.App, store: Store) -> None:
    from prometheus_client import CollectorRegistry

    from fairq.metrics.exporter import DatabaseCollector

    five_and_one(app)
    fill(store, {**{f"e{i}": 400 for i in range(5)}, "p0": 400}, interleave=True)
    c = DatabaseCollector(app.dsn, "fairq", max_tenants=50, interval=0, window=300)
    try:
        registry = CollectorRegistry()
        registry.register(c)
        registry.get_sample_value("fairq_exporter_up")      # the window's first snapshot
        drain(store, 1200)

        def value(name: str, group: str) -> float | None:
            return registry.get_sample_value(name, {"queue": "default", "group": group})

        assert value("fairq_group_weight_share", "enterprise") == 0.75
        assert value("fairq_group_weight_share", "pro") == 0.25
        assert 0.70 <= (value("fairq_group_claim_share", "enterprise") or 0) <= 0.80
        # the tenants' fairness is judged against their weights in their groups
        err = registry.get_sample_value("fairq_fairness_max_share_error", {"queue": "default"})
        assert err is not None and err < 0.05
    finally:
        c.close()


def test_stats_show_groups_rates_and_weight_shares_within_groups(app: fairq.App, store: Store) -> None:
    from fairq.metrics.stats import tenant_stats

    five_and_one(app)
    app.tenants.set("p0", rate=0.01, burst=5)
    fill(store, {**{f"e{i}": 10 for i in range(5)}, "p0": 10})
    got = {s.tenant: s for s in tenant_stats(app)}
    assert got["e0"].tenant_group == "enterprise" and got["p0"].tenant_group == "pro"
    assert got["e0"].weight_share == pytest.approx(0.15)
    assert got["p0"].weight_share == pytest.approx(0.25)
    assert got["p0"].rate == 0.01 and got["p0"].tokens == pytest.approx(5.0)
    assert got["e0"].rate is None
