"""A hypothesis state machine drives enqueue / claim / finish / fail / expire / reap against the
real database and a plain-Python model, and checks the invariants after every step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import fairq
from fairq.policies import get_policy

FIFO = get_policy("fifo")
TENANTS = ("a", "b", "c")
STATUSES = {"queued", "running", "done", "failed", "cancelled"}
DEFAULT_CAP = 10  # max_running of a tenant that appears through enqueue


@dataclass
class M:
    tenant: str
    max_attempts: int
    status: str = "queued"
    attempts: int = 0
    expired: bool = False


def make_machine(dsn: str) -> type[RuleBasedStateMachine]:
    class Lifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.app = fairq.App(dsn, schema="fairq")  # no tasks: any task name is accepted
            self.store = self.app.store
            self.conn = psycopg.connect(dsn, autocommit=True)
            self.conn.execute("TRUNCATE fairq.jobs, fairq.tenant_schedule, fairq.slot_returns, "
                              "fairq.claim_budgets, fairq.tenants")
            self.model: dict[int, M] = {}

        def teardown(self) -> None:
            self.conn.close()
            self.app.close()

        def running(self) -> list[int]:
            return sorted(i for i, m in self.model.items() if m.status == "running")

        # -- rules ------------------------------------------------------------------------
        @rule(tenant=st.sampled_from(TENANTS), max_attempts=st.integers(1, 3),
              n=st.integers(1, 3))
        def enqueue(self, tenant: str, max_attempts: int, n: int) -> None:
            for _ in range(n):
                job_id = self.app.enqueue("t", tenant=tenant, max_attempts=max_attempts)
                assert job_id not in self.model
                self.model[job_id] = M(tenant, max_attempts)

        @rule(batch=st.integers(1, 4))
        def claim(self, batch: int) -> None:
            jobs = self.store.claim(FIFO, queue="default", batch=batch, worker="w")
            assert len(jobs) <= batch
            running = {t: sum(1 for m in self.model.values()
                              if m.tenant == t and m.status == "running") for t in TENANTS}
            # Work-conserving: a queued job of a tenant below its cap (the default 10) must come.
            claimable = any(m.status == "queued" and running[m.tenant] < DEFAULT_CAP
                            for m in self.model.values())
            if claimable:
                assert jobs, "a claim returned nothing while jobs were runnable"
            assert all(running[j.tenant] < DEFAULT_CAP for j in jobs), "claimed over the cap"
            for j in jobs:
                m = self.model[j.id]
                assert m.status == "queued", f"job {j.id} claimed while {m.status}"
                assert j.attempts == m.attempts + 1
                m.status, m.attempts, m.expired = "running", j.attempts, False

        @precondition(lambda self: self.running())
        @rule(data=st.data(), stale=st.booleans())
        def finish(self, data: Any, stale: bool) -> None:
            job_id = data.draw(st.sampled_from(self.running()))
            m = self.model[job_id]
            done = self.store.finish_done([(job_id, m.attempts - 1 if stale else m.attempts)])
            if stale:
                assert done == []  # a lost lease changes nothing
            else:
                assert [f.id for f in done] == [job_id]
                m.status = "done"

        @precondition(lambda self: self.running())
        @rule(data=st.data(), stale=st.booleans())
        def fail(self, data: Any, stale: bool) -> None:
            job_id = data.draw(st.sampled_from(self.running()))
            m = self.model[job_id]
            attempts = m.attempts - 1 if stale else m.attempts
            res = self.store.finish_failed([(job_id, attempts, "boom", 0.0)])
            if stale:
                assert res == []
                return
            expected = "failed" if m.attempts >= m.max_attempts else "queued"
            assert [(f.id, f.status) for f in res] == [(job_id, expected)]
            m.status = expected

        @precondition(lambda self: self.running())
        @rule(data=st.data())
        def expire(self, data: Any) -> None:
            job_id = data.draw(st.sampled_from(self.running()))
            self.conn.execute("UPDATE fairq.jobs SET locked_until = now() - interval '1 s' "
                              "WHERE id = %s", (job_id,))
            self.model[job_id].expired = True

        @rule()
        def reap(self) -> None:
            result = self.store.reap_expired()
            requeued = failed = 0
            for m in self.model.values():
                if m.status == "running" and m.expired:
                    m.status = "failed" if m.attempts >= m.max_attempts else "queued"
                    m.expired = False
                    requeued += m.status == "queued"
                    failed += m.status == "failed"
            assert sum(result.requeued.values()) == requeued
            assert sum(result.failed.values()) == failed

        # -- invariants -------------------------------------------------------------------
        @invariant()
        def database_matches_model(self) -> None:
            rows = self.conn.execute(
                "SELECT id, status, attempts, max_attempts, tenant FROM fairq.jobs").fetchall()
            db = {r[0]: (r[1], r[2]) for r in rows}
            assert db == {i: (m.status, m.attempts) for i, m in self.model.items()}
            for _, status, attempts, max_attempts, _ in rows:
                assert status in STATUSES
                assert 0 <= attempts <= max_attempts

        @invariant()
        def running_counts_are_exact(self) -> None:
            sched = dict(self.conn.execute(
                "SELECT tenant, fairq.tenant_running(ts) FROM fairq.tenant_schedule ts "
                "WHERE queue = 'default'").fetchall())
            actual = dict(self.conn.execute(
                "SELECT tenant, count(*) FROM fairq.jobs WHERE status = 'running' "
                "GROUP BY 1").fetchall())
            for tenant in set(sched) | set(actual):
                assert sched.get(tenant, 0) == actual.get(tenant, 0), (tenant, sched, actual)

        @invariant()
        def running_jobs_hold_a_lease(self) -> None:
            bad = self.conn.execute(
                "SELECT count(*) FROM fairq.jobs WHERE (status = 'running') <> "
                "(locked_until IS NOT NULL)").fetchone()
            assert bad == (0,)

    return Lifecycle


def test_lifecycle_state_machine(dsn: str) -> None:
    machine = make_machine(dsn)
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=25, stateful_step_count=30, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
