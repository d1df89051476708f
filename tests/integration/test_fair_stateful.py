"""The database's claims against the pure-Python reference model, step by step, per policy.

Hypothesis drives enqueue / claim / finish / retry / reconfigure on one queue with one claimer;
after every step the claimed ids and each tenant's (running, vtime, active) must equal the
model's. Weights are powers of two so virtual times are exact in both float implementations.
Rate limits are tiny (0.001 jobs/s) so that no token refills during a run: the buckets drain
exactly, dry tenants sleep past the end of the run (the model's clock NOW is far past every
job's run_at and before any token is due), and a retry or a new limit wakes them early.
Every finish reports a run time (a few exact binary fractions of a second): policy time charges
the tenant's expected run time at the claim and corrects it at the finish, and every policy
keeps each tenant's expected run time (avg_run_s), which the invariant compares too.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from fairq.models import NewJob, TenantConfig
from fairq.policies import get_policy
from fairq.store import Store
from tests.support.policy_model import ModelJob, QueueModel

TENANTS = ["a", "b", "c", "d"]
NOW = 1e6   # the model's clock at claims: every job is due, no token refills
RUN_TIMES = st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.0, 3.0])   # seconds a finished job ran


def make_machine(store: Store, dsn: str, policy_name: str) -> type[RuleBasedStateMachine]:
    policy = get_policy(policy_name)

    class ClaimsMatchModel(RuleBasedStateMachine):
        @initialize()
        def reset(self) -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("TRUNCATE fairq.jobs, fairq.tenant_schedule, fairq.slot_returns, "
                             "fairq.claim_budgets, fairq.tenants "
                             "RESTART IDENTITY")
            store.set_tenants([], defaults=(1.0, 10))
            self.model = QueueModel(default_weight=1.0, default_max_running=10)
            self.attempts: dict[int, int] = {}
            self.conf: dict[str, TenantConfig] = {}
            self.clock = 0.0   # run_at order in the model follows the order of DB statements

        @rule(tenant=st.sampled_from(TENANTS), n=st.integers(1, 4), priority=st.sampled_from([0, 0, 1]),
              cost=st.sampled_from([1.0, 2.0, 4.0]))
        def enqueue(self, tenant: str, n: int, priority: int, cost: float) -> None:
            ids = store.enqueue([NewJob("t", tenant, "{}", priority=priority, cost=cost)] * n)
            self.clock += 1
            self.model.enqueue_many(
                [ModelJob(i, tenant, priority=priority, cost=cost, run_at=self.clock) for i in ids],
                now=self.clock)

        @rule(batch=st.integers(1, 6))
        def claim(self, batch: int) -> None:
            got = store.claim(policy, queue="default", batch=batch, worker="w")
            expected = self.model.claim(policy, batch, now=NOW)
            assert sorted(j.id for j in got) == sorted(expected)
            for j in got:
                self.attempts[j.id] = j.attempts

        @rule(data=st.data(), run_s=RUN_TIMES)
        def finish(self, data: Any, run_s: float) -> None:
            if not self.model.running:
                return
            job_id = data.draw(st.sampled_from(sorted(self.model.running)))
            assert store.finish_done([(job_id, self.attempts[job_id])], run_seconds=[run_s])
            self.model.finish(job_id, run_s=run_s)

        @rule(data=st.data(), run_s=RUN_TIMES)
        def retry_now(self, data: Any, run_s: float) -> None:
            candidates = sorted(i for i in self.model.running if self.attempts[i] < 5)
            if not candidates:
                return
            job_id = data.draw(st.sampled_from(candidates))
            assert store.finish_failed([(job_id, self.attempts[job_id], "boom", 0.0)],
                                       run_seconds=[run_s])
            self.clock += 1
            self.model.retry(job_id, run_at=self.clock, run_s=run_s)

        @rule(factor=st.sampled_from([0.5, 0.25]))
        def decay(self, factor: float) -> None:
            assert store.decay_usage(["default"], factor) == self.model.decay(factor)

        @rule(data=st.data())
        def release(self, data: Any) -> None:
            if not self.model.running:
                return
            job_id = data.draw(st.sampled_from(sorted(self.model.running)))
            assert store.release_unstarted([(job_id, self.attempts[job_id])]) == {job_id}
            self.model.release(job_id)

        @rule(tenant=st.sampled_from(TENANTS), weight=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
              cap=st.sampled_from([0, 1, 2, 5, 10]))
        def configure(self, tenant: str, weight: float, cap: int) -> None:
            old = self.conf.get(tenant, TenantConfig(tenant, 1.0, 10))
            self._set(TenantConfig(tenant, weight, cap, rate=old.rate, burst=old.burst))

        @rule(tenant=st.sampled_from(TENANTS), burst=st.sampled_from([None, 1, 2, 3]))
        def rate_limit(self, tenant: str, burst: int | None) -> None:
            old = self.conf.get(tenant, TenantConfig(tenant, 1.0, 10))
            self._set(TenantConfig(tenant, old.weight, old.max_running,
                                   rate=None if burst is None else 0.001, burst=burst))

        def _set(self, c: TenantConfig) -> None:
            self.conf[c.tenant] = c
            store.set_tenants([c])
            self.model.set_tenant(c.tenant, c.weight, c.max_running, c.rate, c.burst, now=NOW)

        @invariant()
        def tenant_state_matches(self) -> None:
            if not hasattr(self, "model"):
                return
            with psycopg.connect(dsn, autocommit=True) as conn:
                rows = conn.execute("SELECT tenant, running, vtime, active, avg_run_s "
                                    "FROM fairq.tenant_schedule").fetchall()
            tenants = self.model.tenants.values()
            if policy.name == "fifo":   # fifo keeps no virtual time nor activity
                assert {t: (r, s) for t, r, _, _, s in rows} == {
                    t.name: (t.running, t.avg_run_s) for t in tenants}
            else:
                assert {t: (r, v, a, s) for t, r, v, a, s in rows} == {
                    t.name: (t.running, t.vtime, t.active, t.avg_run_s) for t in tenants}

    return ClaimsMatchModel


@pytest.mark.parametrize("policy", ["fifo", "round_robin", "weighted", "drr", "time"])
def test_database_claims_follow_the_reference_model(store: Store, dsn: str, policy: str) -> None:
    machine = make_machine(store, dsn, policy)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=25, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
