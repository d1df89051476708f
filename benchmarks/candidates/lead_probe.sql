-- Candidate (not adopted): claim_fair as in fairq/sql/claim.sql at db72d3e, but each tenant's
-- pick reads ONE job past the last it may give (LIMIT n + 1; lead() says whether one follows),
-- so no tenant is asked again with due_after_job, and the stop is found from `served`.
-- Why not adopted: that extra job is locked (FOR UPDATE) until the claim commits, and a
-- concurrent claim's wait (wait_and_pick picks SKIP LOCKED before it waits) skips it: at the
-- end of a tenant's queue the waiting claim comes back short or empty while that job is
-- claimable a moment later (tests/integration/test_fair_engine.py::
-- test_a_waited_claim_that_takes_a_tenants_last_jobs_retires_it fails with it: 4 of 5).
-- Use: claim_pair.py --variant lead=benchmarks/candidates/lead_probe.sql
WITH
sleepers AS MATERIALIZED (
    SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
    FROM {schema}.tenant_schedule s
    WHERE s.queue = %(queue)s AND NOT s.active AND s.wake_at <= now() AND NOT %(wait)s
    ORDER BY s.wake_at
    FOR NO KEY UPDATE OF s SKIP LOCKED
),
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
           CASE WHEN %(by_cost)s THEN j.cost ELSE 1.0 END / c.w AS inc,
           j.nxt AS more, c.rn, j.k
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
        SELECT * FROM (SELECT p.id, p.cost, row_number() OVER () AS k, lead(p.id) OVER () IS NOT NULL AS nxt FROM (
            SELECT q.id, q.cost
            FROM {schema}.jobs q
            WHERE q.queue = %(queue)s AND q.tenant = c.tenant
              AND q.status = 'queued' AND q.run_at <= now()
            ORDER BY q.priority DESC, q.run_at, q.id
            LIMIT b.n + 1
            FOR UPDATE OF q SKIP LOCKED) p) w WHERE w.k <= b.n
    ) j
    LIMIT %(batch)s)
    UNION ALL
    -- Step 5, the wait (wait_and_pick: as many of its picked jobs as fit once its row is held,
    -- not bounded by the window, as the claim it waited for has just moved its vtime; `more`:
    -- it has a due job left).
    SELECT h.id, 2, h.row_, h.tenant, h.inc, h.more, NULL, NULL
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
served AS MATERIALIZED (
    SELECT t.ctid, t.tenant, count(*)::int AS n, sum(t.inc) AS inc, max(t.rn) AS rn,
           min(t.part) AS part,
           CASE WHEN max(t.part) = 2 THEN NOT bool_or(t.more)
                ELSE (max(ARRAY[t.k, (NOT t.more)::int]))[2] = 1 END AS emptied
    FROM taken t GROUP BY t.ctid, t.tenant
),
stop AS MATERIALIZED (
    SELECT CASE WHEN sv.rn > (SELECT count(*) FROM served x WHERE x.part = 1)
                THEN (SELECT o.vtime FROM {schema}.tenant_schedule o
                      WHERE o.queue = %(queue)s AND o.tenant = sv.tenant) END AS v, sv.tenant
    FROM served sv WHERE sv.part = 1 AND (SELECT sum(x.n) FROM served x) >= %(batch)s
    ORDER BY sv.rn DESC LIMIT 1
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
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT %(wait)s AND NOT EXISTS (SELECT FROM claimed)
  AND pg_current_xact_id_if_assigned() IS NOT NULL;

