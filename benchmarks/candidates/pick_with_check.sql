-- Candidate, rejected (2026-12-04): engine_v12's claim_fair (as of 21d581a) with two statements
-- fewer for a claim that fills its batch: the sleepers and the reach read by one statement (the
-- reach a scalar subquery), and the pick of a tenant the batch may cut short (its room in the batch
-- at most its share) asking in the same statement whether a due job is left after its last (the
-- picked jobs aggregated in a subquery, the two EXISTS over its result). Not cheaper: in the same
-- claim_pair.py run as engine_v12's claim_fair, +0.090 against +0.078 ms at 1 x 8,000, and +0.309
-- against +0.173 at 8,000 x 1 (benchmarks/RESULTS.md). Run:
--   claim_pair.py --setup benchmarks/candidates/pick_with_check.sql --variant pwc=benchmarks/candidates/pick_with_check_call.sql
--
-- The fair engine's functions, version 12 (migration 0019): the fair claim is one function,
-- claim_fair, whose walk is a loop. {schema} is the quoted schema name. Never edit this file
-- once released; a change is a new file and a new migration.
--
-- Up to 0018 the fair claim was one statement (fairq/sql/claim.sql) holding every step of the
-- definition as a CTE: the sleepers, the reach, the walk and its picks, the wait, the stop, the
-- emptied check and the settle's arguments. PostgreSQL starts every node of a plan at each
-- execution, used or not, and that plan had 72 nodes against fifo's 37: perf on one-tenant
-- claims of 8 put most of the fair claim's premium over fifo (0.2-0.3 ms a claim of 8) in the
-- executor's start-up. Here the walk is a cursor read one tenant at a time (FETCH: the row it
-- locks is the row it reads, as before) and each tenant's jobs are picked by a small statement
-- of their own; the wait and drr's cost are run only by the claims that need them. The walk
-- knows which tenants it went past, so claim_settle is not asked to find them again from the
-- walk's stop (engine_v10.sql keeps that read for workers of the earlier release). The same
-- definition (docs/algorithm.md), step by step.
--
-- Snapshots: each statement of a VOLATILE function takes a new one. What the walk and the picks
-- decide rests on the rows they lock, which a newer snapshot does not change; claim_settle
-- (engine_v10.sql) runs after this claim's UPDATE, as it did inside the statement.
CREATE FUNCTION {schema}.candidate_pick_with_check(q text, lim int, by_weight bool, by_cost bool, win float8,
                                    waiting bool, wk text)
