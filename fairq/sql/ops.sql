-- An operator's statements: list jobs, retry failed ones, cancel a tenant's backlog, forget a
-- tenant. Each is bounded by a limit and safe under running workers: a running job is never
-- touched (its ownership stays with the worker holding its lease), queued jobs a claim holds are
-- skipped (SKIP LOCKED), and tenant rows are locked in (queue, tenant) order like the finishes.

-- name: list_jobs
-- Newest first; every filter is optional (NULL: any).
SELECT j.* FROM {schema}.jobs j
WHERE (%(status)s::text IS NULL OR j.status = %(status)s::text)
  AND (%(tenant)s::text IS NULL OR j.tenant = %(tenant)s::text)
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
ORDER BY j.id DESC
LIMIT %(limit)s;

-- name: retry_jobs
-- Failed (or cancelled) jobs back to queued, due now, with their attempts reset; the last error
-- stays for reference. Either the ids given or, with ids NULL, up to `limit` failed jobs
-- (optionally of one tenant). A job whose idempotency key a live (queued or running) job of its
-- task and tenant holds stays as it is, and so does the second of two picked jobs with one key:
-- both are returned with the job that holds the key (held_by), the others retried. Their
-- tenants become runnable by the engine's activation rule (docs/algorithm.md): an idle tenant
-- starts at its queue's virtual time V; a tenant fairq has no schedule row for (deleted) gets
-- one, as an enqueue would create it.
-- (Two branches, each off when its parameter is: the ids go by the primary key, the failed
-- jobs by the finished-jobs index.)
WITH picked AS MATERIALIZED (
    -- The candidates' ids sorted (a few: the ids given, or `limit` of the failed jobs), then
    -- each locked by its key in that order; never the jobs table read in key order.
    SELECT x.id, x.task, x.tenant, x.key FROM (
        (SELECT f.id FROM {schema}.jobs f
         WHERE f.id = ANY(%(ids)s::bigint[]) AND f.status IN ('failed', 'cancelled'))
        UNION ALL
        (SELECT f.id FROM {schema}.jobs f
         WHERE %(ids)s::bigint[] IS NULL AND f.status = 'failed'
           AND (%(tenant)s::text IS NULL OR f.tenant = %(tenant)s::text)
         ORDER BY f.finished_at
         LIMIT %(limit)s)
        ORDER BY 1) w
    CROSS JOIN LATERAL (
        SELECT q.id, q.task, q.tenant, q.key FROM {schema}.jobs q
        WHERE q.id = w.id AND q.status IN ('failed', 'cancelled')
        FOR UPDATE OF q SKIP LOCKED) x
    LIMIT %(limit)s
),
judged AS MATERIALIZED (
    -- The job holding each picked key: a live job of the same task, tenant and key (the keys'
    -- unique index), else the first picked job with that key (a window over the picked rows,
    -- not a search of them per row), which is retried.
    SELECT p.id, p.key,
           CASE WHEN p.key IS NOT NULL THEN coalesce(
               (SELECT l.id FROM {schema}.jobs l
                WHERE l.task = p.task AND l.key = p.key AND l.tenant = p.tenant
                  AND l.status IN ('queued', 'running')
                LIMIT 1),
               nullif(p.first_id, p.id))
           END AS held_by
    FROM (SELECT k.*, min(k.id) OVER (PARTITION BY k.task, k.tenant, k.key) AS first_id
          FROM picked k) p
),
retried AS (
    UPDATE {schema}.jobs j
    SET status = 'queued', attempts = 0, run_at = now(), finished_at = NULL, started_at = NULL,
        locked_until = NULL, locked_by = NULL
    FROM judged p WHERE j.id = p.id AND p.held_by IS NULL
    RETURNING j.id, j.queue, j.tenant
),
per_tenant AS (SELECT DISTINCT r.queue, r.tenant FROM retried r),
defaults AS (
    SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running
    FROM {schema}.settings WHERE key = 'tenant_defaults'
),
new_tenants AS (
    INSERT INTO {schema}.tenant_schedule AS ts (queue, tenant, weight, max_running, vtime, active)
    SELECT p.queue, p.tenant, coalesce(t.weight, d.weight, 1.0),
           coalesce(t.max_running, d.max_running, 10), {schema}.queue_vtime(p.queue), true
    FROM per_tenant p
    LEFT JOIN {schema}.tenants t ON t.tenant = p.tenant
    LEFT JOIN defaults d ON true
    ORDER BY p.queue, p.tenant
    ON CONFLICT (queue, tenant) DO NOTHING
    RETURNING ts.queue
),
locked AS MATERIALIZED (
    SELECT x.queue, x.tenant
    FROM (SELECT * FROM per_tenant ORDER BY queue, tenant) p
    CROSS JOIN LATERAL (SELECT ts.queue, ts.tenant FROM {schema}.tenant_schedule ts
                        WHERE ts.queue = p.queue AND ts.tenant = p.tenant
                        FOR NO KEY UPDATE OF ts) x
),
woken AS (
    UPDATE {schema}.tenant_schedule ts
    SET active = true, wake_at = NULL,
        vtime = CASE WHEN ts.active THEN ts.vtime
                     ELSE greatest({schema}.queue_vtime(ts.queue),
                                   least(ts.vtime, {schema}.queue_vtime(ts.queue)
                                                   + greatest(1.0, 1.0 / ts.weight))) END
    FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
    RETURNING ts.queue
),
notified AS (
    SELECT count(pg_notify(%(channel)s, q.queue)) AS n
    FROM (SELECT DISTINCT p.queue FROM per_tenant p) q
)
SELECT r.id, NULL::text AS key, NULL::bigint AS held_by,
       (SELECT n FROM notified) AS notified,
       (SELECT count(*) FROM new_tenants) + (SELECT count(*) FROM woken) AS tenants_touched
