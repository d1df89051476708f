-- Claim statements, one complete statement per policy family, chosen by name (never concatenated).
-- {schema} is replaced once at load time by the quoted schema identifier; everything else is a
-- bound parameter. Each statement claims up to %(batch)s jobs of one queue, marks them running
-- with a lease, and moves the tenants' exact running counts, all in one round trip (R5, R18).
--
-- Shared parameters: queue, batch, worker.
-- Cap enforcement: the tenants' schedule rows are locked in tenant order (no deadlocks between
-- claimers), and the grant per tenant is recomputed from the locked, current row, so
-- running <= max_running holds under any number of concurrent claimers.

-- name: claim_fair
-- Weighted fair queueing over tenants by virtual time. Parameters: by_weight, by_cost
-- (round_robin: false/false; weighted: true/false; drr: true/true), window (= batch, in
-- virtual time), tenant_scan.
-- Tenants whose schedule row another claimer holds right now are skipped (they are being
-- served), so concurrent claimers spread over tenants instead of queueing on the same rows.
-- Only tenants within one batch of virtual time of the queue's minimum (locked or not) are
-- candidates: a batch is spread over tenants by weight, but never to a tenant that is already
-- a batch ahead, and skipping a held tenant cannot let the others run away from it.
-- If this comes back short, the store runs claim_fair_wait for the rest of the batch.
WITH vmin AS (
    SELECT min(v.vtime) AS v FROM {schema}.tenant_schedule v
    WHERE v.queue = %(queue)s AND v.active AND v.running < v.max_running
),
cand AS MATERIALIZED (
    SELECT ts.tenant, ts.vtime, ts.weight, ts.max_running - ts.running AS room
    FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
      AND ts.vtime <= (SELECT vmin.v FROM vmin) + %(window)s
    ORDER BY ts.vtime, ts.tenant
    LIMIT %(batch)s
    FOR UPDATE OF ts SKIP LOCKED
),
share AS (
    SELECT sum(CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END) AS total FROM cand c
),
-- We hold these tenants' rows, so room is exact: no cap re-check is needed below.
picked AS MATERIALIZED (
    SELECT j.id, c.tenant, c.weight, j.cost, j.priority, j.run_at
    FROM cand c CROSS JOIN share s
    CROSS JOIN LATERAL (
        SELECT q.id, q.cost, q.priority, q.run_at
        FROM {schema}.jobs q
        WHERE q.queue = %(queue)s AND q.tenant = c.tenant
          AND q.status = 'queued' AND q.run_at <= now()
        ORDER BY q.priority DESC, q.run_at, q.id
        LIMIT least(c.room, %(batch)s,
                    ceil(%(batch)s * (CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END)
                         / s.total)::int)
        FOR UPDATE OF q SKIP LOCKED
    ) j
    LIMIT %(batch)s
),
per_tenant AS (
    SELECT p.tenant, count(*) AS n,
           sum((CASE WHEN %(by_cost)s THEN p.cost ELSE 1.0 END)
               / (CASE WHEN %(by_weight)s THEN p.weight ELSE 1.0 END)) AS inc
    FROM picked p GROUP BY p.tenant
),
-- Tenants that gave nothing and have no due job at all (ignoring locks) leave the runnable
-- index until an enqueue or their wake_at. (Materialized first, so the jobs index is probed
-- only for the tenants that gave nothing, not for every candidate.)
unserved AS MATERIALIZED (
    SELECT c.tenant FROM cand c
    WHERE NOT EXISTS (SELECT 1 FROM picked p WHERE p.tenant = c.tenant)
),
empties AS (
    SELECT u.tenant FROM unserved u
    WHERE NOT EXISTS (
          SELECT 1 FROM {schema}.jobs q
          WHERE q.queue = %(queue)s AND q.tenant = u.tenant
            AND q.status = 'queued' AND q.run_at <= now())
),
-- Served tenants: their slots and virtual time (rows we hold, so room was exact). The rows are
-- fetched by key = ANY (array), an index scan whatever a generic plan estimates (see claim_fifo).
upd_tenants AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + pt.n, claimed_total = ts.claimed_total + pt.n,
        vtime = ts.vtime + pt.inc, last_served_at = now()
    FROM per_tenant pt
    WHERE ts.queue = %(queue)s AND ts.tenant = pt.tenant
      AND ts.tenant = ANY ((SELECT array_agg(p2.tenant) FROM per_tenant p2)::text[])
    RETURNING ts.tenant
),
-- Empty tenants (usually none: a separate statement part, so the served tenants' update does
-- not carry their CASEs and probes) leave the runnable index until an enqueue or their wake_at.
deactivated AS (
    UPDATE {schema}.tenant_schedule ts
    SET active = false,
        wake_at = (SELECT min(q.run_at) FROM {schema}.jobs q
                   WHERE q.queue = ts.queue AND q.tenant = ts.tenant AND q.status = 'queued')
    FROM empties e
    WHERE ts.queue = %(queue)s AND ts.tenant = e.tenant
      AND ts.tenant = ANY ((SELECT array_agg(e2.tenant) FROM empties e2)::text[])
    RETURNING ts.tenant
)
UPDATE {schema}.jobs j
SET status = 'running', attempts = j.attempts + 1, started_at = now(),
    locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