-- It returns the claimed jobs' columns by name, not the jobs table's row type: a plpgsql
-- function caches the row type its statements were first planned with, and a newer release's
-- migration that adds a column to jobs would then break every claim of a running worker
-- ("structure of query does not match function result type"). `use_column`: where a name is
-- both one of these columns and a table's column, the body means the table's.
RETURNS TABLE (id bigint, queue text, tenant text, task text, payload jsonb, attempts int,
               max_attempts int, lease_seconds int, priority smallint, cost float8,
               run_at timestamptz, started_at timestamptz, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    -- The runnable tenants up to the reach, in (vtime, tenant) order, each locked as a FETCH
    -- reaches it, SKIP LOCKED (a tenant another claim holds is being served by it). LIMIT: a
    -- bound the walk never reaches in practice, there so the planner reads the index in order.
    walk NO SCROLL CURSOR (hi_ float8) FOR
        SELECT ts.ctid, ts.tenant, ts.vtime,
               CASE WHEN by_weight
                    THEN ts.weight * coalesce((SELECT g.factor FROM {schema}.group_schedule g
                                               WHERE g.queue = ts.queue
                                                 AND g.tenant_group = coalesce(ts.tenant_group, 'default')), 1.0)
                    ELSE 1.0 END,
               {schema}.claim_room(ts)
        FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running AND ts.vtime <= hi_
        ORDER BY ts.vtime, ts.tenant
        LIMIT 1000
        FOR NO KEY UPDATE OF ts SKIP LOCKED;
    walking bool := false;
    sl_rows tid[] := '{}';
    sl_tenants text[] := '{}';
    sl_weights float8[] := '{}';
    sl_rooms int[] := '{}';
    sl int := 0;
    hi float8;
    -- the candidate in hand
    t_row tid;
    t_tenant text;
    t_vtime float8;
    t_w float8;
    t_room int;
    c float8;
    n int;
    ids bigint[];
    units float8;
    more bool;
    last_p int;
    last_r timestamptz;
    all_ids bigint[] := '{}';
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_empty text[] := '{}';
    took int := 0;
    retired int;
BEGIN
    IF NOT waiting THEN
        -- 1. Sleepers: idle tenants whose delayed jobs fell due, locked (in wake-up order).
        -- They rejoin at V, first in the walk (those with room, in tenant order), and
        -- claim_settle wakes them all.
        SELECT coalesce(array_agg(x.ctid ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.tenant ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.weight ORDER BY x.tenant), '{}'),
               coalesce(array_agg(x.room ORDER BY x.tenant), '{}'),
               -- 2. The walk's reach: one window of virtual time past the first runnable tenant.
               (SELECT ts.vtime + win FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                ORDER BY ts.vtime LIMIT 1)
        INTO sl_rows, sl_tenants, sl_weights, sl_rooms, hi
        FROM (SELECT s.ctid, s.tenant, ({schema}.claim_terms(s)).*  -- weight, room
              FROM {schema}.tenant_schedule s
              WHERE s.queue = q AND NOT s.active AND s.wake_at <= now()
              ORDER BY s.wake_at
              FOR NO KEY UPDATE OF s SKIP LOCKED) x;
        -- 3. The candidates, the sleepers with room and then the walk, until the batch is full.
        WHILE took < lim LOOP
            IF NOT walking THEN
                sl := sl + 1;
                IF sl > cardinality(sl_rows) THEN
                    EXIT WHEN hi IS NULL;  -- no runnable tenant
                    OPEN walk(hi);
                    walking := true;
                    CONTINUE;
                END IF;
                CONTINUE WHEN sl_rooms[sl] <= 0;
                -- A sleeper starts at V (`hi` - window): a whole window, also when no tenant
                -- is runnable (no `hi`).
                t_row := sl_rows[sl];
                t_tenant := sl_tenants[sl];
                t_vtime := NULL;
                t_w := CASE WHEN by_weight THEN sl_weights[sl] ELSE 1.0 END;
                t_room := sl_rooms[sl];
            ELSE
                FETCH walk INTO t_row, t_tenant, t_vtime, t_w, t_room;
                EXIT WHEN NOT FOUND;
            END IF;
            -- 4. Its due jobs that start within the window: each counts 1/w of virtual time
            -- (drr: its first due job's cost / w), at least one, up to its room; in the queue's
            -- order, locked SKIP LOCKED, no more than the batch has room for.
            c := 1.0;
            IF by_cost THEN
                SELECT f.cost INTO c FROM {schema}.jobs f
                WHERE f.queue = q AND f.tenant = t_tenant
                  AND f.status = 'queued' AND f.run_at <= now()
                ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1;
            END IF;
            n := least(t_room, greatest(1.0, coalesce(
                     floor(coalesce(hi - t_vtime, win) * t_w / c) + 1, t_room)))::int;
            more := NULL;
            IF lim - took > n THEN
            SELECT array_agg(p.id), sum(CASE WHEN by_cost THEN p.cost ELSE 1.0 END),
                   (array_agg(p.priority))[count(*)], (array_agg(p.run_at))[count(*)]
            INTO ids, units, last_p, last_r
            FROM (SELECT pj.id, pj.cost, pj.priority, pj.run_at FROM {schema}.jobs pj
                  WHERE pj.queue = q AND pj.tenant = t_tenant
                    AND pj.status = 'queued' AND pj.run_at <= now()
                  ORDER BY pj.priority DESC, pj.run_at, pj.id
                  LIMIT n
                  FOR UPDATE OF pj SKIP LOCKED) p;
            ELSE
            SELECT a.ids, a.units, a.p, a.r,
                   EXISTS (SELECT FROM {schema}.jobs j
                           WHERE j.queue = q AND j.tenant = t_tenant
                             AND j.status = 'queued' AND j.run_at <= now()
                             AND j.priority = a.p AND (j.run_at, j.id) > (a.r, a.last_id))
                   OR EXISTS (SELECT FROM {schema}.jobs j
                              WHERE j.queue = q AND j.tenant = t_tenant
                                AND j.status = 'queued' AND j.run_at <= now()
                                AND j.priority < a.p)
            INTO ids, units, last_p, last_r, more
            FROM (SELECT array_agg(p.id) AS ids, sum(CASE WHEN by_cost THEN p.cost ELSE 1.0 END) AS units,
                         (array_agg(p.priority))[count(*)] AS p, (array_agg(p.run_at))[count(*)] AS r,
                         (array_agg(p.id))[count(*)] AS last_id
                  FROM (SELECT pj.id, pj.cost, pj.priority, pj.run_at FROM {schema}.jobs pj
                        WHERE pj.queue = q AND pj.tenant = t_tenant
                          AND pj.status = 'queued' AND pj.run_at <= now()
                        ORDER BY pj.priority DESC, pj.run_at, pj.id
                        LIMIT lim - took
                        FOR UPDATE OF pj SKIP LOCKED) p) a;
            END IF;
            IF ids IS NULL THEN
                -- Walked past (nothing due, every due job held by another claim, or no room):
                -- claim_settle takes it out of the runnable set if, under its lock, it has no
                -- due job or no token. A sleeper left unserved is asked the same.
                IF walking THEN
                    s_empty := s_empty || t_tenant;
                END IF;
                CONTINUE;
            END IF;
            took := took + cardinality(ids);
            all_ids := all_ids || ids;
            s_rows := s_rows || t_row;
            s_tenants := s_tenants || t_tenant;
            s_n := s_n || cardinality(ids);
            s_inc := s_inc || (units / t_w);
            -- Whether it looks empty now (step 7; claim_settle decides it again under a lock):
            -- one that gave fewer jobs than its pick allowed, and was not cut short by the
            -- batch, had no more. Else it is asked for a due job after the last one it gave, in
            -- the queue's order: two index reads that start there (the rest of its priority,
            -- then the lower ones), not one from the head of its queue, which the pick has just
            -- read past and where the entries of every job claimed since the last VACUUM lie.
            IF cardinality(ids) < n AND took < lim THEN
                more := false;
            ELSIF more IS NULL THEN
                more := EXISTS (SELECT FROM {schema}.jobs j
                                WHERE j.queue = q AND j.tenant = t_tenant
                                  AND j.status = 'queued' AND j.run_at <= now()
                                  AND j.priority = last_p
                                  AND (j.run_at, j.id) > (last_r, ids[cardinality(ids)]))
                        OR EXISTS (SELECT FROM {schema}.jobs j
                                   WHERE j.queue = q AND j.tenant = t_tenant
                                     AND j.status = 'queued' AND j.run_at <= now()
                                     AND j.priority < last_p);
            END IF;
            IF NOT more THEN
                s_empty := s_empty || t_tenant;
            END IF;
        END LOOP;
        IF walking THEN
            CLOSE walk;
        END IF;
    END IF;

    IF took = 0 AND (waiting OR pg_current_xact_id_if_assigned() IS NULL) THEN
        -- 5. The wait: nothing was taken and this transaction holds no lock (every row the walk
        -- could have locked was held), or this is the store's second statement. wait_and_pick
        -- (engine_v9.sql) picks the due jobs of the first runnable tenant, waits for its row and
        -- says whether a due job is left; it serves one tenant.
        SELECT array_agg(h.id), (array_agg(h.row_))[1], (array_agg(h.tenant))[1],
               count(*)::int, sum(h.inc), bool_or(h.more)
        INTO ids, t_row, t_tenant, n, units, more
        FROM {schema}.wait_and_pick(q, lim, by_weight, by_cost) h;
        IF ids IS NOT NULL THEN
            took := cardinality(ids);
            all_ids := ids;
            s_rows := ARRAY[t_row];
            s_tenants := ARRAY[t_tenant];
            s_n := ARRAY[n];
            s_inc := ARRAY[units];
            IF NOT more THEN
                s_empty := ARRAY[t_tenant];
            END IF;
        END IF;
    END IF;

    IF took > 0 THEN
        -- The jobs go to the result now; the function goes on to settle.
        RETURN QUERY
        UPDATE {schema}.jobs cj
        SET status = 'running', attempts = cj.attempts + 1, started_at = now(),
            locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk
        WHERE cj.id = ANY (all_ids)
        RETURNING cj.id, cj.queue, cj.tenant, cj.task, cj.payload, cj.attempts, cj.max_attempts,
                  cj.lease_seconds, cj.priority, cj.cost, cj.run_at, cj.started_at,
                  cj.locked_until;
    END IF;

    -- 6 and 7. The tenants' counts and virtual times, the sleepers woken, and every tenant served
    -- or walked past that has no due job left taken out of the runnable set (engine_v10.sql).
    -- The walk knows every tenant it went past (they are in s_empty), so claim_settle is given
    -- neither a stop nor a short claim's reach to read them back from the runnable index.
    SELECT {schema}.claim_settle(q, false, NULL, NULL, NULL,
                                 s_rows, s_tenants, s_n, s_inc, s_empty, sl_rows, sl_tenants)
    INTO retired;
    IF took = 0 AND NOT waiting AND pg_current_xact_id_if_assigned() IS NOT NULL THEN
        -- Took nothing while holding a lock (a sleeper, a walked tenant with nothing due, or a
        -- row claim_settle retired): it could not wait. One row of NULLs tells the store to run
        -- it again with `waiting`, holding nothing.
        RETURN NEXT;  -- every column NULL
    END IF;
END
$$;
