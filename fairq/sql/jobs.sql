-- Job lifecycle statements. {schema} is the quoted schema identifier; the rest are bound
-- parameters. Every finish, failure and extend is fenced on (id, status = 'running', attempts):
-- a worker that lost its lease changes nothing (R7).

-- name: enqueue
-- Insert a chunk of jobs in one round trip (arrays, see below), create the tenants'
-- schedule rows on first sight (with the configured or default weight and cap), wake idle
-- tenants, and notify listeners at commit.
--
-- A tenant that becomes active starts at the queue's virtual time V (queue_vtime): idle time
-- banks no credit and no debt, and an idle queue starts afresh.
--
-- Tenants and payloads come one element per job. Every other array has one element per job too,
-- or a single element that every job of the chunk shares (a bulk enqueue): unnest pads it
-- with NULLs and the CASEs give every row that element, so it is neither sent nor unnested
-- 5,000 times.
WITH arg AS MATERIALIZED (  -- each cast once, not once a row
    SELECT %(queues)b::text[] AS queues, %(tasks)b::text[] AS tasks,
           %(priorities)b::smallint[] AS priorities, %(costs)b::float8[] AS costs,
           %(run_ats)b::timestamptz[] AS run_ats, %(delays)b::float8[] AS delays,
           %(max_attempts)b::int[] AS max_attempts, %(leases)b::int[] AS leases
),
input AS (
    SELECT i.ord, i.tenant, i.payload,
           CASE WHEN cardinality(a.queues) = 1 THEN a.queues[1] ELSE i.queue END AS queue,
           CASE WHEN cardinality(a.tasks) = 1 THEN a.tasks[1] ELSE i.task END AS task,
           CASE WHEN cardinality(a.priorities) = 1 THEN a.priorities[1] ELSE i.priority END
               AS priority,
           CASE WHEN cardinality(a.costs) = 1 THEN a.costs[1] ELSE i.cost END AS cost,
           CASE WHEN cardinality(a.run_ats) = 1 THEN a.run_ats[1] ELSE i.run_at END AS run_at,
           CASE WHEN cardinality(a.delays) = 1 THEN a.delays[1] ELSE i.delay END AS delay,
           CASE WHEN cardinality(a.max_attempts) = 1 THEN a.max_attempts[1] ELSE i.max_attempts END
               AS max_attempts,
           CASE WHEN cardinality(a.leases) = 1 THEN a.leases[1] ELSE i.lease_seconds END
               AS lease_seconds
    FROM arg a, unnest(
        a.queues, %(tenants)b::text[], a.tasks, %(payloads)b::text[]::jsonb[], a.priorities,
        a.costs, a.run_ats, a.max_attempts, a.leases, a.delays
    ) WITH ORDINALITY AS i(queue, tenant, task, payload, priority, cost, run_at,
                           max_attempts, lease_seconds, delay, ord)
),
ins AS (
    INSERT INTO {schema}.jobs (queue, tenant, task, payload, priority, cost, run_at,
                               max_attempts, lease_seconds)
    -- A delay is added to the database clock, never to the producer's.
    SELECT i.queue, i.tenant, i.task, i.payload, i.priority, i.cost,
           coalesce(i.run_at, now() + make_interval(secs => coalesce(i.delay, 0))),
           i.max_attempts, i.lease_seconds
    FROM input i ORDER BY i.ord
    RETURNING id, queue, tenant, run_at
),
per_tenant AS (
    SELECT ins.queue, ins.tenant, min(ins.run_at) AS first_run FROM ins GROUP BY 1, 2
),
defaults AS (
    SELECT (value->>'weight')::float8 AS weight, (value->>'max_running')::int AS max_running,
           (value->>'rate')::float8 AS rate, (value->>'burst')::int AS burst
    FROM {schema}.settings WHERE key = 'tenant_defaults'
),
new_tenants AS (
    INSERT INTO {schema}.tenant_schedule AS ts (queue, tenant, weight, max_running, vtime, active, wake_at,
                                               rate, burst, tenant_group)
    SELECT p.queue, p.tenant, coalesce(t.weight, d.weight, 1.0), coalesce(t.max_running, d.max_running, 10),
           {schema}.queue_vtime(p.queue), p.first_run <= now(),
           CASE WHEN p.first_run > now() THEN p.first_run END,
           CASE WHEN t.tenant IS NOT NULL THEN t.rate ELSE d.rate END,
           CASE WHEN t.tenant IS NOT NULL THEN t.burst ELSE d.burst END, t.tenant_group
    FROM per_tenant p
    LEFT JOIN {schema}.tenants t ON t.tenant = p.tenant
    LEFT JOIN defaults d ON true
    ORDER BY p.queue, p.tenant
    ON CONFLICT (queue, tenant) DO NOTHING
    RETURNING ts.queue
),
-- Existing tenants, FOR KEY SHARE until this transaction commits: a claim retires a tenant
-- (claim_settle) only under FOR UPDATE, which conflicts, so it cannot retire one whose new job
-- it cannot see yet. If a claim retired it first, the lock waits for that claim and returns
-- the retired row, and the tenant is woken below. KEY SHARE does not conflict with the claims'
-- and finishes' FOR NO KEY UPDATE: a producer's open transaction delays nobody.
seen AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, ts.active, ts.wake_at
    FROM {schema}.tenant_schedule ts JOIN per_tenant p USING (queue, tenant)
    ORDER BY ts.queue, ts.tenant
    FOR KEY SHARE OF ts
),
-- Only idle tenants are written: a busy tenant's row is left to the claimers.
woken AS (
    UPDATE {schema}.tenant_schedule ts
    SET active = p.first_run <= now(),
        vtime = CASE WHEN p.first_run <= now() THEN {schema}.queue_vtime(ts.queue) ELSE ts.vtime END,
        wake_at = CASE WHEN p.first_run <= now() THEN NULL ELSE least(ts.wake_at, p.first_run) END
    FROM seen s JOIN per_tenant p USING (queue, tenant)
    WHERE ts.queue = s.queue AND ts.tenant = s.tenant AND NOT s.active
      AND (p.first_run <= now() OR s.wake_at IS NULL OR p.first_run < s.wake_at)
    RETURNING ts.queue
)
SELECT (SELECT array_agg(ins.id ORDER BY ins.id) FROM ins) AS ids,
       (SELECT count(pg_notify(%(channel)s, q.queue))
        FROM (SELECT DISTINCT p.queue FROM per_tenant p WHERE p.first_run <= now()) q) AS notified,
       (SELECT count(*) FROM new_tenants) + (SELECT count(*) FROM woken) AS tenants_touched;