FROM retried r
UNION ALL
SELECT p.id, p.key, p.held_by, NULL, NULL FROM judged p WHERE p.held_by IS NOT NULL
ORDER BY 1;

-- name: failed_jobs
-- The failed jobs retry_jobs without ids picks, in its order (one at a time, when a batch
-- could not be retried whole).
SELECT f.id FROM {schema}.jobs f
WHERE f.status = 'failed' AND (%(tenant)s::text IS NULL OR f.tenant = %(tenant)s::text)
ORDER BY f.finished_at
LIMIT %(limit)s;

-- name: job_states
-- The status of each of these jobs (a missing id: no such job), to say why one was not retried.
SELECT j.id, j.status FROM {schema}.jobs j WHERE j.id = ANY(%(ids)s::bigint[]);

-- name: cancel_tenant
-- A tenant's queued jobs (of one queue, or all) -> cancelled, up to `limit` in one statement.
-- Running jobs finish; queued jobs a claim is taking right now are skipped (the claim wins).
-- The tenant's schedule row is left to the claims: one that walks past an active tenant with
-- no due job retires it. Over `limit`, which of them go is not said: no order is asked for, as
-- an order by id would be the whole jobs table read by primary key (fairq's sessions plan with
-- sorts off); SKIP LOCKED, so the order of the locks cannot deadlock.
WITH picked AS MATERIALIZED (
    SELECT q.id FROM {schema}.jobs q
    WHERE q.tenant = %(tenant)s::text AND q.status = 'queued'
      AND (%(queue)s::text IS NULL OR q.queue = %(queue)s::text)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.jobs j SET status = 'cancelled', finished_at = now()
FROM picked p WHERE j.id = p.id AND j.status = 'queued'
RETURNING j.id;

-- name: delete_tenant_schedule
-- Forget a tenant's schedule rows, first in its transaction: the delete waits for producers
-- holding the rows (FOR KEY SHARE until their enqueue commits) and for claims and finishes, and
-- an enqueue that comes after it waits for this transaction and then creates the row afresh.
-- The transaction's next statement (tenant_jobs_pending, a fresh snapshot) then sees every job
-- committed before, and the store rolls back if the tenant has any queued or running.
WITH returns AS (DELETE FROM {schema}.slot_returns WHERE tenant = %(tenant)s),
     ahead AS (DELETE FROM {schema}.claim_budgets WHERE tenant = %(tenant)s)
DELETE FROM {schema}.tenant_schedule WHERE tenant = %(tenant)s RETURNING queue;

-- name: tenant_jobs_pending
SELECT count(*) FILTER (WHERE status = 'queued') AS queued,
       count(*) FILTER (WHERE status = 'running') AS running
FROM {schema}.jobs WHERE tenant = %(tenant)s AND status IN ('queued', 'running');

-- name: restore_tenant_schedule
-- After a delete: schedule rows for any queued job of the tenant that committed around it, made
-- as an enqueue makes them (ensure_schedule; the tenant's settings lock is held).
SELECT {schema}.ensure_schedule(array_agg(p.queue), array_agg(p.tenant), array_agg(p.first_run))
    AS made
FROM (SELECT q.queue, q.tenant, min(q.run_at) AS first_run FROM {schema}.jobs q
      WHERE q.tenant = %(tenant)s AND q.status = 'queued' GROUP BY 1, 2) p;

-- name: delete_tenant_config
-- The tenant's own weight and cap go; the defaults apply to it from the next claim.
DELETE FROM {schema}.tenants WHERE tenant = %(tenant)s RETURNING tenant;

-- name: sync_tenant_to_defaults
-- The tenant follows the defaults: weight, cap and rate limit (a full bucket), no group. A full
-- bucket ends its throttled interval, credited up to now (throttled_open).
UPDATE {schema}.tenant_schedule ts
SET weight = %(weight)s, max_running = %(max_running)s, rate = %(rate)s, burst = %(burst)s,
    tokens = NULL, refilled_at = NULL, tenant_group = NULL,
    throttled_seconds = ts.throttled_seconds + {schema}.throttled_open(ts), throttled_since = NULL
WHERE ts.tenant = %(tenant)s;

-- name: drop_schema
-- Drop a scratch schema and everything in it (`fairq demo` drains each policy in one). A utility
-- statement: it cannot be prepared.
DROP SCHEMA IF EXISTS {schema} CASCADE;
