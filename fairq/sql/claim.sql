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
-- Weighted fair queueing over tenants by virtual time (docs/algorithm.md, "The definition"),
-- run by the function claim_fair (claim.sql of fairq.schema.FUNCTION_FILES), which runs only
-- the steps a claim needs: a statement holding every step would start all of them at every
-- claim.
-- Parameters: by_weight, by_cost, by_time (round_robin: false/false/false; weighted:
-- true/false/false; drr: true/true/false; time: true/false/true), window (= batch, in jobs of
-- the first runnable tenant), wait. When it took nothing while holding a
-- lock it returns one row of NULLs, and the store runs it again with `wait` (holding nothing,
-- it then waits for the first runnable tenant's row). Columns: as claim_fifo's.
SELECT c.id, c.queue, c.tenant, c.task, c.payload, c.attempts, c.max_attempts,
       c.lease_seconds, c.priority, c.cost, c.run_at, c.started_at, c.locked_until
FROM {schema}.claim_fair(%(queue)s, %(batch)s::int, %(by_weight)s, %(by_cost)s, %(by_time)s,
                         %(window)s::float8, %(wait)s, %(worker)s) c;

-- name: claim_fifo
-- The global order (priority, run_at, id), skipping tenants at their cap or without a token
-- (claim_room): the baseline.
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
      -- statement says it, so only this statement reads that index.
      AND q.cost > 0
      -- A scalar subquery, not EXISTS: the planner cannot flatten it into a join that reads
      -- and sorts the whole backlog; it stays a per-row probe under the ordered index scan.
      AND (SELECT {schema}.claim_room(ts) > 0 FROM {schema}.tenant_schedule ts
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
-- The picked jobs' tenants, locked in tenant order, each by its key; room is read from the
-- current rows (a lock that waited returns the row as it is now).
locked AS MATERIALIZED (
    SELECT x.ctid, x.tenant, x.room
    FROM (SELECT DISTINCT p.tenant FROM picked p ORDER BY p.tenant) p
    CROSS JOIN LATERAL (
        SELECT ts.ctid, ts.tenant, {schema}.claim_room(ts) AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.tenant = p.tenant
        FOR NO KEY UPDATE OF ts) x
),
granted AS MATERIALIZED (
    SELECT r.id, r.tenant FROM ranked r
    JOIN locked l ON l.tenant = r.tenant
    WHERE r.rk <= l.room
),
claimed AS (
    UPDATE {schema}.jobs j
    SET status = 'running', attempts = j.attempts + 1, started_at = now(),
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s,
        charged_s = NULL  -- not charged by time: its finish corrects nothing
    WHERE j.id = ANY ((SELECT array_agg(g.id) FROM granted g)::bigint[])
    RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
              j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until
),
-- The running counts, written by claim_settle (a locked row may be newer than this
-- statement's snapshot; see claim_fair). fifo retires no tenant.
served AS MATERIALIZED (
    SELECT l.ctid, l.tenant, count(*)::int AS n FROM granted g JOIN locked l USING (tenant)
    GROUP BY l.ctid, l.tenant
),
settled AS MATERIALIZED (
    SELECT {schema}.claim_settle(
        %(queue)s, false, NULL, NULL, NULL, array(SELECT sv.ctid FROM served sv),
        array(SELECT sv.tenant FROM served sv), array(SELECT sv.n FROM served sv),
        array(SELECT 0.0::float8 FROM served sv), '{{}}', '{{}}', '{{}}') AS n
    WHERE (SELECT count(*) FROM claimed) >= 0
)
SELECT c.id, c.queue, c.tenant, c.task, c.payload, c.attempts, c.max_attempts,
       c.lease_seconds, c.priority, c.cost, c.run_at, c.started_at, c.locked_until
FROM claimed c
WHERE (SELECT st.n FROM settled st) IS NOT NULL;

-- name: next_wake
-- Seconds until the queue's first idle tenant is due to wake (a delayed job or retry falling
-- due, a rate-limited tenant's next token), NULL when none waits: a worker whose claim came
-- back short sleeps until then rather than until its next poll. Read through
-- tenant_schedule_due_idx (queue, wake_at) WHERE NOT active AND wake_at IS NOT NULL.
SELECT extract(epoch FROM ts.wake_at - now())::float8 AS seconds
FROM {schema}.tenant_schedule ts
WHERE ts.queue = %(queue)s AND NOT ts.active AND ts.wake_at IS NOT NULL
ORDER BY ts.wake_at LIMIT 1;

-- name: next_token
-- Seconds until the earliest next token of a rate-limited tenant in these queues that has a due
-- job and a free slot (not paused, not at its cap), NULL when there is none: such a job waits
-- for time alone, so `run(until_empty=True)` sleeps until then instead of ending. 0 when a
-- token is there already (it came while the claim ran). Read once, when a drain would end.
SELECT greatest(0.0, extract(epoch FROM min({schema}.token_due(ts)) - now())::float8)
       AS seconds
FROM {schema}.tenant_schedule ts
WHERE ts.queue = ANY(%(queues)s) AND ts.rate IS NOT NULL AND ts.running < ts.max_running
  AND EXISTS (SELECT 1 FROM {schema}.jobs j
              WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                AND j.run_at <= now())
HAVING count(*) > 0;