-- name: finish_done
-- Mark a batch of running jobs done; give their tenants' slots back. Returns the ids that
-- were still ours (the others lost their lease and are left alone).
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
),
done AS (
    UPDATE {schema}.jobs j
    SET status = 'done', finished_at = now(), locked_until = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
    RETURNING j.id, j.queue, j.tenant, j.task, j.started_at, j.finished_at
),
per_tenant AS (SELECT d.queue, d.tenant, count(*) AS n FROM done d GROUP BY 1, 2),
locked AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, p.n
    FROM {schema}.tenant_schedule ts JOIN per_tenant p USING (queue, tenant)
    ORDER BY ts.queue, ts.tenant
    FOR NO KEY UPDATE OF ts
),
upd AS (
    UPDATE {schema}.tenant_schedule ts SET running = ts.running - l.n
    FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
    RETURNING ts.tenant
)
SELECT d.id, d.queue, d.tenant, d.task,
       extract(epoch FROM d.finished_at - d.started_at)::float8 AS run_seconds
FROM done d;

-- name: finish_failed
-- Record failures: back to queued with exponential backoff (20 s, 40 s, 80 s ... capped at
-- 1 hour) or failed for good after max_attempts (R8). The retry waits in run_at, so it neither
-- blocks its tenant's other jobs nor pre-empts anyone (R27).
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[],
                         %(retry_delays)s::float8[])
        AS i(id, attempts, error, retry_delay)
),
failed AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at
                      ELSE now() + make_interval(secs => coalesce(
                          i.retry_delay, least(3600.0, 20.0 * power(2, j.attempts - 1)))) END,
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        last_error = i.error, locked_until = NULL, locked_by = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
    RETURNING j.id, j.queue, j.tenant, j.task, j.status, j.run_at, j.started_at
),
per_tenant AS (
    SELECT f.queue, f.tenant, count(*) AS n,
           min(f.run_at) FILTER (WHERE f.status = 'queued') AS retry_at
    FROM failed f GROUP BY 1, 2
),
locked AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, p.n, p.retry_at
    FROM {schema}.tenant_schedule ts JOIN per_tenant p USING (queue, tenant)
    ORDER BY ts.queue, ts.tenant
    FOR NO KEY UPDATE OF ts
),
upd AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running - l.n,
        wake_at = CASE WHEN NOT ts.active AND l.retry_at IS NOT NULL
                       THEN least(ts.wake_at, l.retry_at) ELSE ts.wake_at END
    FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
    RETURNING ts.tenant
)
SELECT f.id, f.queue, f.tenant, f.task, f.status,
       extract(epoch FROM now() - f.started_at)::float8 AS run_seconds
