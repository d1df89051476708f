"""Two claimers at once, with tenant groups and rate limits, against the database's invariants.

Hypothesis drives enqueues, caps, weights, groups, group weights and rate limits from the
test's thread, and rounds of two threads with their own connections: two claims at once, two
finish batches at once (interleaved over the same tenants), or a claim beside a finish. No
reference model: after every step the test reads the database and checks what must hold
whatever the schedule chose:

- every job is claimed at most once per attempt (a claim's attempt is the last one plus one);
- a claim never takes a tenant past its cap, and each tenant's `running` is its exact count of
  running jobs;
- at a quiescent point (no round in flight) a claim is never empty while a claimable job
  exists: a due job whose tenant is under its cap and whose bucket holds a whole token, read
  from the bucket's columns (a tenant without one is dry and does not count);
- a rate-limited tenant never starts more than `burst + rate * elapsed` jobs since its limit
  was set, at every one of its starts (the database clock: the jobs' started_at).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from fairq.models import ClaimedJob, GroupConfig, NewJob, TenantConfig
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.db import SCHEMA

TENANTS = ["a", "b", "c", "d"]
POLICIES = st.sampled_from(["fifo", "round_robin", "weighted", "drr", "time"])
RATES = st.sampled_from([None, 0.001, 5.0, 50.0])
PICKS = st.lists(st.integers(0, 10_000), max_size=12)

# Due jobs whose tenant may start one now: under its cap, and a bucket (tokens as of
# refilled_at, NULL: full) holding a whole token. A bucket that reached its token less than
# 2 microseconds ago (timestamps' resolution) counts as neither claimable nor dry.
CLAIMABLE = """
SELECT count(*) FROM fairq.jobs j
JOIN fairq.tenant_schedule ts ON ts.queue = j.queue AND ts.tenant = j.tenant
WHERE j.status = 'queued' AND j.run_at <= now() AND ts.running < ts.max_running
  AND (ts.rate IS NULL OR ts.tokens IS NULL OR ts.refilled_at IS NULL
       OR ts.tokens + ts.rate * extract(epoch FROM now() - ts.refilled_at)::float8
          >= 1 + ts.rate * 2e-6)
"""


@pytest.fixture
def claimers(dsn: str) -> Iterator[tuple[Store, Store]]:
    """Two stores of one connection each: the two claimers' own sessions."""
    stores = [Store(dsn, SCHEMA, min_size=1, max_size=1) for _ in range(2)]
    for s in stores:
        s.pool.wait()
    try:
        yield stores[0], stores[1]
    finally:
        for s in stores:
            s.close()


