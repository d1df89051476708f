"""``fairq tenants explain`` (text and JSON, one line per queue, bad names exit 2) and the reason
column of ``fairq stats``."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import fairq
from fairq.cli import main
from fairq.policies import get_policy
from fairq.store.workers import register_worker


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    """Tenant a: one running of its cap 1 and one queued in 'default'; one delayed job in
    'mail'. Tenant b: one due job in 'default'. A live worker serves 'default' only."""
    a = fairq.App(dsn)
    a.tenants.set("a", max_running=1)
    a.enqueue("t", tenant="a")
    a.enqueue("t", tenant="a")
    a.enqueue("t", tenant="a", queue="mail", delay=600)
    assert [j.tenant for j in a.store.claim(get_policy("weighted"), queue="default", batch=1,
                                            worker="w")] == ["a"]
    a.enqueue("t", tenant="b")
    register_worker(a.store, "w1", queues=["default"], policy="weighted", beat_seconds=60)
    yield a
    a.close()


def test_text_is_one_line_per_queue(capsys: pytest.CaptureFixture[str], dsn: str,
                                    app: fairq.App) -> None:
    code, out, err = run(capsys, "--dsn", dsn, "tenants", "explain", "a")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "a default: at_cap: 1 running of its cap max_running=1; 1 queued",
        "a mail: no_worker: no live worker serves this queue (1 queued, 0 running)",
    ]
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "explain", "b", "--queue", "default")
    assert out.splitlines() == [
        "b default: waiting_turn: 0 tenant(s) ahead in virtual-time order; 1 due, 0 running"]
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "explain", "nobody")
    assert (code, out) == (0, "nobody -: no_jobs: no queued or running job in any queue\n")


def test_json_has_the_reason_and_the_details(capsys: pytest.CaptureFixture[str], dsn: str,
                                             app: fairq.App) -> None:
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "explain", "a", "--json")
    assert code == 0
    got = json.loads(out)
    assert [(e["queue"], e["reason"]) for e in got] == [("default", "at_cap"),
                                                         ("mail", "no_worker")]
    at_cap = got[0]
    assert (at_cap["running"], at_cap["max_running"], at_cap["cap_is_default"]) == (1, 1, False)
    assert at_cap["workers"] == 1 and at_cap["policies"] == ["weighted"]
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "explain", "a", "--queue", "mail",
                       "--json")
    one = json.loads(out)  # a queue given: one object
    assert one["reason"] == "no_worker" and one["queue"] == "mail" and one["queued"] == 1
    code, out, _ = run(capsys, "--dsn", dsn, "tenants", "explain", "a", "--queue", "nope",
                       "--json")
    assert json.loads(out)["reason"] == "no_jobs"


@pytest.mark.parametrize("argv, message", [
    (("",), "tenant must not be empty"),
    (("a", "--queue", "q" * 201), "queue is 201 characters long; the limit is 200"),
])
def test_a_bad_name_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str],
                                           argv: tuple[str, ...], message: str) -> None:
    # No database: the name is refused before anything connects.
    code, out, err = run(capsys, "--dsn", "postgresql://nobody@127.0.0.1:1/none", "tenants",
                         "explain", *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_stats_shows_the_reason_per_tenant(capsys: pytest.CaptureFixture[str], dsn: str,
                                           app: fairq.App) -> None:
    code, out, _ = run(capsys, "--dsn", dsn, "stats", "--json")
    assert code == 0
    reasons = {(r["queue"], r["tenant"]): r["reason"] for r in json.loads(out)["tenants"]}
    assert reasons == {("default", "a"): "at_cap", ("default", "b"): "waiting_turn",
                       ("mail", "a"): "no_worker"}
    code, out, _ = run(capsys, "--dsn", dsn, "stats")
    header, *lines = out.strip().splitlines()
    assert header.split()[-1] == "reason"
    assert [line.split()[-1] for line in lines[:3]] == ["at_cap", "waiting_turn", "no_worker"]
