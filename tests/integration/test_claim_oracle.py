"""The claim engine checked from outside, against the database, with concurrent claimers.

A Hypothesis state machine, one per policy, on a queue of its own per example: it enqueues jobs
for a small set of tenants (due now, in the past, a fraction of a second ahead, an hour ahead;
various priorities, costs and counts), adds crowds of one-job tenants, finishes or fails running
jobs, cancels queued ones, changes tenants' weights and caps (0 = paused), waits for short
delays to fall due, and runs rounds of 2-3 claimers that a barrier releases together, each with
its own Store (pool and claim hints) and a random batch size ("drain" repeats rounds, finishing
what was claimed, until a round gets nothing). The only model is the bookkeeping of what each
call returned; every check reads the database with plain SQL:

* no id is returned twice in a round (nor twice by one claim), and every returned row is
  `running` with attempts + 1;
* a round never claims past a tenant's cap; after every step each tenant's count of `running`
  jobs is <= its max_running (or, after the cap was lowered below it, no more than before), the
  schedule's cap is the configured one, and tenant_schedule.running equals the count exactly;
* work conservation: at a quiescent point (no claim in flight: after each round, a drain, a bulk
  claim, or as a step of its own), if a claimable job exists (queued, run_at <= now(), its
  tenant's running count below a cap > 0: read from `jobs` and the cap, not from the schedule's
  `active` flag), a claim of batch 1 must return a job; and a round in which every claimer came
  back empty must not have left a job that was claimable before and after it;
* no job is lost: the queue's ids, statuses and attempts are exactly those the calls imply.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fairq.models import ClaimedJob, NewJob, TenantConfig
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.db import SCHEMA, create_database, drop_database, dsn_for_db
from tests.support.fairtools import keep_pristine_copy, restore_pristine

TENANTS = ["a", "b", "c", "d", "e"]
DEFAULTS = (1.0, 3)         # weight, max_running of tenants never configured
MAX_ATTEMPTS = 3
SHORT_DELAY = 0.25          # seconds: "delayed a fraction of a second"
CLAIMERS = 3                # stores, one per concurrent claimer
BATCHES = st.sampled_from([1, 1, 2, 3, 5, 8, 32])
DRAIN_ROUNDS = 8
CROWD = 200                 # one-job tenants: more than one claim's scans of idle tenants
ROUND_TIMEOUT = 30.0

# When a job is due: now, 10 minutes ago (run_at), SHORT_DELAY or an hour from now (delay).
TIMINGS = ["now", "now", "now", "past", "short", "future"]
# Picks among the jobs of a status, drawn before the rule sees them: every draw is made whatever
# the concurrent claims returned, so a replay draws the same (see the settings below).
PICKS = st.lists(st.integers(0, 10**6), min_size=1, max_size=6)


def fmt_claim(j: ClaimedJob) -> str:
    return f"{j.id}({j.tenant})"


def short(items: list[str], n: int = 8) -> str:
    return ", ".join(items[:n]) + (f" ... ({len(items)} in all)" if len(items) > n else "")


def describe(claimable: list[tuple[Any, ...]]) -> str:
    """Claimable jobs (rows of ``claimable()``) by tenant, with the tenant's schedule row."""
    by_tenant: dict[str, list[tuple[Any, ...]]] = {}
    for r in claimable:
        by_tenant.setdefault(r[1], []).append(r)
    shown = "; ".join(
        f"tenant {t}: {len(rs)} job(s) (ids {short([str(r[0]) for r in rs], 5)}; running "
        f"{rs[0][6]}/{rs[0][3]}; schedule active={rs[0][4]} wake_at={rs[0][5]})"
        for t, rs in list(by_tenant.items())[:4])
    return shown + (f"; and {len(by_tenant) - 4} more tenant(s)" if len(by_tenant) > 4 else "")


