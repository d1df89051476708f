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
-- Weighted fair queueing over tenants by virtual time (docs/algorithm.md, "The definition").
-- Parameters: by_weight, by_cost (round_robin: false/false; weighted: true/false; drr:
-- true/true), window (= batch, in virtual time), wait.
-- 1. Sleepers (idle tenants whose delayed jobs fell due) are locked; they rejoin at V, first in
--    the walk: a job that fell due is claimable without waiting for any maintenance.
-- 2. The walk: runnable tenants in (vtime, tenant) order, at most `window` of virtual time ahead
--    of the first, each row locked as the walk reaches it, SKIP LOCKED (a tenant another claim
--    holds is being served by it); each gives the due jobs that start within the window
--    (counting 1/weight per job), at least one, up to its free slots and, with a rate limit,
--    its whole tokens (claim_room); the walk stops when the batch is full. It numbers the rows
--    it locks (rn: row_number() is computed row by row, so it does not read ahead of the
--    walk). No share of the batch per tenant: a claim serves as few tenants as it can, so it
--    (and its finish) writes few tenant rows.
-- 3. When the walk took nothing and the statement holds no lock (no transaction id yet: every
--    row it could have locked was held), wait_and_pick picks the jobs of the first runnable
--    tenant with a due job and waits for its row, in this statement. Holding no tenant row, the
--    wait cannot close a lock cycle (engine_v9.sql). A statement that took nothing and holds
--    something (sleepers or walked tenants with nothing due, or a row the wait found without
--    room) could not wait: it returns one row of NULLs, and the store runs it again with `wait`
--    (no sleepers, no walk, the same wait). One that took nothing and holds nothing has waited
--    already: it returns no row, and the store sends nothing more.
-- 4. The jobs are marked running, then claim_settle writes the tenants' counts and virtual times
--    and takes every tenant served or walked past that has no due job left out of the runnable
--    set. It is a function because it needs snapshots taken after this statement's locks.
WITH
sleepers AS MATERIALIZED (
    SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
    FROM {schema}.tenant_schedule s
    WHERE s.queue = %(queue)s AND NOT s.active AND s.wake_at <= now() AND NOT %(wait)s
    ORDER BY s.wake_at
    FOR NO KEY UPDATE OF s SKIP LOCKED
),
-- The walk's reach: one window of virtual time past the first runnable tenant.
reach AS MATERIALIZED (
    SELECT ts.vtime + %(window)s AS hi FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1
),
cand AS (
    (SELECT 0 AS part, sl.ctid, sl.tenant, NULL::float8 AS vtime,
            CASE WHEN %(by_weight)s THEN sl.weight ELSE 1.0 END AS w, sl.room, NULL AS rn
     FROM sleepers sl WHERE sl.room > 0 ORDER BY sl.tenant)
    UNION ALL
    SELECT 1, r.ctid, r.tenant, r.vtime, r.w, r.room, row_number() OVER () FROM (
        SELECT ts.ctid, ts.tenant, ts.vtime,
               CASE WHEN %(by_weight)s
                    THEN ts.weight * coalesce((SELECT factor FROM {schema}.group_schedule
                                               WHERE queue = ts.queue
                                                 AND tenant_group = coalesce(ts.tenant_group, 'default')), 1.0)
                    ELSE 1.0 END AS w,
               {schema}.claim_room(ts) AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
          AND ts.vtime <= (SELECT r.hi FROM reach r) AND NOT %(wait)s
        ORDER BY ts.vtime, ts.tenant
        -- A bound the walk never reaches in practice (it stops with the batch), there so the
        -- planner reads the index in order instead of reading all of it and sorting.
        LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED) r
),
taken AS MATERIALIZED (
    (SELECT j.id, c.part, c.ctid, c.tenant,
           CASE WHEN %(by_cost)s THEN j.cost ELSE 1.0 END / c.w AS inc, b.n AS most,
           false AS more, c.rn, j.k
    FROM cand c
    -- Step 3: the jobs that start within the window, at least one. Each counts 1/w of virtual
    -- time (drr: its first due job's cost / w); a sleeper starts at V, the first runnable
    -- tenant's vtime (`hi` - window), so a whole window, also when no tenant is runnable (no
    -- `hi`). OFFSET 0: computed once, for the pick and for `served`.
    CROSS JOIN LATERAL (
        SELECT least(c.room, greatest(1.0, coalesce(floor(
                  coalesce((SELECT r.hi FROM reach r) - c.vtime, %(window)s) * c.w
                  / CASE WHEN %(by_cost)s THEN
                        (SELECT f.cost FROM {schema}.jobs f
                         WHERE f.queue = %(queue)s AND f.tenant = c.tenant
                           AND f.status = 'queued' AND f.run_at <= now()
                         ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1)
                    ELSE 1.0 END) + 1,
                  c.room)))::int AS n OFFSET 0) b
    -- k numbers a tenant's jobs in the queue's order (row_number() is computed row by row: it
    -- reads no job ahead of the LIMIT below, so it locks none that is not taken).
    CROSS JOIN LATERAL (
        SELECT p.id, p.cost, row_number() OVER () AS k FROM (
            SELECT q.id, q.cost
            FROM {schema}.jobs q
            WHERE q.queue = %(queue)s AND q.tenant = c.tenant
              AND q.status = 'queued' AND q.run_at <= now()
            ORDER BY q.priority DESC, q.run_at, q.id
            LIMIT b.n
            FOR UPDATE OF q SKIP LOCKED) p
    ) j
    LIMIT %(batch)s)
    UNION ALL
    -- Step 5, the wait (wait_and_pick: as many of its picked jobs as fit once its row is held,
    -- not bounded by the window, as the claim it waited for has just moved its vtime; `more`:
    -- it has a due job left).
    SELECT h.id, 2, h.row_, h.tenant, h.inc, NULL, h.more, NULL, NULL
    FROM {schema}.wait_and_pick(%(queue)s, %(batch)s::int, %(by_weight)s, %(by_cost)s) h
    WHERE %(wait)s OR pg_current_xact_id_if_assigned() IS NULL
),
claimed AS (
    UPDATE {schema}.jobs j
    SET status = 'running', attempts = j.attempts + 1, started_at = now(),
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
    WHERE j.id = ANY ((SELECT array_agg(t.id) FROM taken t)::bigint[])
    RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
              j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until
),
-- Where the walk stopped, if it filled the batch there: the last tenant it served, the one with
-- the highest walk number. Its key in the runnable index (its vtime in this statement's
-- snapshot: a row another claim served since is locked as it is now, up to a window further
-- on) goes to claim_settle only when the walk went past a row it locked without serving it (the
-- stop's number is past the count of tenants served); claim_settle then reads the tenants
-- before the stop for those. A walk that served every row it locked, the usual case, skips
-- that read. Rows other transactions held are not numbered: the walk skipped them, and their
-- holders settle them (or the next walk that locks one).
stop AS MATERIALIZED (
    SELECT CASE WHEN t.rn > (SELECT count(DISTINCT l.rn) FROM taken l)
                THEN (SELECT o.vtime FROM {schema}.tenant_schedule o
                      WHERE o.queue = %(queue)s AND o.tenant = t.tenant) END AS v, t.tenant
    FROM taken t WHERE t.part = 1 AND (SELECT count(*) FROM taken) >= %(batch)s
    ORDER BY t.rn DESC LIMIT 1
),
-- Per served tenant: its row, jobs, virtual time increment, and whether it looks empty now
-- (no due job left; claim_settle decides it again under a lock). The waited tenant says so
-- itself (its wait's snapshot is newer than this statement's). A tenant that gave fewer jobs
-- than its pick allowed had no more, unless the batch cut it short: the last one served (the
-- stop, or the last sleeper when sleepers filled the batch; no tenant is named ''). That one is
-- asked, in this statement's snapshot (the walk waits for nothing), for a due job after the last
-- one it gave (due_after_job, engine_v11.sql: not from the head of its queue, read by the pick),
-- the one its pick numbered last (max(ARRAY[k, id]): the id of the highest k, without a sort).
served AS MATERIALIZED (
    SELECT t.ctid, t.tenant, count(*)::int AS n, sum(t.inc) AS inc,
           CASE WHEN max(t.part) = 2 THEN NOT bool_or(t.more)
                WHEN count(*) < max(t.most) AND t.tenant <> coalesce(
                    (SELECT st.tenant FROM stop st),
                    (SELECT max(l.tenant) FROM taken l HAVING count(*) >= %(batch)s), '')
                THEN true
                ELSE NOT {schema}.due_after_job(%(queue)s, t.tenant, (max(ARRAY[t.k, t.id]))[2])
                END AS emptied
    FROM taken t GROUP BY t.ctid, t.tenant
),
settled AS MATERIALIZED (
    SELECT {schema}.claim_settle(
        %(queue)s, (SELECT count(*) FROM claimed) < %(batch)s AND NOT %(wait)s,
        (SELECT r.hi FROM reach r), (SELECT st.v FROM stop st), (SELECT st.tenant FROM stop st),
        array(SELECT sv.ctid FROM served sv), array(SELECT sv.tenant FROM served sv),
        array(SELECT sv.n FROM served sv), array(SELECT sv.inc FROM served sv),
        array(SELECT sv.tenant FROM served sv WHERE sv.emptied),
        array(SELECT sl.ctid FROM sleepers sl), array(SELECT sl.tenant FROM sleepers sl)) AS n
)
SELECT c.* FROM claimed c
WHERE (SELECT st.n FROM settled st) IS NOT NULL
UNION ALL
-- Step 3's row of NULLs: nothing taken, and a lock held (a transaction id, read after
-- claim_settle: a row it retired counts too, which at worst sends one statement too many).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT %(wait)s AND NOT EXISTS (SELECT FROM claimed)
  AND pg_current_xact_id_if_assigned() IS NOT NULL;

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
      -- statement says it, so only this statement reads that index (migration 0003).
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
        locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
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
