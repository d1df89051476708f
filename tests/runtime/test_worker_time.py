"""Policy time through a real worker process: tenants share the worker's time by weight.

Two tenants with equal weights, one with 40 ms jobs and one with 4 ms jobs, both backlogged, one
worker process with 4 slots. Under ``time`` each gets half of the worker time; under
``weighted``, which counts starts, the long one gets 40 / 44 = 91% of it. The worker time of a
job is what its handler measured (the ``timed`` task returns it as its result), counted for the
jobs that started inside a window where both tenants had queued jobs throughout.

The tolerance, 40-60% for ``time``: the engine keeps backlogged tenants' virtual times within
``window + batch * max(c / w)`` seconds (docs/algorithm.md, "Policy time"), here a few batches of
40 ms jobs, under half a second of the ~10 slot-seconds a window holds (< 5%); the rest is what
the expected run time of in-flight jobs misses (4 slots of one 40 ms job each) and the noise of
sleeping on a shared machine. ``weighted`` must stay above 85%: equal starts give 91%, and
sleeps that overshoot by a millisecond would still give 89%.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import fairq
from tests.support.fairtools import sql_rows
from tests.support.paths import REPO, SUPPORT

WORKER = SUPPORT / "worker_proc.py"
LONG, SHORT = 0.040, 0.004
RUN_SECONDS = 5.0


@pytest.fixture
def app(dsn: str) -> Iterator[fairq.App]:
    a = fairq.App(dsn, schema="fairq")
    a.store.set_tenants([], defaults=(1.0, 100))
    yield a
    a.close()


def worker_time_share(app: fairq.App, dsn: str, policy: str) -> tuple[float, dict[str, int]]:
    """Run one worker process under ``policy`` for RUN_SECONDS over a fresh backlog; the long
    tenant's share of the worker time in the window, and the jobs each tenant still had queued
    when the worker stopped."""
    sql_rows(dsn, "TRUNCATE fairq.jobs, fairq.tenant_schedule, fairq.slot_returns, "
                  "fairq.claim_budgets RESTART IDENTITY")
    # Enough for both tenants to stay backlogged under either policy: at most 4 slots / 40 ms
    # and 4 slots / 4 ms jobs a second.
    pairs = [("long", {"seconds": LONG})] * 600 + [("short", {"seconds": SHORT})] * 6000
    app.enqueue_many("timed", pairs)
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), dsn, "--policy", policy, "--concurrency", "4",
         "--poll", "0.5", "--grace", "5"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("READY")
        time.sleep(RUN_SECONDS)
    finally:
        proc.terminate()
        proc.wait(60)
    left = dict(sql_rows(dsn, "SELECT tenant, count(*) FROM fairq.jobs WHERE status = 'queued' "
                              "GROUP BY tenant"))
    # The window: from a second after the first start (the expected run times are learnt from
    # the first finishes) to half a second before the last start (the stop).
    rows = sql_rows(dsn, """
        WITH w AS (SELECT min(started_at) + interval '1 s' AS lo,
                          max(started_at) - interval '0.5 s' AS hi
                   FROM fairq.jobs WHERE started_at IS NOT NULL)
        SELECT j.tenant, sum((j.result #>> '{}')::float8)
        FROM fairq.jobs j, w
        WHERE j.status = 'done' AND j.started_at BETWEEN w.lo AND w.hi
        GROUP BY j.tenant""")
    used = {t: float(s) for t, s in rows}
    assert set(used) == {"long", "short"}, used
    return used["long"] / (used["long"] + used["short"]), left


def test_time_shares_worker_time_where_weighted_shares_starts(app: fairq.App, dsn: str) -> None:
    share, left = worker_time_share(app, dsn, "time")
    print(f"time: long tenant {share:.1%} of the worker time; queued at the stop {left}")
    assert left.get("long", 0) > 0 and left.get("short", 0) > 0, left   # both backlogged
    assert 0.40 <= share <= 0.60, f"time: the 40 ms tenant used {share:.1%} of the worker time"

    share, left = worker_time_share(app, dsn, "weighted")
    print(f"weighted: long tenant {share:.1%} of the worker time; queued at the stop {left}")
    assert left.get("long", 0) > 0 and left.get("short", 0) > 0, left
    assert share >= 0.85, f"weighted: the 40 ms tenant used {share:.1%} of the worker time"