FROM picked p
WHERE j.id = p.id
RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
          j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until;

-- name: claim_fair_wait
-- The fallback of claim_fair when it came back short because other claimers held the tenants'
-- rows: the same choice, but it waits for those rows instead of skipping them, so a claim
-- returns work whenever work is runnable (one busy tenant, many workers). Same parameters.
WITH vmin AS (
    SELECT min(v.vtime) AS v FROM {schema}.tenant_schedule v
    WHERE v.queue = %(queue)s AND v.active AND v.running < v.max_running
),
cand AS MATERIALIZED (
    SELECT ts.tenant, ts.vtime, ts.weight, ts.max_running - ts.running AS room,
           row_number() OVER (ORDER BY ts.vtime, ts.tenant) AS ord
    FROM {schema}.tenant_schedule ts
    WHERE ts.queue = %(queue)s AND ts.active AND ts.running < ts.max_running
      AND ts.vtime <= (SELECT vmin.v FROM vmin) + %(window)s
    ORDER BY ts.vtime, ts.tenant
    LIMIT %(tenant_scan)s
),
share AS (
    SELECT sum(CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END) AS total
    FROM cand c WHERE c.ord <= %(batch)s
),
-- Tenants in virtual-time order, each giving at most its weighted share of the batch; the
-- executor stops as soon as the batch is full, so only the rows it returns are locked.
picked AS MATERIALIZED (
    SELECT j.id, c.tenant, c.ord, c.weight, j.cost, j.priority, j.run_at
    FROM cand c CROSS JOIN share s
    CROSS JOIN LATERAL (
        SELECT q.id, q.cost, q.priority, q.run_at
        FROM {schema}.jobs q
        WHERE q.queue = %(queue)s AND q.tenant = c.tenant
          AND q.status = 'queued' AND q.run_at <= now()
        ORDER BY q.priority DESC, q.run_at, q.id
        LIMIT least(c.room, %(batch)s,
                    ceil(%(batch)s * (CASE WHEN %(by_weight)s THEN c.weight ELSE 1.0 END)
                         / s.total)::int)
        FOR UPDATE OF q SKIP LOCKED
    ) j
    LIMIT %(batch)s
),
ranked AS (
    SELECT p.id, p.tenant,
           row_number() OVER (PARTITION BY p.tenant ORDER BY p.priority DESC, p.run_at, p.id) AS rk,
           (CASE WHEN %(by_cost)s THEN p.cost ELSE 1.0 END)
             / (CASE WHEN %(by_weight)s THEN p.weight ELSE 1.0 END) AS inc
    FROM picked p
),
need AS (SELECT r.tenant, count(*) AS n FROM ranked r GROUP BY r.tenant),
-- Tenants scanned before the last one served that gave nothing and have no due job at all
-- (ignoring locks): they leave the runnable index until an enqueue or their wake_at.
empties AS (
    SELECT c.tenant FROM cand c
    WHERE c.ord < coalesce((SELECT max(p.ord) FROM picked p), %(tenant_scan)s + 1)
      AND NOT EXISTS (SELECT 1 FROM picked p WHERE p.tenant = c.tenant)
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.jobs q
          WHERE q.queue = %(queue)s AND q.tenant = c.tenant
            AND q.status = 'queued' AND q.run_at <= now())
),
-- The tenants to lock, materialized: a row lock that had to wait rechecks the locking query
-- for the new row version (EvalPlanQual), and a recheck that re-ran CTE scans over picked and
-- cand (an IN over them, or an inlined UNION ALL) dropped every waited-for tenant but the first,
-- so a claim that queued on held rows came back with one tenant's jobs instead of its batch.
-- A materialized CTE is rechecked from its saved row (like fifo's inlined need).
lockset AS MATERIALIZED (
    SELECT nd.tenant, nd.n FROM need nd
    UNION ALL SELECT e.tenant, NULL::bigint FROM empties e
),
locked AS MATERIALIZED (
    SELECT ts.tenant, w.n IS NULL AS is_empty,
           least(coalesce(w.n, 0), ts.max_running - ts.running) AS granted_n
    FROM lockset w
    JOIN {schema}.tenant_schedule ts ON ts.queue = %(queue)s AND ts.tenant = w.tenant
    ORDER BY ts.tenant
    FOR UPDATE OF ts
),
granted AS (
    SELECT r.id, r.tenant, r.inc FROM ranked r
    JOIN locked l ON l.tenant = r.tenant
    WHERE r.rk <= l.granted_n
),
per_tenant AS (
    SELECT g.tenant, count(*) AS n, sum(g.inc) AS inc FROM granted g GROUP BY g.tenant
),
upd_tenants AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + coalesce(pt.n, 0),
        claimed_total = ts.claimed_total + coalesce(pt.n, 0),
        vtime = ts.vtime + coalesce(pt.inc, 0),
        last_served_at = CASE WHEN pt.n > 0 THEN now() ELSE ts.last_served_at END,
        active = ts.active AND NOT l.is_empty,
        wake_at = CASE WHEN l.is_empty THEN (
            SELECT min(q.run_at) FROM {schema}.jobs q
            WHERE q.queue = ts.queue AND q.tenant = ts.tenant AND q.status = 'queued')
          ELSE ts.wake_at END
    FROM locked l LEFT JOIN per_tenant pt ON pt.tenant = l.tenant
    WHERE ts.queue = %(queue)s AND ts.tenant = l.tenant AND (l.is_empty OR pt.n > 0)
    RETURNING ts.tenant
)
UPDATE {schema}.jobs j
SET status = 'running', attempts = j.attempts + 1, started_at = now(),
    locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
