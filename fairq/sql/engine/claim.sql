-- The fair claim: claim_fair, which fairq/sql/claim.sql's claim_fair statement calls, and
-- what it calls. {schema} is the quoted schema name.
--
-- Policy `time` (by_time) charges each job its tenant's expected run time in seconds
-- (tenant_schedule.avg_run_s, a moving average of its measured run times kept by return_slots;
-- 1 second before its first finish), in place of drr's cost or weighted's 1; the finish
-- corrects the charge with the time the job ran (slots.sql). Each claimed job keeps its charge
-- in jobs.charged_s (NULL under the other policies), so the correction is exact.

-- A tenant's terms in a fair claim: its effective weight (eff_weight) and its room
-- (claim_room). One call, so claim_fair stays within psycopg's statement cache limit.
CREATE OR REPLACE FUNCTION {schema}.claim_terms(s {schema}.tenant_schedule, OUT weight float8, OUT room int)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    weight := {schema}.eff_weight(s);
    room := {schema}.claim_room(s);
END
$$;

-- The wait: claim_fair calls it when it took nothing and holds no row (every runnable tenant
-- with a due job was held by other claims or finishes), or as the store's second statement.
-- It picks the due jobs of the first runnable tenant with room, in (vtime, tenant) order and
-- not tried yet, up to the room this snapshot sees (the claim holding the row can only lower
-- it) and the batch, locked FOR UPDATE SKIP LOCKED in the claim's own transaction (the
-- holder's jobs are locked, so skipped); none: the next tenant. Then it waits for the tenant's
-- row, reads it as it is now, and returns as many of the picked jobs as fit, each with its
-- virtual time increment (cost and weight as the policy counts them), its charge in seconds
-- (by_time; else NULL) and `more`: the tenant
-- has a due job left (one picked and not taken, or one after the last taken). No rows: nobody
-- had a due job this claim could take.
--
-- `more` is asked after the wait, in a fresh snapshot (a VOLATILE function's statements each
-- take one), and only about the jobs after the last one taken in the queue's order: in the
-- claim's older snapshot the jobs the claim it waited for had just taken still look queued,
-- and the tenant would stay runnable and empty. A job before the last one taken that is still
-- queued is one another claim has locked and is about to take or give back; claim_settle's
-- check under the row lock, which every tenant said empty gets, keeps the tenant runnable
-- while such a claim is open, and the claim that commits last decides.
--
-- The first row the wait locks is kept, whatever it holds; the wait holds no other tenant row
-- then (claim_fair calls it only when it holds nothing), so it cannot close a lock cycle. A
-- tenant left without room after the wait (a claim it waited for took it to its cap, or it was
-- paused) is not given back: the claim holds it until it commits, a few milliseconds, and
-- serves it nothing. Giving it back would need a subtransaction, which costs every waiting
-- claim one and the tenant's row a MultiXact. The next tenants are then locked SKIP LOCKED,
-- never waited for: a claim holding a row must not wait for another (a finish or fifo claim
-- holding that one, locking rows in tenant order, may be waiting for this one). When every one
-- of them is held the wait returns no rows; the claim comes back empty and the store's second
-- statement (`wait`), holding nothing, waits again, for a tenant that has room in its newer
-- snapshot.
CREATE OR REPLACE FUNCTION {schema}.wait_and_pick(q text, lim int, by_weight bool, by_cost bool,
                                      by_time bool)
RETURNS TABLE (row_ tid, tenant text, vtime float8, inc float8, charge float8, id bigint,
               more bool)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    t text;
    ids bigint[];
    r record;
    n int;
    more bool;
    held bool := false;
    tried text[] := '{}';
