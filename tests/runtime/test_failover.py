"""Fail-over to a streaming standby (tests/support/pgreplica.py), every client on the multi-host
URL ``postgresql://standby,primary/fq?target_session_attrs=read-write``.

- ``test_old_claims_cannot_write_the_new_primarys_job_of_the_same_id``: after an asynchronous
  fail-over the new primary hands out again the ids (and attempts numbers) of jobs the old one
  made and claimed but never replicated; a worker still holding such a claim must change
  nothing of the new job with the same id (the fence includes the claim's started_at).
- ``test_failover_*``: a producer, two ``fairq worker`` processes and the exporter run while the
  standby is promoted and the old primary dies; then what the clients saw succeed is compared
  with what the new primary holds (tests/support/failover_tools.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import fairq
from fairq import migrate
from fairq.policies import get_policy
from fairq.store import Store
from tests.support import pgcluster, pgreplica

FIFO = get_policy("fifo")


@pytest.fixture
def async_pair(tmp_path: Path) -> Iterator[pgreplica.Pair]:
    if not pgcluster.available():
        pytest.skip("PostgreSQL server binaries are not installed")
    pair = pgreplica.start(tmp_path, mode="async")
    try:
        yield pair
    finally:
        pair.remove()


def new_database(pair: pgreplica.Pair, name: str = "fq") -> str:
    """A database on the primary, migrated through the multi-host URL (the standby first in
    it: the migration must pick the read-write host)."""
    with psycopg.connect(pair.primary.dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = pair.url(name)
    migrate.upgrade(url, "fairq")
    return url


def test_old_claims_cannot_write_the_new_primarys_job_of_the_same_id(
        async_pair: pgreplica.Pair) -> None:
    pair = async_pair
    url = new_database(pair)
    primary_only = url.replace(f"127.0.0.1:{pair.standby.port},", "")
    with fairq.App(url) as app:
        app.enqueue_many("t", [(f"a{n}", {"n": n}) for n in range(5)])
    pgreplica.wait_replayed(pair.primary.dsn, pair.standby.dsn)
    # What the old primary commits from now on never reaches the standby: more jobs than the
    # sequence logs ahead (32), and a worker's claim of every one of them.
    pair.stop_standby()
    with fairq.App(primary_only) as app:
        app.enqueue_many("t", [(f"a{n % 20}", {"n": n}) for n in range(5, 105)])
    old_store = Store(primary_only, "fairq")
    try:
        old_claims = old_store.claim(FIFO, queue="default", batch=200, worker="old")
    finally:
        old_store.close()
    assert len(old_claims) == 105
    pair.kill_primary()
    pair.start_standby()
    pair.promote()

    new_store = Store(url, "fairq")  # the same URL: it now reaches the promoted standby
    try:
        with fairq.App(url) as app:
            reissued = app.enqueue_many("t", [(f"b{n % 20}", {"n": n}) for n in range(100)])
        new_claims = new_store.claim(FIFO, queue="default", batch=300, worker="new")
        assert len(new_claims) == 105  # the 5 jobs that replicated, and the 100 new ones
        by_id = {c.id: c for c in new_claims}
        # The hazard is real: the same (id, attempts) names an old claim and a new one.
        same = [o for o in old_claims if o.id in reissued and by_id[o.id].attempts == o.attempts]
        assert len(same) >= 30, (len(same), [o.id for o in old_claims][:5], reissued[:5])
        pairs = [(o.id, o.attempts) for o in same]
        started = [o.started_at for o in same]
        assert all(by_id[o.id].started_at != o.started_at for o in same)
        # Fenced on attempts alone (as before), the old claims would reach the new jobs.
        assert new_store.extend_leases(pairs) == {o.id for o in same}
        # Fenced on the claim's started_at too, they change nothing.
        assert new_store.extend_leases(pairs, started=started) == set()
        assert new_store.finish_done(pairs, started=started) == []
        assert new_store.finish_failed([(i, a, "stale", None) for i, a in pairs],
                                       started=started) == []
        assert new_store.release_unstarted(pairs, started=started) == set()
        with psycopg.connect(url, autocommit=True) as c:
            rows = c.execute("SELECT count(*) FROM fairq.jobs WHERE id = ANY(%s) "
                             "AND status = 'running' AND attempts = 1",
                             ([o.id for o in same],)).fetchone()
        assert rows == (len(same),)
        # The new primary's own claims are untouched, and finish.
        done = new_store.finish_done([(c.id, c.attempts) for c in new_claims],
                                     started=[c.started_at for c in new_claims])
        assert len(done) == len(new_claims)
    finally:
        new_store.close()
