-- Claim statements, one complete statement per policy family, chosen by name (never concatenated).
-- {schema} is replaced once at load time by the quoted schema identifier; everything else is a
-- bound parameter. Each statement claims up to %(batch)s jobs of one queue, marks them running
-- with a lease, and moves the tenants' exact running counts, all in one round trip.
--
-- Shared parameters: queue, batch, worker.
-- Tenant rows are locked FOR NO KEY UPDATE, never FOR UPDATE (except to retire a tenant, in
-- claim_settle): an enqueue holds FOR KEY SHARE on its tenants' rows until it commits, and
-- must not block claims or finishes.

-- name: claim_fair
-- Weighted fair queueing over tenants by virtual time (docs/algorithm.md). Parameters:
-- by_weight, by_cost (round_robin: false/false; weighted: true/false; drr: true/true).
-- 1. Tenants whose delayed jobs fell due (sleepers) rejoin at the queue's virtual time V, first
--    in the walk: a job that fell due is claimable without waiting for any maintenance.
-- 2. The walk: runnable tenants in (vtime, tenant) order, at most `window` (one batch) of
--    virtual time ahead of the first, each row locked as the walk reaches it, SKIP LOCKED (a
--    tenant another claim holds is being served by it); each gives at most its weighted share
--    of the batch and its free slots; the walk stops when the batch is full. If it took
--    nothing although a job is due, it waits for the first tenant that has one.
-- 3. The jobs are marked running; claim_settle moves the tenants' counts and virtual times and
--    takes every tenant served or walked past that looks empty out of the runnable set if it
--    has no due job left. So a tenant leaves the runnable set in the claim
--    that takes its last due job, and a claim that could lock a runnable tenant with a due job
--    never comes back empty.
-- Tenant rows are locked FOR NO KEY UPDATE; claim_settle writes them.
WITH
sleepers AS MATERIALIZED (
    SELECT s.ctid, s.tenant, s.weight, s.max_running - s.running AS room
    FROM {schema}.tenant_schedule s
    WHERE s.queue = %(queue)s AND NOT s.active AND s.wake_at <= now()
    ORDER BY s.wake_at
    FOR NO KEY UPDATE OF s SKIP LOCKED
),
-- The walk serves tenants at most one batch of virtual time (`window`) ahead of the first
-- runnable one: skipping a tenant another claim holds must not let the others run away from it.
vmin AS MATERIALIZED (
    SELECT ts.vtime AS v FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1
),
v AS MATERIALIZED (
    SELECT CASE WHEN EXISTS (SELECT FROM sleepers) THEN {schema}.queue_vtime(%(queue)s) END AS v
),
-- The share denominator: the weights of the first `batch` tenants of the walk, read unlocked.
share AS MATERIALIZED (
    SELECT coalesce(sum(h.u), 1.0) AS total FROM (
        SELECT x.u FROM (
            SELECT 0 AS part, row_number() OVER (ORDER BY sl.tenant) AS ord,
                   CASE WHEN %(by_weight)s THEN sl.weight ELSE 1.0 END AS u
            FROM sleepers sl WHERE sl.room > 0
            UNION ALL
            SELECT 1, r.ord, r.u FROM (
                SELECT CASE WHEN %(by_weight)s THEN ts.weight ELSE 1.0 END AS u,
                       row_number() OVER (ORDER BY ts.vtime, ts.tenant) AS ord
                FROM {schema}.tenant_schedule ts
                WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
                  AND ts.vtime <= (SELECT vm.v FROM vmin vm) + %(window)s
                ORDER BY ts.vtime, ts.tenant
                LIMIT %(batch)s) r
        ) x ORDER BY x.part, x.ord LIMIT %(batch)s) h
),
-- The walk's tenants, pulled one at a time: sleepers first (they are at V), then the runnable
-- index in order, each row locked as it is reached; then, only if the claim could lock no
-- tenant at all, the tenant at V, waited for.
-- When the walk took no job at all although some tenant has one due (every such tenant was
-- held by other claims or finishes): the first few of them (claim_head), which the walk then
-- waits for, in order. Found once the walk above is exhausted, and kept apart from the lock: a lock that
-- waited rechecks its own conditions on the new row version, and this decision must not be
-- taken again then.
hot AS MATERIALIZED (
    SELECT h.tenant, h.ord
    FROM unnest(CASE WHEN NOT EXISTS (SELECT FROM sleepers)
                      AND coalesce(current_setting('fairq.claim_took', true), '') = ''
                     THEN {schema}.claim_head(%(queue)s, 3) END) WITH ORDINALITY AS h(tenant, ord)
),
cand AS (
    SELECT 0 AS part, w.ctid, w.tenant, NULL::float8 AS vtime, w.weight, w.room FROM (
        SELECT sl.ctid, sl.tenant, sl.weight, sl.room FROM sleepers sl
        WHERE sl.room > 0 ORDER BY sl.tenant) w
    UNION ALL
    SELECT 1, r.ctid, r.tenant, r.vtime, r.weight, r.room FROM (
        SELECT ts.ctid, ts.tenant, ts.vtime, ts.weight, ts.max_running - ts.running AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
          AND ts.vtime <= (SELECT vm.v FROM vmin vm) + %(window)s
        ORDER BY ts.vtime, ts.tenant
        -- A bound the walk never reaches in practice (it stops with the batch), there so the
        -- planner reads the index in order instead of reading all of it and sorting; a walk
        -- cut short that took nothing falls back on `hot`, so no work is missed.
        LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED) r
    UNION ALL
    SELECT 2, h.ctid, h.tenant, h.vtime, h.weight, h.room
    FROM (SELECT hot.tenant FROM hot ORDER BY hot.ord) hot CROSS JOIN LATERAL (
        SELECT ts.ctid, ts.tenant, ts.vtime, ts.weight, ts.max_running - ts.running AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.tenant = hot.tenant
          AND ts.active AND ts.running < ts.max_running
        FOR NO KEY UPDATE OF ts) h
),
-- Each job taken marks the transaction (set_config ... true: until its end), so that `hot`
-- knows whether the walk took any (a volatile select list, evaluated as each row is made).
taken AS MATERIALIZED (
    SELECT j.id, c.part, c.ctid, c.tenant, c.vtime,
           (CASE WHEN %(by_cost)s THEN j.cost ELSE 1.0 END)
             / (CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END) AS inc,
           set_config('fairq.claim_took', 'y', true) AS took
    FROM cand c CROSS JOIN share s
    CROSS JOIN LATERAL (
        SELECT q.id, q.cost
        FROM {schema}.jobs q
        WHERE q.queue = %(queue)s AND q.tenant = c.tenant
          AND q.status = 'queued' AND q.run_at <= now()
        ORDER BY q.priority DESC, q.run_at, q.id
        LIMIT least(c.room,
                    ceil(%(batch)s * (CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END)
                         / s.total)::int)
        FOR UPDATE OF q SKIP LOCKED
    ) j
    LIMIT %(batch)s
),
claimed AS (
    UPDATE {schema}.jobs j
    SET status = 'running', attempts = j.attempts + 1, started_at = now(),
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
    WHERE j.id = ANY ((SELECT array_agg(t.id) FROM taken t)::bigint[])
    RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
              j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until
),
-- Per tenant served: its jobs, virtual time, and whether it looks empty now (no other due job
-- in this statement's snapshot; claim_settle decides it again under a lock).
served AS MATERIALIZED (
    SELECT t.ctid, t.tenant, count(*)::int AS n, sum(t.inc) AS inc,
           (SELECT true FROM {schema}.jobs q
            WHERE q.queue = %(queue)s AND q.tenant = t.tenant
              AND q.status = 'queued' AND q.run_at <= now()
              AND q.id <> ALL (array_agg(t.id))
            LIMIT 1) IS NULL AS looks_empty
    FROM taken t GROUP BY t.ctid, t.tenant
),
-- The rows to write: the served tenants and the sleepers (woken at V, served or not).
moves AS MATERIALIZED (
    SELECT array_agg(y.ctid) AS rows_, array_agg(y.n) AS ns, array_agg(y.inc) AS incs,
           array_agg(y.woken) AS woken
    FROM (SELECT y.ctid, bool_or(y.woken) AS woken, sum(y.n)::int AS n, sum(y.inc) AS inc
          FROM (SELECT sv.ctid, false AS woken, sv.n, sv.inc FROM served sv
                UNION ALL SELECT sl.ctid, true, 0, 0.0 FROM sleepers sl) y
          GROUP BY y.ctid) y
),
-- Where the walk stopped in the runnable index: tenants before it that it did not serve were
-- walked past (held by another claim, or with nothing due). A short claim walked them all.
stop AS MATERIALIZED (
    SELECT t.vtime, t.tenant FROM taken t
    WHERE t.part = 1 AND (SELECT count(*) FROM taken) >= %(batch)s
    ORDER BY t.vtime DESC, t.tenant DESC LIMIT 1
),
suspects AS MATERIALIZED (
    SELECT coalesce(array_agg(x.tenant), '{{}}') AS tenants FROM (
        SELECT sv.tenant FROM served sv WHERE sv.looks_empty
        UNION ALL
        SELECT sl.tenant FROM sleepers sl
        WHERE NOT EXISTS (SELECT FROM served sv WHERE sv.tenant = sl.tenant)
        -- A full claim: the runnable index up to where the walk stopped, as two index ranges
        -- (a row comparison would bound only vtime, and read every tenant at the same vtime).
        UNION ALL
        SELECT ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
          AND ts.vtime < (SELECT st.vtime FROM stop st)
          AND NOT EXISTS (SELECT FROM served sv WHERE sv.tenant = ts.tenant)
        UNION ALL
        SELECT ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
          AND ts.vtime = (SELECT st.vtime FROM stop st)
          AND ts.tenant < (SELECT st.tenant FROM stop st)
          AND NOT EXISTS (SELECT FROM served sv WHERE sv.tenant = ts.tenant)
        -- A short claim walked every candidate (up to the walk's bound).
        UNION ALL
        SELECT w.tenant FROM (
            SELECT ts.tenant FROM {schema}.tenant_schedule ts
            WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
              AND ts.vtime <= (SELECT vm.v FROM vmin vm) + %(window)s
              AND (SELECT count(*) FROM taken) < %(batch)s
            ORDER BY ts.vtime, ts.tenant
            LIMIT 1000) w
        WHERE NOT EXISTS (SELECT FROM served sv WHERE sv.tenant = w.tenant)
    ) x
),
-- After the jobs' UPDATE (claim_settle runs in later commands, which see it).
settled AS MATERIALIZED (
    SELECT {schema}.claim_settle(
        %(queue)s, coalesce(m.rows_, '{{}}'), coalesce(m.ns, '{{}}'), coalesce(m.incs, '{{}}'),
        coalesce(m.woken, '{{}}'), (SELECT v.v FROM v), s.tenants) AS n
    FROM moves m, suspects s
    WHERE (SELECT count(*) FROM claimed) >= 0
)
SELECT c.id, c.queue, c.tenant, c.task, c.payload, c.attempts, c.max_attempts,
       c.lease_seconds, c.priority, c.cost, c.run_at, c.started_at, c.locked_until
FROM claimed c
WHERE (SELECT st.n FROM settled st) IS NOT NULL;

-- name: claim_fifo
-- The global order (priority, run_at, id), skipping tenants at their cap: the baseline.
-- Plan robustness: a generic plan cannot know the batch size, so it estimates a LIMIT of it as a
-- tenth of the backlog (thousands of rows) and may then join those "thousands" to jobs or
-- tenant_schedule by hash join over a Seq Scan (seen on PostgreSQL 18 with misleading
-- statistics: a 6,000-buffer Seq Scan on jobs per claim of 10). So the big tables are never
-- joined to a batch-sized set: their rows are looked up by key = ANY (an array aggregated from
-- the set), an index scan whatever the estimates.
WITH picked AS MATERIALIZED (
    SELECT q.id, q.tenant, q.priority, q.run_at
    FROM {schema}.jobs q
    WHERE q.queue = %(queue)s AND q.status = 'queued' AND q.run_at <= now()
      -- Always true (jobs_cost_check), and part of jobs_fifo_ready_idx's predicate: only this
      -- statement says it, so only this statement reads that index (migration 0003).
      AND q.cost > 0
      -- A scalar subquery, not EXISTS: the planner cannot flatten it into a join that reads
      -- and sorts the whole backlog; it stays a per-row probe under the ordered index scan.
      AND (SELECT ts.running < ts.max_running FROM {schema}.tenant_schedule ts
           WHERE ts.queue = q.queue AND ts.tenant = q.tenant)
    ORDER BY q.priority DESC, q.run_at, q.id
    LIMIT %(batch)s
    FOR UPDATE OF q SKIP LOCKED
),
ranked AS MATERIALIZED (
    SELECT p.id, p.tenant,
           row_number() OVER (PARTITION BY p.tenant ORDER BY p.priority DESC, p.run_at, p.id) AS rk
    FROM picked p
),
-- The picked jobs' tenants, locked in tenant order; room is read from the current rows.
locked AS MATERIALIZED (
    SELECT ts.tenant, ts.max_running - ts.running AS room
    FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s
      AND ts.tenant = ANY ((SELECT array_agg(DISTINCT p.tenant) FROM picked p)::text[])
    ORDER BY ts.tenant
    FOR NO KEY UPDATE OF ts
),
granted AS MATERIALIZED (
    SELECT r.id, r.tenant FROM ranked r
    JOIN locked l ON l.tenant = r.tenant
    WHERE r.rk <= l.room
),
per_tenant AS MATERIALIZED (SELECT g.tenant, count(*) AS n FROM granted g GROUP BY g.tenant),
upd_tenants AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + pt.n, claimed_total = ts.claimed_total + pt.n,
        last_served_at = now()
    FROM per_tenant pt
    WHERE ts.queue = %(queue)s AND ts.tenant = pt.tenant
      AND ts.tenant = ANY ((SELECT array_agg(p.tenant) FROM per_tenant p)::text[])
    RETURNING ts.tenant
)
UPDATE {schema}.jobs j
SET status = 'running', attempts = j.attempts + 1, started_at = now(),
    locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
WHERE j.id = ANY ((SELECT array_agg(g.id) FROM granted g)::bigint[])
RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
          j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until;