FROM granted g
WHERE j.id = g.id
RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
          j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until;

-- name: claim_fair_greedy
-- The first statement of a fair claim under contention (Store.claim switches to it for a while
-- after claim_fair came back short while claim_fair_wait found more: other claimers hold the
-- tenants' rows). Same parameters and the same order as claim_fair, but each tenant may give
-- the rest of the batch (up to its free slots) instead of its weighted share, and tenant rows are
-- locked lazily: the executor pulls (and SKIP LOCKED-locks) the next tenant of `free` only while
-- the batch is not full, so a claim holds the rows of the tenants it serves and no others.
-- Concurrent claimers therefore spread over the tenants (each serves the lowest-vtime tenant
-- nobody holds) instead of one claim holding every tenant of a small queue and the others
-- queueing behind it. The window still applies: nobody more than a batch of virtual time
-- ahead of V is served, so vtimes stay within a window (+ one batch per claim) of each other.
-- If every runnable tenant is held, it locks (SKIP LOCKED) the jobs of the tenant at V first and
-- then waits for that tenant's row by updating it, all of those jobs or none: one busy tenant and
-- many workers then pay one statement per claim. The wait holds no tenant row, only queued jobs'
-- rows, which every claim locks SKIP LOCKED (nothing waits for them holding a tenant row).
-- Tenants found with nothing to give are left to claim_fair and claim_fair_wait to deactivate
-- (reading `free` to the end to find them would lock tenants the batch never reached).
WITH vmin AS (
    SELECT min(v.vtime) AS v FROM {schema}.tenant_schedule v
    WHERE v.queue = %(queue)s AND v.active AND v.running < v.max_running
),
-- Candidates in (vtime, tenant) order, each row locked by its key as the batch reaches it. The
-- lock is taken by key on purpose: a lock whose row no longer matches the scan's conditions
-- (its vtime moved on, it reached its cap, since our snapshot) is kept but the row would be
-- dropped silently, and `took` below would then wait while holding it (a deadlock with
-- claim_fair_wait, which locks in tenant order: seen once under benchmark load). Locked by key,
-- every row locked is returned, and the conditions are applied to the current row: room 0.
free AS MATERIALIZED (
    SELECT t.tenant, t.weight, t.room
    FROM (SELECT v.tenant, v.vtime FROM {schema}.tenant_schedule v
          WHERE v.queue = %(queue)s AND v.active AND v.running < v.max_running
            AND v.vtime <= (SELECT vmin.v FROM vmin) + %(window)s
          ORDER BY v.vtime, v.tenant) c
    CROSS JOIN LATERAL (
        SELECT ts.tenant, ts.weight,
               CASE WHEN ts.active AND ts.vtime <= (SELECT vmin.v FROM vmin) + %(window)s
                    THEN greatest(ts.max_running - ts.running, 0) ELSE 0 END AS room
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = %(queue)s AND ts.tenant = c.tenant
        FOR UPDATE OF ts SKIP LOCKED
    ) t
    -- The index scan's order: a nested loop keeps it, no Sort (which would lock every candidate).
    ORDER BY c.vtime, c.tenant
    LIMIT %(batch)s
),
-- Only when `free` locked no row at all: the tenant at V, read (not locked), and its free
-- slots as this statement's snapshot saw them.
hot AS MATERIALIZED (
    SELECT v.tenant, v.max_running - v.running AS room
    FROM {schema}.tenant_schedule v
    WHERE v.queue = %(queue)s AND v.active AND v.running < v.max_running
      AND NOT EXISTS (SELECT FROM free)
    ORDER BY v.vtime, v.tenant
    LIMIT 1
),
-- Its jobs, locked now, before waiting for its row: read with this statement's fresh snapshot
-- (after the wait the snapshot would be stale, and every job claimed meanwhile would be
-- rechecked, EvalPlanQual, while the tenant row is held), and outside the row's critical section.
prelocked AS MATERIALIZED (
    SELECT q.id, q.cost
    FROM hot h CROSS JOIN LATERAL (
        SELECT q.id, q.cost
        FROM {schema}.jobs q
        WHERE q.queue = %(queue)s AND q.tenant = h.tenant
          AND q.status = 'queued' AND q.run_at <= now()
        ORDER BY q.priority DESC, q.run_at, q.id
        LIMIT least(h.room, %(batch)s)
        FOR UPDATE OF q SKIP LOCKED
    ) q
),
-- Wait for the tenant's row by updating it: the UPDATE itself waits and then rechecks the current
-- row (one recheck where a lock then an update took two), and grants all the locked jobs or none:
-- the cap is checked on the current row, so it holds exactly. None (the tenant filled up or went
-- idle meanwhile): the claim comes back short and the store's claim_fair_wait grants what fits.
took AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + p.n, claimed_total = ts.claimed_total + p.n,
        vtime = ts.vtime + p.units / (CASE WHEN %(by_weight)s THEN ts.weight ELSE 1.0 END),
        last_served_at = now()
    FROM (SELECT count(*) AS n, sum(CASE WHEN %(by_cost)s THEN pl.cost ELSE 1.0 END) AS units
          FROM prelocked pl) p
    WHERE ts.queue = %(queue)s AND ts.tenant = (SELECT h.tenant FROM hot h)
      AND p.n > 0 AND ts.active AND ts.running + p.n <= ts.max_running
    RETURNING ts.tenant
),
picked AS MATERIALIZED (
    SELECT j.id, c.tenant, c.weight, j.cost
    FROM free c
    CROSS JOIN LATERAL (
        SELECT q.id, q.cost
        FROM {schema}.jobs q
        WHERE q.queue = %(queue)s AND q.tenant = c.tenant
          AND q.status = 'queued' AND q.run_at <= now()
        ORDER BY q.priority DESC, q.run_at, q.id
        LIMIT least(c.room, %(batch)s)
        FOR UPDATE OF q SKIP LOCKED
    ) j
    LIMIT %(batch)s
),
per_tenant AS (
    SELECT p.tenant, count(*) AS n,
           sum((CASE WHEN %(by_cost)s THEN p.cost ELSE 1.0 END)
               / (CASE WHEN %(by_weight)s THEN p.weight ELSE 1.0 END)) AS inc
    FROM picked p GROUP BY p.tenant
),
-- The tenants `free` served, whose rows we hold: room was read from the locked row, so no cap
-- re-check is needed.
upd_tenants AS (
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + pt.n, claimed_total = ts.claimed_total + pt.n,
        vtime = ts.vtime + pt.inc, last_served_at = now()
    FROM per_tenant pt
    WHERE ts.queue = %(queue)s AND ts.tenant = pt.tenant
    RETURNING ts.tenant
)
UPDATE {schema}.jobs j
SET status = 'running', attempts = j.attempts + 1, started_at = now(),
    locked_until = now() + make_interval(secs => j.lease_seconds), locked_by = %(worker)s
WHERE j.id = ANY ((SELECT array_agg(x.id) FROM (
          SELECT p.id FROM picked p
          UNION ALL SELECT pl.id FROM prelocked pl WHERE EXISTS (SELECT FROM took)) x)::bigint[])
RETURNING j.id, j.queue, j.tenant, j.task, j.payload, j.attempts, j.max_attempts,
          j.lease_seconds, j.priority, j.cost, j.run_at, j.started_at, j.locked_until;

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
    FOR UPDATE OF ts
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