FROM failed f;

-- name: extend_leases
-- Push the leases of our running jobs forward; returns the ids that are still ours (R10).
UPDATE {schema}.jobs j
SET locked_until = now() + make_interval(secs => coalesce(%(seconds)s, j.lease_seconds))
FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
RETURNING j.id, j.locked_until;

-- name: release_unstarted
-- Hand back jobs a stopping worker claimed but never started: queued again at their old place,
-- the claim's attempt undone, their tenants' slots given back and the tenants runnable again.
-- Fenced like every finish, so a job already reaped and re-claimed elsewhere is left alone.
WITH input AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]) AS i(id, attempts)
),
released AS (
    UPDATE {schema}.jobs j
    SET status = 'queued', attempts = j.attempts - 1, locked_until = NULL, locked_by = NULL,
        started_at = NULL
    FROM input i
    WHERE j.id = i.id AND j.status = 'running' AND j.attempts = i.attempts
    RETURNING j.id, j.queue, j.tenant
),
per_tenant AS (SELECT r.queue, r.tenant, count(*) AS n FROM released r GROUP BY 1, 2),
locked AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, p.n
    FROM {schema}.tenant_schedule ts JOIN per_tenant p USING (queue, tenant)
    ORDER BY ts.queue, ts.tenant
    FOR NO KEY UPDATE OF ts
),
upd AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running - l.n, active = true, wake_at = NULL,
        vtime = CASE WHEN ts.active THEN ts.vtime ELSE {schema}.queue_vtime(ts.queue) END
    FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
    RETURNING ts.tenant
)
SELECT r.id FROM released r;

-- name: reap_expired
-- Return running jobs whose lease expired to the queue, or fail them at max_attempts (R9), and
-- give their tenants' slots back. SKIP LOCKED: a worker finishing one of them right now wins.
WITH expired AS MATERIALIZED (
    SELECT q.id FROM {schema}.jobs q
    WHERE q.status = 'running' AND q.locked_until < now()
    ORDER BY q.locked_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE {schema}.jobs j
    SET status = CASE WHEN j.attempts >= j.max_attempts THEN 'failed' ELSE 'queued' END,
        run_at = CASE WHEN j.attempts >= j.max_attempts THEN j.run_at ELSE now() END,
        finished_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
        last_error = format('lease expired during attempt %%s of %%s (worker %%s)',
                            j.attempts, j.max_attempts, coalesce(j.locked_by, '?')),
        locked_until = NULL, locked_by = NULL
    FROM expired e WHERE j.id = e.id
    RETURNING j.id, j.queue, j.tenant, j.status
),
per_tenant AS (
    SELECT r.queue, r.tenant, count(*) AS n, bool_or(r.status = 'queued') AS requeued
    FROM reaped r GROUP BY 1, 2
),
locked AS MATERIALIZED (
    SELECT ts.queue, ts.tenant, p.n, p.requeued
    FROM {schema}.tenant_schedule ts JOIN per_tenant p USING (queue, tenant)
    ORDER BY ts.queue, ts.tenant
    FOR NO KEY UPDATE OF ts
),
upd AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running - l.n,
        active = ts.active OR l.requeued,
        vtime = CASE WHEN NOT ts.active AND l.requeued THEN {schema}.queue_vtime(ts.queue)
                     ELSE ts.vtime END,
        wake_at = CASE WHEN l.requeued THEN NULL ELSE ts.wake_at END
    FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
    RETURNING ts.tenant
)
SELECT r.id, r.queue, r.tenant, r.status FROM reaped r;