BEGIN
    LOOP
        -- One row at most (the candidate's LIMIT 1 is planned first), so the sublink locks
        -- one tenant's jobs.
        SELECT c.tenant, array(SELECT j.id FROM {schema}.jobs j
                               WHERE j.queue = q AND j.tenant = c.tenant
                                 AND j.status = 'queued' AND j.run_at <= now()
                               ORDER BY j.priority DESC, j.run_at, j.id
                               LIMIT least(c.room, lim)
                               FOR UPDATE OF j SKIP LOCKED)
        INTO t, ids
        FROM (SELECT ts.tenant, {schema}.claim_room(ts) AS room
              FROM {schema}.tenant_schedule ts
              WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                AND {schema}.claim_room(ts) > 0 AND ts.tenant <> ALL (tried)
              ORDER BY ts.vtime, ts.tenant
              LIMIT 1) c;
        EXIT WHEN NOT FOUND;
        tried := tried || t;
        CONTINUE WHEN cardinality(ids) = 0;
        IF held THEN
            -- Holding a row: never wait for another.
            SELECT ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room, coalesce(ts.avg_run_s, 1.0) AS run_s
            INTO r FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts SKIP LOCKED;
        ELSE
            -- Waits for the claim or finish holding the row, then reads it as it is now.
            SELECT ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room, coalesce(ts.avg_run_s, 1.0) AS run_s
            INTO r FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
        END IF;
        CONTINUE WHEN NOT FOUND;
        held := true;
        IF r.active AND r.room > 0 THEN
            n := least(r.room, cardinality(ids));
            -- After the last job taken, ids[n], in (priority DESC, run_at, id) order: the
            -- rest of its priority, then the lower ones.
            more := n < cardinality(ids) OR EXISTS (
                SELECT FROM {schema}.jobs l, {schema}.jobs j
                WHERE l.id = ids[n] AND j.queue = q AND j.tenant = t
                  AND j.status = 'queued' AND j.run_at <= now()
                  AND j.priority = l.priority AND (j.run_at, j.id) > (l.run_at, l.id)
            ) OR EXISTS (
                SELECT FROM {schema}.jobs l, {schema}.jobs j
                WHERE l.id = ids[n] AND j.queue = q AND j.tenant = t
                  AND j.status = 'queued' AND j.run_at <= now() AND j.priority < l.priority);
            RETURN QUERY
                SELECT r.ctid, t, r.vtime,
                       CASE WHEN by_time THEN r.run_s WHEN by_cost THEN j.cost ELSE 1.0 END
                       / CASE WHEN by_weight THEN r.weight ELSE 1.0 END,
                       CASE WHEN by_time THEN r.run_s END,
                       j.id, more
                FROM {schema}.jobs j WHERE j.id = ANY (ids[1:n]);
            RETURN;
        END IF;
    END LOOP;
END
$$;

-- The fair claim (docs/algorithm.md, "The definition"): weighted fair queueing over tenants by
-- virtual time. A plpgsql function whose walk is a loop, so a claim runs only the steps it
-- needs: PostgreSQL starts every node of a statement's plan at each execution, used or not, and
-- a statement holding every step would pay for all of them at every claim. The walk is a
-- cursor read one tenant at a time (FETCH: the row it locks is the row it reads) and each
-- tenant's jobs are picked by a small statement of their own; the wait and drr's cost run
-- only in the claims that need them. The walk knows which tenants it went past, so it hands
-- them to claim_settle rather than a stop to read them back from.
--
-- Snapshots: each statement of a VOLATILE function takes a new one. What the walk and the picks
-- decide rests on the rows they lock, which a newer snapshot does not change; claim_settle runs
-- after this claim's UPDATE of its jobs.
--
-- by_time: each job counts its tenant's expected run time (avg_run_s, 1 s unknown) and the
-- window is `win` jobs of the first runnable tenant, in seconds.
CREATE OR REPLACE FUNCTION {schema}.claim_fair(q text, lim int, by_weight bool, by_cost bool, by_time bool,
                                    win float8, waiting bool, wk text)
-- It returns the claimed jobs' columns by name, not the jobs table's row type: a plpgsql
-- function caches the row type its statements were first planned with, and a later migration
-- that adds a column to jobs would then break every claim of a running worker ("structure of
-- query does not match function result type"). `use_column`: where a name is
-- both one of these columns and a table's column, the body means the table's.
RETURNS TABLE (id bigint, queue text, tenant text, task text, payload jsonb, attempts int,
               max_attempts int, lease_seconds int, priority smallint, cost float8,
               run_at timestamptz, started_at timestamptz, locked_until timestamptz)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    -- The runnable tenants up to the reach, in (vtime, tenant) order, each locked as a FETCH
    -- reaches it, SKIP LOCKED (a tenant another claim holds is being served by it). LIMIT: a
    -- bound the walk never reaches in practice, there so the planner reads the index in order.
    walk NO SCROLL CURSOR (hi_ float8) FOR
        SELECT ts.ctid, ts.tenant, ts.vtime,
               -- The effective weight (weights.sql), its group's factor read in this
               -- statement: a plpgsql call per tenant walked (eff_weight) costs more.
               CASE WHEN by_weight
                    THEN {schema}.effective_weight(ts.weight, (
                        SELECT g.factor FROM {schema}.group_schedule g
                        WHERE g.queue = ts.queue
                          AND g.tenant_group = coalesce(ts.tenant_group, 'default')))
                    ELSE 1.0 END,
               {schema}.claim_room(ts),
               CASE WHEN by_time THEN coalesce(ts.avg_run_s, 1.0) ELSE 1.0 END
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
    sl_runs float8[] := '{}';
    sl_vtimes float8[] := '{}';
    sl int := 0;
    late bool := false;
    hi float8;
    front float8;
    -- the candidate in hand
    t_row tid;
    t_tenant text;
    t_vtime float8;
    t_w float8;
    t_room int;
    t_run float8;
    c float8;
    n int;
    ids bigint[];
    units float8;
    more bool;
    all_ids bigint[] := '{}';
    all_charges float8[] := '{}';
    s_rows tid[] := '{}';
    s_tenants text[] := '{}';
    s_n int[] := '{}';
    s_inc float8[] := '{}';
    s_empty text[] := '{}';
    took int := 0;
    retired int;
    waited bool := false;
BEGIN
    IF NOT waiting THEN
        -- 0. Capped tenants that slots came back to while their rows were held (slots.sql):
        -- folded in first, so those with a free slot are in the walk.
        IF EXISTS (SELECT 1 FROM {schema}.slot_returns r WHERE r.queue = q AND r.capped) THEN
            PERFORM {schema}.fold_capped(q);
        END IF;
        -- 1. Sleepers: idle tenants whose delayed jobs fell due, locked (in wake-up order).
        -- They rejoin at V (with their debt, vtime.sql), first in the walk (those with room,
        -- in tenant order) unless they owe (their vtime is past the first runnable tenant's):
        -- those come after the walk, so that one waking after each of its jobs cannot stay
        -- ahead of a backlogged tenant at V. claim_settle wakes them all. Their rows are locked by an ARRAY subquery, and their
        -- terms read by a second statement only when there are any: most claims find none.
        sl_rows := ARRAY(SELECT s.ctid FROM {schema}.tenant_schedule s
                         WHERE s.queue = q AND NOT s.active AND s.wake_at <= now()
                         ORDER BY s.wake_at
                         FOR NO KEY UPDATE OF s SKIP LOCKED);
        IF cardinality(sl_rows) > 0 THEN
            SELECT array_agg(x.ctid ORDER BY x.tenant), array_agg(x.tenant ORDER BY x.tenant),
                   array_agg(x.weight ORDER BY x.tenant), array_agg(x.room ORDER BY x.tenant),
                   array_agg(x.run_s ORDER BY x.tenant), array_agg(x.vtime ORDER BY x.tenant)
            INTO sl_rows, sl_tenants, sl_weights, sl_rooms, sl_runs, sl_vtimes
            FROM (SELECT s.ctid, s.tenant, coalesce(s.avg_run_s, 1.0) AS run_s, s.vtime,
                         ({schema}.claim_terms(s)).*  -- weight, room
                  FROM {schema}.tenant_schedule s WHERE s.ctid = ANY (sl_rows)) x;
        END IF;
        -- 2. The walk's reach: one window of virtual time past the first runnable tenant
        -- (by_time: `win` of its expected run times).
        SELECT ts.vtime + win * CASE WHEN by_time THEN coalesce(ts.avg_run_s, 1.0) ELSE 1.0 END,
               ts.vtime
        INTO hi, front FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
        ORDER BY ts.vtime, ts.tenant LIMIT 1;
        -- 3. The candidates, the sleepers with room and then the walk, until the batch is full.
        WHILE took < lim LOOP
            IF NOT walking OR late THEN
                sl := sl + 1;
                IF sl > cardinality(sl_rows) THEN
                    EXIT WHEN hi IS NULL OR late;  -- no runnable tenant, or all walked
                    OPEN walk(hi);
                    walking := true;
                    CONTINUE;
                END IF;
                -- Before the walk those that owe nothing, after it those that owe.
                CONTINUE WHEN sl_rooms[sl] <= 0
                    OR (hi IS NOT NULL AND (sl_vtimes[sl] > front) IS DISTINCT FROM late);
                -- A sleeper starts at V (`hi` - window): a whole window, also when no tenant
                -- is runnable (no `hi`).
                t_row := sl_rows[sl];
                t_tenant := sl_tenants[sl];
                t_vtime := NULL;
                t_w := CASE WHEN by_weight THEN sl_weights[sl] ELSE 1.0 END;
                t_room := sl_rooms[sl];
                t_run := CASE WHEN by_time THEN sl_runs[sl] ELSE 1.0 END;
            ELSE
                FETCH walk INTO t_row, t_tenant, t_vtime, t_w, t_room, t_run;
                IF NOT FOUND THEN
                    -- Then the sleepers that owe, in tenant order.
                    late := true;
                    sl := 0;
                    CONTINUE;
                END IF;
            END IF;
            -- 4. Its due jobs that start within the window: each counts 1/w of virtual time
            -- (drr: its first due job's cost / w; time: its expected run time / w), at least
            -- one, up to its room; in the queue's order, locked SKIP LOCKED, no more than the
            -- batch has room for. A sleeper counts a whole window of its own jobs.
            c := t_run;
            IF by_cost THEN
                SELECT f.cost INTO c FROM {schema}.jobs f
                WHERE f.queue = q AND f.tenant = t_tenant
                  AND f.status = 'queued' AND f.run_at <= now()
                ORDER BY f.priority DESC, f.run_at, f.id LIMIT 1;
            END IF;
            n := least(t_room, greatest(1.0, coalesce(
                     floor(coalesce(hi - t_vtime, win * t_run) * t_w / c) + 1, t_room)))::int;
            -- An ARRAY subquery, cheaper at every tenant walked than aggregating the picked
            -- rows. Each job counts c (1, or time's expected run time), so the units are the
            -- count times c; drr sums its jobs' costs with one aggregate. The check below
            -- reads the last job's key by id.
            IF by_cost THEN
                SELECT coalesce(array_agg(p.id), '{}'), sum(p.cost) INTO ids, units
                FROM (SELECT pj.id, pj.cost FROM {schema}.jobs pj
                      WHERE pj.queue = q AND pj.tenant = t_tenant
                        AND pj.status = 'queued' AND pj.run_at <= now()
                      ORDER BY pj.priority DESC, pj.run_at, pj.id
                      LIMIT least(n, lim - took)
                      FOR UPDATE OF pj SKIP LOCKED) p;
            ELSE
                ids := ARRAY(SELECT pj.id FROM {schema}.jobs pj
                             WHERE pj.queue = q AND pj.tenant = t_tenant
                               AND pj.status = 'queued' AND pj.run_at <= now()
                             ORDER BY pj.priority DESC, pj.run_at, pj.id
                             LIMIT least(n, lim - took)
                             FOR UPDATE OF pj SKIP LOCKED);
                units := cardinality(ids) * c;
            END IF;
            IF cardinality(ids) = 0 THEN
                -- Walked past (nothing due, every due job held by another claim, or no room):
                -- claim_settle takes it out of the runnable set if, under its lock, it has no
                -- due job or no token. A sleeper left unserved is asked the same.
                IF walking AND NOT late THEN
                    s_empty := s_empty || t_tenant;
                END IF;
                CONTINUE;
            END IF;
            took := took + cardinality(ids);
            all_ids := all_ids || ids;
            IF by_time THEN
                all_charges := all_charges || array_fill(c, ARRAY[cardinality(ids)]);
            END IF;
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
            -- (The last job's key comes from its row, `l`, by primary key.)
            IF cardinality(ids) < n AND took < lim THEN
                more := false;
            ELSE
                more := EXISTS (SELECT FROM {schema}.jobs l, {schema}.jobs j
                                WHERE l.id = ids[cardinality(ids)]
                                  AND j.queue = q AND j.tenant = t_tenant
                                  AND j.status = 'queued' AND j.run_at <= now()
                                  AND j.priority = l.priority
                                  AND (j.run_at, j.id) > (l.run_at, l.id))
                        OR EXISTS (SELECT FROM {schema}.jobs l, {schema}.jobs j
                                   WHERE l.id = ids[cardinality(ids)]
                                     AND j.queue = q AND j.tenant = t_tenant
                                     AND j.status = 'queued' AND j.run_at <= now()
                                     AND j.priority < l.priority);
            END IF;
            IF NOT more THEN
                s_empty := s_empty || t_tenant;
            END IF;
        END LOOP;
        IF walking THEN
            CLOSE walk;
        END IF;
    END IF;

    IF took = 0 AND NOT waiting AND NOT by_cost AND NOT by_time AND wk IS NOT NULL THEN
        -- 5a. Slots counted ahead (decision 015): a claim of this worker that waited for a busy
        -- tenant's row counted slots for the worker in that row (give_ahead, below), their
        -- running count and virtual time already charged. The walk found every row it could
        -- serve held, so the worker starts jobs of such a tenant without its row: one in the
        -- walk's reach (or none runnable), active, without a rate limit and not over its cap
        -- (a lowered cap stops them at once). Nothing here waits for a tenant row.
        SELECT b.tenant, b.slots INTO t_tenant, t_room
        FROM {schema}.claim_budgets b
        WHERE b.queue = q AND b.worker = wk AND b.slots > 0
          AND (SELECT ts.active AND ts.rate IS NULL AND ts.running <= ts.max_running
                      AND (hi IS NULL OR ts.vtime <= hi)
               FROM {schema}.tenant_schedule ts
               WHERE ts.queue = q AND ts.tenant = b.tenant)
        ORDER BY b.tenant LIMIT 1;
        IF FOUND THEN
            ids := ARRAY(SELECT pj.id FROM {schema}.jobs pj
                         WHERE pj.queue = q AND pj.tenant = t_tenant
                           AND pj.status = 'queued' AND pj.run_at <= now()
                         ORDER BY pj.priority DESC, pj.run_at, pj.id
                         LIMIT least(t_room, lim)
                         FOR UPDATE OF pj SKIP LOCKED);
            IF cardinality(ids) > 0 THEN
                -- The worker's own row: it waits at most for the sweep's short hold, and takes
                -- no more than is left (the sweep may have given the slots back meanwhile).
                UPDATE {schema}.claim_budgets b
                SET slots = b.slots - cardinality(ids), at = now()
                WHERE b.queue = q AND b.worker = wk AND b.tenant = t_tenant
                  AND b.slots >= cardinality(ids);
                IF FOUND THEN
                    took := cardinality(ids);
                    all_ids := ids;
                END IF;
            END IF;
        END IF;
    END IF;

    IF took = 0 AND (waiting OR pg_current_xact_id_if_assigned() IS NULL) THEN
        -- 5. The wait: nothing was taken and this transaction holds no lock (every row the walk
        -- could have locked was held), or this is the store's second statement. wait_and_pick
        -- (above) picks the due jobs of the first runnable tenant, waits for its row and says
        -- whether a due job is left; it serves one tenant.
        SELECT array_agg(h.id), (array_agg(h.row_))[1], (array_agg(h.tenant))[1],
               count(*)::int, sum(h.inc), bool_or(h.more), array_agg(h.charge)
        INTO ids, t_row, t_tenant, n, units, more, all_charges
        FROM {schema}.wait_and_pick(q, lim, by_weight, by_cost, by_time) h;
        IF ids IS NOT NULL THEN
            waited := true;
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
            locked_until = now() + make_interval(secs => cj.lease_seconds), locked_by = wk,
            -- what the finish corrects with the time the job ran (NULL: not charged by time)
            charged_s = CASE WHEN by_time THEN all_charges[array_position(all_ids, cj.id)] END
        WHERE cj.id = ANY (all_ids)
        RETURNING cj.id, cj.queue, cj.tenant, cj.task, cj.payload, cj.attempts, cj.max_attempts,
                  cj.lease_seconds, cj.priority, cj.cost, cj.run_at, cj.started_at,
                  cj.locked_until;
    END IF;

    IF took > 0 AND cardinality(s_tenants) = 1 AND NOT by_cost AND NOT by_time
       AND wk IS NOT NULL AND s_tenants[1] <> ALL (s_empty)
       AND (waited OR EXISTS (SELECT FROM {schema}.claim_budgets b
                              WHERE b.queue = q AND b.worker = wk AND b.tenant = s_tenants[1]))
    THEN
        -- A claim that served one tenant, after waiting for its row or for a tenant this
        -- worker holds slots ahead for: slots ahead for the worker (give_ahead), counted and
        -- charged by claim_settle's one write of the row, as if this claim took them.
        SELECT g.k, g.inc INTO n, c
        FROM {schema}.give_ahead(q, wk, s_rows[1], s_tenants[1], s_n[1], lim, by_weight) g;
        s_n[1] := s_n[1] + n;
        s_inc[1] := s_inc[1] + c;
    END IF;

    -- 6 and 7. The tenants' counts and virtual times, the sleepers woken, and every tenant served
    -- or walked past that has no due job left taken out of the runnable set (claim_settle,
    -- below).
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

-- Slots counted ahead (decision 015). A claim that served one tenant, after waiting for its row
-- (wait_and_pick: another claim held it) or for a tenant its worker already holds slots ahead
-- for, gives its worker `k` slots more, which claim_fair adds to the jobs it took: claim_settle's
-- one write of the row (which the claim holds, at ctid `row_`) counts them as running, so every
-- other claim sees them as running and a cap can only be met, never passed, and charges their
-- virtual time (`inc`: 1 over the effective weight each, under weighted), so the tenant pays for
-- them before they run. The worker's next claims that find the row held start up to that many
-- jobs without it (claim_fair, step 5a). The worker is topped up to 8 batches of virtual time
-- (`8 x lim x weight` slots). Only for a tenant alone runnable in its queue (with others, the
-- walk serves them while its row is held, and virtual time charged ahead would shift shares),
-- while it keeps as much room again after them (beyond the `n` jobs just taken), has no rate
-- limit (a token is spent per job, under the row's lock) and is active; policies drr and time
-- charge each job its own cost, so they count nothing ahead. Slots left unused go back with the
-- sweep (return_budgets), their virtual time kept: paid early, never late.
CREATE OR REPLACE FUNCTION {schema}.give_ahead(q text, wk text, row_ tid, t text, n int, lim int,
                                    by_weight bool, OUT k int, OUT inc float8)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    held int;
    w float8;
    room int;
BEGIN
    k := 0;
    inc := 0.0;
    -- The row this claim holds, as it is (a Tid Scan).
    SELECT CASE WHEN by_weight THEN {schema}.eff_weight(ts) ELSE 1.0 END,
           ts.max_running - ts.running - n
    INTO w, room FROM {schema}.tenant_schedule ts
    WHERE ts.ctid = row_ AND ts.active AND ts.rate IS NULL;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- Alone: no other tenant of the queue is runnable (the first one of the runnable index
    -- that is not this one), so the virtual time charged ahead shifts nobody's share; one that
    -- comes later finds this tenant charged ahead, never behind.
    IF (SELECT o.tenant FROM {schema}.tenant_schedule o
        WHERE o.queue = q AND o.active AND o.running < o.max_running AND o.tenant <> t
        ORDER BY o.vtime, o.tenant LIMIT 1) IS NOT NULL THEN
        RETURN;
    END IF;
    -- The worker's own row, locked: only its claims write it, and the sweep, which locks it
    -- after the tenant's row (held here), so this waits for nobody.
    SELECT b.slots INTO held FROM {schema}.claim_budgets b
    WHERE b.queue = q AND b.worker = wk AND b.tenant = t
    FOR UPDATE OF b;
    k := ceil(8 * lim * w)::int - coalesce(held, 0);
    IF k <= 0 OR room < 2 * k THEN
        k := 0;
        RETURN;
    END IF;
    inc := k / w;
    INSERT INTO {schema}.claim_budgets AS b (queue, worker, tenant, slots, at)
    VALUES (q, wk, t, k, now())
    ON CONFLICT (queue, worker, tenant)
    DO UPDATE SET slots = b.slots + excluded.slots, at = now();
END
$$;