def at_once(first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
    """Run both in their own threads, released together; re-raise the first error."""
    start = threading.Barrier(2)
    out: list[Any] = [None, None]
    errors: list[BaseException] = []

    def run(i: int, fn: Callable[[], Any]) -> None:
        try:
            start.wait(10)
            out[i] = fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a round did not end"
    if errors:
        raise errors[0]
    return out[0], out[1]


def make_machine(store: Store, pair: tuple[Store, Store],
                 conn: psycopg.Connection[Any]) -> type[RuleBasedStateMachine]:
    def rows(query: str, params: Any = None) -> list[tuple[Any, ...]]:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []

    class ConcurrentClaims(RuleBasedStateMachine):
        @initialize(limits=st.lists(st.tuples(RATES, st.integers(1, 3)),
                                    min_size=len(TENANTS), max_size=len(TENANTS)),
                    groups=st.lists(st.sampled_from([None, "g1", "g2"]),
                                    min_size=len(TENANTS), max_size=len(TENANTS)))
        def reset(self, limits: list[tuple[float | None, int]], groups: list[str | None]) -> None:
            """A fresh queue whose tenants start with a random rate limit and group."""
            rows("TRUNCATE fairq.jobs, fairq.tenant_schedule, fairq.slot_returns, "
                 "fairq.claim_budgets, fairq.tenants, "
                 "fairq.tenant_groups, "
                 "fairq.group_schedule RESTART IDENTITY")
            store.set_tenants([], defaults=(1.0, 10))
            self.conf: dict[str, TenantConfig] = {}
            self.attempts: dict[int, int] = {}        # job -> its last claimed attempt
            self.held: dict[int, tuple[int, str]] = {}  # running jobs: id -> (attempts, tenant)
            self.starts: dict[str, list[datetime]] = defaultdict(list)
            self.limits: dict[str, tuple[datetime, float, int]] = {}  # tenant -> since, rate, burst
            for tenant, (rate, burst), group in zip(TENANTS, limits, groups, strict=True):
                self.group(tenant, group)
                self.rate_limit(tenant, rate, burst)

        # -- configuration, from the test's thread ---------------------------------------------
        @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 6))
        def enqueue(self, tenant: str, n: int) -> None:
            store.enqueue([NewJob("t", tenant, "{}", max_attempts=3)] * n)

        @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
              cap=st.sampled_from([0, 1, 2, 5, 10]))
        def configure(self, tenant: str, weight: float, cap: int) -> None:
            old = self._conf(tenant)
            self._set(TenantConfig(tenant, weight, cap, rate=old.rate, burst=old.burst,
                                   group=old.group))

        @rule(tenant=st.sampled_from(TENANTS), rate=RATES, burst=st.integers(1, 3))
        def rate_limit(self, tenant: str, rate: float | None, burst: int) -> None:
            old = self._conf(tenant)
            self._set(TenantConfig(tenant, old.weight, old.max_running, rate=rate,
                                   burst=None if rate is None else burst, group=old.group))
            self.limits.pop(tenant, None)
            if rate is not None:   # the bound counts the starts from now on
                ((now,),) = rows("SELECT now()")
                self.limits[tenant] = (now, rate, burst)

        @rule(tenant=st.sampled_from(TENANTS), group=st.sampled_from([None, "g1", "g2"]))
        def group(self, tenant: str, group: str | None) -> None:
            old = self._conf(tenant)
            self._set(TenantConfig(tenant, old.weight, old.max_running, rate=old.rate,
                                   burst=old.burst, group=group))

        @rule(group=st.sampled_from(["g1", "g2", "default"]), weight=st.sampled_from([0.5, 1.0, 3.0]))
        def group_weight(self, group: str, weight: float) -> None:
            store.set_group(GroupConfig(group, weight))

        def _conf(self, tenant: str) -> TenantConfig:
            return self.conf.get(tenant, TenantConfig(tenant, 1.0, 10))

        def _set(self, c: TenantConfig) -> None:
            self.conf[c.tenant] = c
            store.set_tenants([c])

        # -- rounds of two threads ---------------------------------------------------------------
        @rule(p1=POLICIES, p2=POLICIES, b1=st.integers(1, 6), b2=st.integers(1, 6))
        def two_claims(self, p1: str, p2: str, b1: int, b2: int) -> None:
            before = self._running()
            got1, got2 = at_once(lambda: self._claim(pair[0], p1, b1),
                                 lambda: self._claim(pair[1], p2, b2))
            self._took(before, got1 + got2)

        @rule(picks=PICKS, fail=st.booleans())
        def two_finishes(self, picks: list[int], fail: bool) -> None:
            """Two batches over the same tenants, in opposite orders, finished at once."""
            ids = self._pick(picks)
            ids.sort(key=lambda i: (self.held[i][1], i))
            one, two = ids[0::2], ids[1::2][::-1]
            at_once(lambda: self._finish(pair[0], one, fail), lambda: self._finish(pair[1], two, False))
            for i in ids:
                del self.held[i]

        @rule(policy=POLICIES, batch=st.integers(1, 6), picks=PICKS)
        def claim_beside_finish(self, policy: str, batch: int, picks: list[int]) -> None:
            ids = self._pick(picks[:6])
            before = self._running()
            got, _ = at_once(lambda: self._claim(pair[0], policy, batch),
                             lambda: self._finish(pair[1], ids, False))
            self._took(before, got, finished=set(ids))

        # -- a quiescent point ---------------------------------------------------------------------
        @rule(policy=POLICIES, batch=st.integers(1, 6))
        def claim_alone(self, policy: str, batch: int) -> None:
            ((claimable,),) = rows(CLAIMABLE)
            before = self._running()
            got = self._claim(pair[0], policy, batch)
            self._took(before, got)
            if claimable:
                assert got, f"an empty {policy} claim while {claimable} jobs were claimable"

        # -- helpers -------------------------------------------------------------------------------
        def _pick(self, picks: list[int]) -> list[int]:
            """Held jobs chosen by position: which jobs a round claimed depends on timing, so
            the test draws positions, never the ids themselves (hypothesis replays draws)."""
            held = sorted(self.held)
            return sorted({held[p % len(held)] for p in picks}) if held else []

        def _claim(self, s: Store, policy: str, batch: int) -> list[ClaimedJob]:
            return s.claim(get_policy(policy), queue="default", batch=batch, worker="w")

        def _finish(self, s: Store, ids: list[int], fail: bool) -> None:
            jobs = [(i, self.held[i][0]) for i in ids]
            # failed: back to queued at once (attempts left) or failed for good
            done = (s.finish_failed([(i, a, "boom", 0.0) for i, a in jobs]) if fail
                    else s.finish_done(jobs))
            assert sorted(f.id for f in done) == sorted(ids)  # nobody else holds them

        def _running(self) -> dict[str, tuple[int, int]]:
            """tenant -> (running jobs, cap), from the jobs themselves."""
            return {t: (n, cap) for t, n, cap in rows(
                "SELECT ts.tenant, (SELECT count(*) FROM fairq.jobs j WHERE j.queue = ts.queue "
                "AND j.tenant = ts.tenant AND j.status = 'running'), ts.max_running "
                "FROM fairq.tenant_schedule ts")}

        def _took(self, before: dict[str, tuple[int, int]], got: list[ClaimedJob],
                  finished: set[int] = frozenset()) -> None:  # type: ignore[assignment]
            for i in finished:
                self.held.pop(i, None)
            ids = [j.id for j in got]
            assert len(ids) == len(set(ids)), "one job claimed twice at once"
            for j in got:
                assert j.attempts == self.attempts.get(j.id, 0) + 1, "a job claimed twice"
                assert j.id not in self.held
                self.attempts[j.id] = j.attempts
                self.held[j.id] = (j.attempts, j.tenant)
                self.starts[j.tenant].append(j.started_at)
            for t, (n, cap) in self._running().items():
                assert n <= max(cap, before.get(t, (0, 0))[0]), f"{t}: {n} running, cap {cap}"

        # -- invariants, after every step ---------------------------------------------------------
        @invariant()
        def running_counts_are_exact(self) -> None:
            if not hasattr(self, "held"):
                return
            counts = {t: r for t, r, _ in rows(
                "SELECT ts.tenant, fairq.tenant_running(ts), (SELECT count(*) FROM fairq.jobs j "
                "WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'running') "
                "FROM fairq.tenant_schedule ts WHERE fairq.tenant_running(ts) <> (SELECT count(*) FROM "
                "fairq.jobs j WHERE j.queue = ts.queue AND j.tenant = ts.tenant "
                "AND j.status = 'running')")}
            assert counts == {}, f"running counts off: {counts}"
            held: dict[str, int] = defaultdict(int)
            for _, tenant in self.held.values():
                held[tenant] += 1
            assert {t: n for t, (n, _) in self._running().items() if n} == dict(held)

        @invariant()
        def rate_limits_hold(self) -> None:
            if not hasattr(self, "limits"):
                return
            for tenant, (since, rate, burst) in self.limits.items():
                starts = sorted(t for t in self.starts[tenant] if t >= since)
                for k, t in enumerate(starts, 1):
                    allowed = burst + rate * (t - since).total_seconds()
                    assert k <= allowed + 1e-6, (
                        f"{tenant}: {k} starts in {(t - since).total_seconds():.4f} s "
                        f"at {rate}/s, burst {burst}")

    return ConcurrentClaims


def test_two_claimers_keep_the_invariants_with_groups_and_rate_limits(
        store: Store, claimers: tuple[Store, Store], dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as checker:  # the checks' own session
        machine = make_machine(store, claimers, checker)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=100, stateful_step_count=30, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
