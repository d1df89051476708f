-- The workers' maintenance (fairq/runtime/maintenance.py) that is not a job's lifecycle: the lease that
-- lets one worker per interval run a service, the VACUUM of the scheduler's hot table and the
-- check that decides it, and the rebase of virtual times. {schema} is the quoted schema
-- identifier; the rest are bound parameters.

-- name: maintenance_due
-- Returns a row when the caller should run the named maintenance task now: at most one worker
-- per interval, decided by the database without session state (works through a pooler).
INSERT INTO {schema}.settings AS s (key, value)
VALUES (%(key)s, jsonb_build_object('at', now()))
ON CONFLICT (key) DO UPDATE SET value = excluded.value
WHERE (s.value->>'at')::timestamptz <= now() - make_interval(secs => %(interval)s)
RETURNING s.key;

-- name: reap_now
-- The reaper's first statement, in the transaction of its reap_expired (fairq/runtime/
-- maintenance.py, reap_pinned): now() is the transaction's start, so the reap compares the
-- leases with a time at which the database answered promptly, not with the moment a stalled
-- server got round to the reap (docs/decisions/019-stalls-count-as-outages.md).
SELECT now() AS now;

-- name: schedule_vacuum_due
-- Is a VACUUM of tenant_schedule worth its cost (10-30 ms) now? Every fair claim walks the
-- runnable index from its front, over the entries that claims and finishes left dead since the
-- last VACUUM: so yes once min_dead rows died, and whenever some died and the last VACUUM is
-- older than max_age seconds. An idle queue is not vacuumed at all. Without statistics
-- (track_counts off: n_dead_tup stays 0) the answer is always yes: a VACUUM every interval.
SELECT NOT current_setting('track_counts')::bool OR coalesce((
    SELECT s.n_dead_tup >= %(min_dead)s
        OR (s.n_dead_tup > 0
            AND coalesce(greatest(s.last_vacuum, s.last_autovacuum), '-infinity')
                <= now() - make_interval(secs => %(max_age)s))
    FROM pg_stat_user_tables s
    WHERE s.schemaname = %(schema)s AND s.relname = 'tenant_schedule'), true) AS due;

-- name: vacuum_tenant_schedule
-- Maintenance: every claim and finish rewrites a few schedule rows (vtime and running are
-- indexed, so the updates cannot be HOT). The table is tiny and hot; a minute of autovacuum
-- naptime lets it bloat to many times its size. SKIP_LOCKED: never wait behind anyone.
VACUUM (SKIP_LOCKED) {schema}.tenant_schedule, {schema}.slot_returns, {schema}.claim_budgets;

-- name: fold_stale_returns
-- Maintenance: slots given back over a second ago to tenants no claim has served since (an
-- idle tenant's last jobs) folded into their rows, and slots counted ahead for workers and
-- unused for a second given back, without waiting for any (slots.sql).
SELECT {schema}.fold_stale_returns(%(age)s::float8) AS n;

-- name: rebase_vtime
-- Maintenance: keep virtual times small, so that adding a small increment (cost / weight, down
-- to 0.001) to a vtime always changes it. Virtual time only ever grows while a queue has work;
-- once a queue's lowest active vtime passes %(threshold)s, the whole integer part of it is
-- subtracted from every tenant of that queue: the order and the differences, all that the
-- claims read, stay as they were (the subtraction of a float's own integer part is exact).
-- Rows are locked in (queue, tenant) order, as the finishes lock them: no deadlock.
WITH base AS MATERIALIZED (
    SELECT ts.queue, floor(min(ts.vtime)) AS b FROM {schema}.tenant_schedule ts
    WHERE ts.active GROUP BY ts.queue HAVING min(ts.vtime) >= %(threshold)s
),
locked AS MATERIALIZED (
    -- Queue by queue (a few, sorted), each queue's tenants in its primary key's order: never
    -- every queue's tenants read to lock one queue's.
    SELECT x.queue, x.tenant, b.b FROM (SELECT * FROM base ORDER BY queue) b
    CROSS JOIN LATERAL (
        SELECT ts.queue, ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = b.queue ORDER BY ts.tenant
        FOR NO KEY UPDATE OF ts) x
)
UPDATE {schema}.tenant_schedule ts SET vtime = ts.vtime - l.b
FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
RETURNING ts.queue;

-- name: decay_usage
-- Maintenance, for workers with a half-life (WorkerSettings.time_half_life): each of these
-- queues' active tenants keeps `factor` of its lead in virtual time over the queue's
-- (decay_usage, the function), queue by queue in name order, its rows in tenant order.
SELECT coalesce(sum({schema}.decay_usage(x.q, %(factor)s::float8)), 0)::int AS n
FROM (SELECT DISTINCT u.q FROM unnest(%(queues)s::text[]) AS u(q) ORDER BY u.q) x;

-- name: repair_schedule
-- Queued jobs whose (queue, tenant) has no schedule row get one (the engine's repair_schedule,
-- settings.sql): a check that should find nothing.
SELECT r.queue, r.tenant FROM {schema}.repair_schedule(%(limit)s) r;