-- name: cancel
-- queued -> cancelled; a running job is left to finish (CONTRACT).
UPDATE {schema}.jobs SET status = 'cancelled', finished_at = now()
WHERE id = %(id)s AND status = 'queued'
RETURNING id;

-- name: get_job
SELECT id, queue, tenant, task, payload, status, priority, cost, run_at, attempts, max_attempts,
       lease_seconds, locked_until, locked_by, last_error, created_at, started_at, finished_at
FROM {schema}.jobs WHERE id = %(id)s;

-- name: prune_finished
-- Delete one batch of finished jobs older than max_age seconds (R13); call until it returns 0.
WITH old AS (
    SELECT id FROM {schema}.jobs
    WHERE status IN ('done', 'failed', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(max_age)s)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.jobs j USING old WHERE j.id = old.id;

-- name: wake_due_tenants
-- Maintenance: idle tenants whose delayed jobs or retries are now due become runnable again,
-- at the current virtual time of their queue (no banked credit).
UPDATE {schema}.tenant_schedule ts
SET active = true, wake_at = NULL,
    vtime = {schema}.queue_vtime(ts.queue)
WHERE NOT ts.active AND ts.wake_at <= now()
RETURNING ts.queue, ts.tenant;

-- name: wake_stranded_tenants
-- Maintenance safety net, run rarely: an idle tenant whose due job committed while a claimer
-- was concluding it had none. O(idle tenants); the wake_at path above is the common one. A
-- rate-limited tenant waiting for its next token (tenant_dry) is idle on purpose.
UPDATE {schema}.tenant_schedule ts
SET active = true, wake_at = NULL,
    vtime = {schema}.queue_vtime(ts.queue)
WHERE NOT ts.active AND NOT {schema}.tenant_dry(ts) AND EXISTS (
    SELECT 1 FROM {schema}.jobs q
    WHERE q.queue = ts.queue AND q.tenant = ts.tenant AND q.status = 'queued' AND q.run_at <= now())
RETURNING ts.queue, ts.tenant;

-- name: maintenance_due
-- Returns a row when the caller should run the named maintenance task now: at most one worker
-- per interval, decided by the database without session state (works through a pooler).
INSERT INTO {schema}.settings AS s (key, value)
VALUES (%(key)s, jsonb_build_object('at', now()))
ON CONFLICT (key) DO UPDATE SET value = excluded.value
WHERE (s.value->>'at')::timestamptz <= now() - make_interval(secs => %(interval)s)
RETURNING s.key;

-- name: runnable_count
-- Is anything runnable now in these queues (for --until-empty)?
SELECT count(*) AS n FROM (
    SELECT 1 FROM {schema}.jobs
    WHERE queue = ANY(%(queues)s) AND status = 'queued' AND run_at <= now() LIMIT 1) s;

-- name: vacuum_tenant_schedule
-- Maintenance: every claim and finish rewrites a few schedule rows (vtime and running are
-- indexed, so the updates cannot be HOT). The table is tiny and hot; a minute of autovacuum
-- naptime lets it bloat to many times its size. SKIP_LOCKED: never wait behind anyone.
VACUUM (SKIP_LOCKED) {schema}.tenant_schedule;

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
    SELECT ts.queue, ts.tenant, b.b FROM {schema}.tenant_schedule ts JOIN base b USING (queue)
    ORDER BY ts.queue, ts.tenant
    FOR NO KEY UPDATE OF ts
)
UPDATE {schema}.tenant_schedule ts SET vtime = ts.vtime - l.b
FROM locked l WHERE ts.queue = l.queue AND ts.tenant = l.tenant
RETURNING ts.queue;