def make_machine(stores: list[Store], conn: psycopg.Connection[Any], policy_name: str,
                 stats: Counter[str], failures: list[str]) -> type[RuleBasedStateMachine]:
    policy = get_policy(policy_name)
    driver = stores[0]

    def rows(query: str, params: Any = None) -> list[tuple[Any, ...]]:
        return conn.execute(query, params).fetchall()

    def recorded(fn: Callable[..., None]) -> Callable[..., None]:
        """Keep the first failure's message: Hypothesis replays a failing example to report it,
        and with concurrent claims the replay can fail elsewhere or not at all (a Flaky error)."""
        @functools.wraps(fn)
        def step(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                fn(self, *args, **kwargs)
            except Exception as exc:
                steps = " | ".join(getattr(self, "log", [])[-12:])
                failures.append(f"{type(exc).__name__} in {fn.__name__}: {exc}"
                                + ("" if "steps:" in str(exc) else f"\nsteps: {steps}"))
                raise
        return step

    class ClaimOracle(RuleBasedStateMachine):
        @initialize(backlog=st.lists(st.tuples(st.sampled_from(TENANTS), st.sampled_from([1, 2, 5, 12]),
                                               st.sampled_from(TIMINGS)), min_size=1, max_size=4))
        @recorded
        def reset(self, backlog: list[tuple[str, int, str]]) -> None:
            # A queue of its own per example (cheaper than TRUNCATE); tenants' settings are global.
            stats["examples"] += 1
            self.queue = f"q{stats['examples']}"
            conn.execute("DELETE FROM fairq.tenants")
            driver.set_tenants([], defaults=DEFAULTS)
            # What the calls imply: id -> [tenant, status, attempts].
            self.jobs: dict[int, list[Any]] = {}
            self.config: dict[str, tuple[float, int]] = {}
            # Per tenant, the most running jobs allowed: its cap, or more while a cap lowered
            # below the running count drains (claims may then add none).
            self.ceiling: dict[str, int] = {}
            self.log: list[str] = []
            self.crowds = 0
            for tenant, n, timing in backlog:
                self.add_jobs(tenant, n, timing=timing)

        # -- helpers ------------------------------------------------------------------------
        def cap(self, tenant: str) -> int:
            return self.config.get(tenant, DEFAULTS)[1]

        def ids(self, status: str) -> list[int]:
            return sorted(i for i, (_, s, _) in self.jobs.items() if s == status)

        def running_counts(self) -> dict[str, int]:
            return dict(rows("SELECT tenant, count(*) FROM fairq.jobs WHERE queue = %s "
                             "AND status = 'running' GROUP BY 1", (self.queue,)))

        def record_claims(self, got: list[ClaimedJob], who: str) -> None:
            """Check a finished claim's rows in the database and book the jobs as running."""
            ids = [j.id for j in got]
            assert len(set(ids)) == len(ids), f"{who}: a claim returned an id twice: {ids}"
            db = {r[0]: r[1:] for r in rows(
                "SELECT id, status, attempts, tenant FROM fairq.jobs WHERE id = ANY(%s)", (ids,))}
            for j in got:
                assert j.id in self.jobs, f"{who}: claimed job {j.id} that was never enqueued"
                tenant, status, attempts = self.jobs[j.id]
                assert status == "queued", f"{who}: claimed job {fmt_claim(j)} that was {status}"
                assert j.tenant == tenant and j.attempts == attempts + 1, (
                    f"{who}: job {j.id} came back as tenant {j.tenant} attempt {j.attempts}, "
                    f"expected tenant {tenant} attempt {attempts + 1}")
                assert db.get(j.id) == ("running", attempts + 1, tenant), (
                    f"{who}: claimed job {j.id} is {db.get(j.id)} in the database, "
                    f"expected ('running', {attempts + 1}, {tenant!r})")
                self.jobs[j.id] = [tenant, "running", attempts + 1]

        def quiescent_check(self, where: str) -> None:
            """No claim in flight: if a job is claimable, a claim of batch 1 must return one."""
            claimable = self.claimable()
            if not claimable:
                return
            stats["quiescent_checks"] += 1
            got = driver.claim(policy, queue=self.queue, batch=1, worker="quiescent")
            if not got:
                self.empty_claim(f"after {where}, a claim of batch 1", claimable)
            stats["quiescent_claimed"] += 1
            self.record_claims(got, "quiescent claim")
            self.log.append(f"quiescent claim -> {[fmt_claim(j) for j in got]}")

        def empty_claim(self, what: str, claimable: list[tuple[Any, ...]]) -> NoReturn:
            """Fail: `what` returned nothing while `claimable` (rows of claimable()) were."""
            (idle,) = rows(
                "SELECT count(*) FROM fairq.tenant_schedule ts WHERE ts.queue = %(q)s AND ts.active "
                "AND NOT EXISTS (SELECT FROM fairq.jobs j WHERE j.queue = %(q)s "
                "AND j.tenant = ts.tenant AND j.status = 'queued' AND j.run_at <= now())",
                {"q": self.queue})[0]
            raise AssertionError(
                f"{policy_name}: {what} returned nothing while {len(claimable)} job(s) were "
                f"claimable: {describe(claimable)} [{idle} tenant(s) with no due job are active "
                "in tenant_schedule]\nsteps: " + " | ".join(self.log[-12:]))

        def add_jobs(self, tenant: str, n: int, *, timing: str = "now", priority: int = 0,
                     cost: float = 1.0, max_attempts: int = MAX_ATTEMPTS) -> None:
            run_at = datetime.now(UTC) - timedelta(minutes=10) if timing == "past" else None
            delay = {"short": SHORT_DELAY, "future": 3600.0}.get(timing)
            job = NewJob("t", tenant, "{}", queue=self.queue, priority=priority, cost=cost,
                         run_at=run_at, delay=delay, max_attempts=max_attempts)
            ids = driver.enqueue([job] * n)
            assert len(ids) == n and not set(ids) & set(self.jobs), ids
            for i in ids:
                self.jobs[i] = [tenant, "queued", 0]
            stats["enqueued"] += n
            self.log.append(f"enqueue {n}x{tenant} p{priority} {timing} -> {ids[0]}..{ids[-1]}")

        # -- rules --------------------------------------------------------------------------
        @rule(tenant=st.sampled_from(TENANTS), n=st.sampled_from([1, 1, 1, 2, 3, 6, 12]),
              priority=st.sampled_from([0, 0, 0, 1, 5]), timing=st.sampled_from(TIMINGS),
              cost=st.sampled_from([1.0, 1.0, 3.0]), max_attempts=st.sampled_from([1, MAX_ATTEMPTS]))
        @recorded
        def enqueue(self, tenant: str, n: int, priority: int, timing: str, cost: float,
                    max_attempts: int) -> None:
            self.add_jobs(tenant, n, timing=timing, priority=priority, cost=cost,
                          max_attempts=max_attempts)

        @precondition(lambda self: self.crowds < 2 * CROWD)
        @rule(n=st.sampled_from([20, CROWD]), then=st.sampled_from(["wait", "claim", "run"]))
        @recorded
        def crowd(self, n: int, then: str) -> None:
            """Many tenants with one job each (named to sort before the small set's). Then the
            jobs wait, or one claim takes them (and they may run to the end): the tenants are
            left with nothing to run."""
            tenants = [f"0{self.crowds + i:04d}" for i in range(n)]
            self.crowds += n
            ids = driver.enqueue([NewJob("t", t, "{}", queue=self.queue) for t in tenants])
            assert len(ids) == n, ids
            for i, t in zip(ids, tenants, strict=True):
                self.jobs[i] = [t, "queued", 0]
            stats["enqueued"] += n
            self.log.append(f"crowd of {n} one-job tenants -> {ids[0]}..{ids[-1]}, then {then}")
            if then in ("claim", "run"):
                got = driver.claim(policy, queue=self.queue, batch=n, worker="bulk")
                if not got:
                    self.empty_claim(f"a claim of batch {n} after the crowd", self.claimable())
                self.record_claims(got, "bulk claim")
                self.log.append(f"bulk claim -> {len(got)} jobs")
                if then == "run":
                    self.finish_jobs([j.id for j in got])
                self.quiescent_check(f"a claim of batch {n} that took {len(got)} jobs")

        def claimable(self) -> list[tuple[Any, ...]]:
            """Queued, due jobs whose tenant is below a cap > 0, from `jobs` and the cap (not the
            schedule's `active`), as (id, tenant, run_at, cap, active, wake_at, running) rows.
            Three single-table reads joined here: no plan over unanalyzed tables to go wrong."""
            due = rows("SELECT id, tenant, run_at FROM fairq.jobs WHERE queue = %s "
                       "AND status = 'queued' AND run_at <= now() ORDER BY tenant, id", (self.queue,))
            if not due:
                return []
            running = self.running_counts()
            sched = {t: (m, a, w) for t, m, a, w in rows(
                "SELECT tenant, max_running, active, wake_at FROM fairq.tenant_schedule "
                "WHERE queue = %s", (self.queue,))}
            out = []
            for i, t, run_at in due:
                cap, active, wake_at = sched[t]
                if cap > 0 and running.get(t, 0) < cap:
                    out.append((i, t, run_at, cap, active, wake_at, running.get(t, 0)))
            return out

        @rule(k=st.integers(2, CLAIMERS), batches=st.lists(BATCHES, min_size=CLAIMERS, max_size=CLAIMERS))
        @recorded
        def concurrent_claims(self, k: int, batches: list[int]) -> None:
            self.round(k, batches)
            self.quiescent_check(f"a round of {k} claimers (batches {batches[:k]})")

        @rule(rounds=st.lists(st.lists(BATCHES, min_size=CLAIMERS, max_size=CLAIMERS),
                              min_size=DRAIN_ROUNDS, max_size=DRAIN_ROUNDS))
        @recorded
        def drain(self, rounds: list[list[int]]) -> None:
            """Claimers finish what they hold and claim together again, until a round gets nothing."""
            for batches in rounds:
                self.finish_jobs(self.ids("running"))
                got = self.round(CLAIMERS, batches)
                self.no_job_lost()
                self.caps_hold_and_running_counts_are_exact()
                if not got:
                    break
            self.quiescent_check("a drain by concurrent claimers")

        def round(self, k: int, batches: list[int]) -> int:
            """k claimers released together; checks the round and returns how many jobs it claimed."""
            before = self.running_counts()
            caps = dict(rows("SELECT tenant, max_running FROM fairq.tenant_schedule WHERE queue = %s",
                             (self.queue,)))
            claimable_before = {r[0]: r for r in self.claimable()}
            barrier = threading.Barrier(k)
            results: dict[int, list[ClaimedJob]] = {}
            errors: list[str] = []

            def claimer(n: int) -> None:
                try:
                    barrier.wait(ROUND_TIMEOUT)
                    results[n] = stores[n].claim(policy, queue=self.queue, batch=batches[n],
                                                 worker=f"claimer{n}")
                except Exception as exc:  # reported by the assertion below
                    errors.append(f"claimer{n}: {type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=claimer, args=(n,)) for n in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(ROUND_TIMEOUT)
            assert not any(t.is_alive() for t in threads), "a claimer hung"
            assert errors == [], errors
            summary = {n: short([fmt_claim(j) for j in results[n]]) for n in range(k)}
            self.log.append(f"round of {k} batches {batches[:k]} -> {summary}")
            owners: dict[int, list[int]] = {}
            for n in range(k):
                assert len(results[n]) <= batches[n], f"claimer{n} got more than its batch: {summary}"
                for j in results[n]:
                    owners.setdefault(j.id, []).append(n)
            twice = {i: ns for i, ns in owners.items() if len(ns) > 1}
            assert not twice, f"jobs returned to more than one claimer {twice}: {summary}"
            for n in range(k):
                self.record_claims(results[n], f"claimer{n}")
            per_tenant = Counter(j.tenant for n in range(k) for j in results[n])
            for tenant, added in per_tenant.items():
                room = max(0, caps.get(tenant, 0) - before.get(tenant, 0))
                assert added <= room, (
                    f"round claimed {added} job(s) of tenant {tenant} with running "
                    f"{before.get(tenant, 0)} and cap {caps.get(tenant)}: {summary}")
            got = sum(len(r) for r in results.values())
            if not got:
                # Nobody got anything, so nothing changed: work claimable before and after the
                # round was claimable all along, and every claimer came back empty beside it.
                missed = [claimable_before[r[0]] for r in self.claimable() if r[0] in claimable_before]
                if missed:
                    self.empty_claim(f"a round of {k} claimers (batches {batches[:k]}: every one "
                                     "of them, with work claimable before and after it)", missed)
            stats["rounds"] += 1
            stats["round_claimed"] += got
            if sum(1 for r in results.values() if r) >= 2:
                stats["rounds_with_two_winners"] += 1
            return got

        @rule()
        @recorded
        def quiescent_claim(self) -> None:
            self.quiescent_check("a quiescent point")

        def pick(self, status: str, picks: list[int]) -> list[int]:
            ids = self.ids(status)
            return sorted({ids[p % len(ids)] for p in picks}) if ids else []

        @rule(picks=PICKS)
        @recorded
        def finish(self, picks: list[int]) -> None:
            self.finish_jobs(self.pick("running", picks))

        def finish_jobs(self, chosen: list[int]) -> None:
            if not chosen:
                return
            done = driver.finish_done([(i, self.jobs[i][2]) for i in chosen])
            assert sorted(d.id for d in done) == sorted(chosen), (chosen, done)
            for i in chosen:
                self.jobs[i][1] = "done"
            self.log.append(f"finish {chosen if len(chosen) < 10 else f'{len(chosen)} jobs'}")

        @rule(picks=PICKS, retry=st.sampled_from([0.0, SHORT_DELAY, 3600.0]))
        @recorded
        def fail(self, picks: list[int], retry: float) -> None:
            """One running job fails: retried after `retry` seconds, or failed at max_attempts."""
            chosen = self.pick("running", picks[:1])
            if not chosen:
                return
            job_id = chosen[0]
            attempts = self.jobs[job_id][2]
            (res,) = driver.finish_failed([(job_id, attempts, "boom", retry)])
            max_attempts = rows("SELECT max_attempts FROM fairq.jobs WHERE id = %s", (job_id,))[0][0]
            expected = "failed" if attempts >= max_attempts else "queued"
            assert res.id == job_id and res.status == expected, (res, expected)
            self.jobs[job_id][1] = expected
            self.log.append(f"fail {job_id} retry {retry} -> {expected}")

        @rule(picks=PICKS)
        @recorded
        def cancel(self, picks: list[int]) -> None:
            for job_id in self.pick("queued", picks[:2]):
                assert driver.cancel(job_id), f"cancel of queued job {job_id} refused"
                self.jobs[job_id][1] = "cancelled"
                self.log.append(f"cancel {job_id}")

        @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([0.5, 1.0, 2.0, 10.0]),
              cap=st.sampled_from([0, 1, 2, 3, 10]))
        @recorded
        def configure(self, tenant: str, weight: float, cap: int) -> None:
            driver.set_tenants([TenantConfig(tenant, weight, cap)])
            self.config[tenant] = (weight, cap)
            running = self.running_counts().get(tenant, 0)
            self.ceiling[tenant] = max(cap, running)
            self.log.append(f"configure {tenant} weight {weight} cap {cap}")

        @rule()
        @recorded
        def wait_until_due(self) -> None:
            """Sleep until every job delayed by a fraction of a second is due."""
            (left,) = rows("SELECT coalesce(extract(epoch FROM max(run_at) - now()), 0)::float8 "
                           "FROM fairq.jobs WHERE queue = %s AND status = 'queued' AND run_at > now() "
                           "AND run_at < now() + interval '10 seconds'", (self.queue,))[0]
            if left > 0:
                time.sleep(left + 0.02)
                stats["waits"] += 1
            self.log.append("wait until due")

        # -- invariants ---------------------------------------------------------------------
        @invariant()
        @recorded
        def no_job_lost(self) -> None:
            if not hasattr(self, "jobs"):
                return
            db = {i: [t, s, a] for i, t, s, a in rows(
                "SELECT id, tenant, status, attempts FROM fairq.jobs WHERE queue = %s", (self.queue,))}
            missing = sorted(set(self.jobs) - set(db))
            extra = sorted(set(db) - set(self.jobs))
            wrong = {i: (db[i], self.jobs[i]) for i in db if i in self.jobs and db[i] != self.jobs[i]}
            assert not missing and not extra and not wrong, (
                f"jobs lost {missing}, unknown {extra}, (database, expected) differ {wrong}")

        @invariant()
        @recorded
        def caps_hold_and_running_counts_are_exact(self) -> None:
            if not hasattr(self, "jobs"):
                return
            sched = {t: (r, m) for t, r, m in rows(
                "SELECT tenant, fairq.tenant_running(ts), max_running "
                "FROM fairq.tenant_schedule ts WHERE queue = %s",
                (self.queue,))}
            real = self.running_counts()
            orphans = sorted(set(real) - set(sched))
            assert not orphans, f"running jobs of tenants without a schedule row: {orphans}"
            for tenant, (counted, max_running) in sched.items():
                n = real.get(tenant, 0)
                assert counted == n, (
                    f"tenant {tenant}: tenant_schedule.running = {counted} but {n} jobs are running")
                assert max_running == self.cap(tenant), (
                    f"tenant {tenant}: schedule cap {max_running}, configured {self.cap(tenant)}")
                ceiling = self.ceiling.get(tenant, max_running)
                assert n <= ceiling, (
                    f"tenant {tenant}: {n} jobs running over its cap {max_running} "
                    f"(allowed {ceiling} while a lowered cap drains)")
                self.ceiling[tenant] = max(max_running, min(ceiling, n))

    return ClaimOracle


@pytest.fixture(scope="module")
def oracle_db(admin_dsn: str, template_db: str) -> Iterator[str]:
    """One migrated database for the module, with a copy of its tables as migrated (a CREATE and
    DROP DATABASE per test take seconds on a busy small box)."""
    name = create_database(admin_dsn, "fairq_oracle", template=template_db)
    dsn = dsn_for_db(admin_dsn, name)
    try:
        keep_pristine_copy(dsn, SCHEMA, "oracle_pristine")
        yield dsn
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture(scope="module")
def stores(oracle_db: str) -> Iterator[list[Store]]:
    # Durable commits are not under test here, and fsyncs would dominate the run time.
    made = [Store(oracle_db, SCHEMA, min_size=1, max_size=2, application_name=f"oracle{n}",
                  durable_commits=False)
            for n in range(CLAIMERS)]
    try:
        for s in made:
            s.pool.wait()
        yield made
    finally:
        for s in made:
            s.close()


@pytest.fixture
def fresh_db(oracle_db: str) -> str:
    """The module's database with every fairq table back to its content as migrated."""
    restore_pristine(oracle_db, SCHEMA, "oracle_pristine")
    return oracle_db


@pytest.mark.parametrize("policy", ["round_robin", "weighted", "drr", "fifo"])
def test_concurrent_claims_against_the_database(stores: list[Store], fresh_db: str, policy: str) -> None:
    stats: Counter[str] = Counter()
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        failures: list[str] = []
        machine = make_machine(stores, conn, policy, stats, failures)
        try:
            run_state_machine_as_test(machine, settings=settings(
                max_examples=15, stateful_step_count=25, deadline=None, database=None,
                # Concurrent claims make runs irreproducible, so shrinking cannot work: failures
                # carry the last steps in their message, and Hypothesis prints the example's.
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
        except Exception as exc:
            if failures and not isinstance(exc, AssertionError):  # the replay went another way
                raise AssertionError(f"first failure: {failures[0]}") from exc
            raise
    # Not vacuous: claimers raced and won, and the quiescent check had work to find.
    assert stats["rounds"] > 0 and stats["round_claimed"] > 0, stats
    assert stats["rounds_with_two_winners"] > 0, stats
    assert stats["quiescent_checks"] > 0 and stats["quiescent_claimed"] > 0, stats
