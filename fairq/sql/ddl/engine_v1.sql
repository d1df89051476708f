-- The fair engine's functions, created by migration 0003. {schema} is the quoted schema name.
-- This file is part of the schema's history: never edit it once released; a change is a new
-- file (engine_v2.sql) and a new migration.
--
-- Plans no statistics can change: every tenant lookup is by the full primary key, by ctid (a TID
-- scan) or an ordered range of the runnable index, and every job probe is a subquery whose index
-- condition is the tenant itself. (A join over an array of tenants was planned as a scan of the
-- whole queue when the tables had never been analyzed.)

-- The queue's virtual time V, where a tenant that becomes runnable starts (enqueue, a delayed
-- job falling due, a job handed back): the minimum vtime of the runnable tenants; if every
-- active tenant is at its cap, the maximum of theirs; if no tenant is active, 0. So an idle
-- tenant comes back with neither credit nor debt, and an idle queue starts afresh.
-- The one definition of it: every statement that activates a tenant calls this.
CREATE FUNCTION {schema}.queue_vtime(q text) RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v float8;
BEGIN
    SELECT ts.vtime INTO v FROM {schema}.tenant_schedule ts
    WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
    ORDER BY ts.vtime LIMIT 1;
    IF v IS NULL THEN
        SELECT ts.vtime INTO v FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running >= ts.max_running
        ORDER BY ts.vtime DESC LIMIT 1;
    END IF;
    RETURN coalesce(v, 0);
END
$$;

-- A fair claim's share denominator S: the weights (1 each unless by_weight) of the first
-- `batch` tenants of its walk: the woken sleepers' (`first`, in walk order), then the runnable
-- tenants up to `hi` in (vtime, tenant) order. 1 when there are none. STABLE: the claim's own
-- snapshot, read without locks.
CREATE FUNCTION {schema}.claim_share(q text, hi float8, batch int, by_weight bool, first float8[])
RETURNS float8
LANGUAGE plpgsql STABLE AS $$
DECLARE
    total float8 := 0;
    k int := 0;
    w float8;
BEGIN
    FOREACH w IN ARRAY first LOOP
        EXIT WHEN k >= batch;
        total := total + CASE WHEN by_weight THEN w ELSE 1.0 END;
        k := k + 1;
    END LOOP;
    IF k < batch AND hi IS NOT NULL THEN
        FOR w IN
            SELECT ts.weight FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running AND ts.vtime <= hi
            ORDER BY ts.vtime, ts.tenant
            LIMIT batch - k
        LOOP
            total := total + CASE WHEN by_weight THEN w ELSE 1.0 END;
        END LOOP;
    END IF;
    RETURN CASE WHEN total > 0 THEN total ELSE 1.0 END;
END
$$;

-- The tenant a claim's second statement (`wait`) serves: its first found every tenant with a
-- due job held by other claims or finishes. The first runnable tenant with a due job, in
-- (vtime, tenant) order, read with a fresh snapshot (VOLATILE: the claim's own may still show
-- tenants that others emptied since), waited for while the claim holds no row, so no lock cycle
-- is possible. If the holder emptied it meanwhile, its lock is given back (the block's
-- subtransaction is rolled back) before the next of the first `n` is waited for: even SKIP
-- LOCKED waits when it follows a row's update chain, so holding one row while locking another
-- could deadlock with a finish. Returns the locked row as it is now.
CREATE FUNCTION {schema}.claim_head(q text, n int)
RETURNS TABLE (row_ tid, tenant text, vtime float8, weight float8, room int)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    r record;
BEGIN
    FOR t IN
        SELECT ts.tenant FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT n
    LOOP
        BEGIN
            -- Locked by the key alone (a condition on active or running, even outside the
            -- locking query, was planned into it, reading the runnable index), then checked on
            -- the row the lock returns: after a wait, the row as it is now.
            SELECT ts.ctid, ts.tenant, ts.vtime, ts.weight, ts.max_running, ts.running, ts.active
            INTO r FROM {schema}.tenant_schedule ts WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
            IF FOUND AND r.active AND r.running < r.max_running THEN
                row_ := r.ctid;
                tenant := r.tenant;
                vtime := r.vtime;
                weight := r.weight;
                room := r.max_running - r.running;
                RETURN NEXT;
                RETURN;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'FQ001';
        EXCEPTION WHEN SQLSTATE 'FQ001' THEN
            NULL;  -- the lock on that row is given back with the subtransaction
        END;
    END LOOP;
END
$$;

-- The end of a fair claim (fairq/sql/claim.sql), once its jobs are marked running. Each
-- statement of a VOLATILE function gets a fresh snapshot under READ COMMITTED, which the claim's
-- own statement cannot have:
-- - The tenant rows the claim holds are written by ctid. A row it locked after another claim
--   changed it is newer than the claim's snapshot; an update in the claim's own statement
--   silently missed it (running counts went negative).
-- - Leaving the runnable set must not race an enqueue. A producer holds FOR KEY SHARE on its
--   tenants' rows until it commits (see enqueue); retiring takes FOR UPDATE, which conflicts,
--   SKIP LOCKED (a tenant whose producer has not committed stays runnable). Only once that lock
--   is held is "no due job" decided, with a snapshot taken after it: a job committed before the
--   lock is seen; a producer that locks after it waits, finds the tenant retired and wakes it.
--
-- Arguments: the served tenants (rows, names, jobs, virtual-time increments, and those that
-- looked empty in the claim's snapshot), the sleepers the claim locked (woken here at V), and
-- where its walk ended: `hi` its reach, (stop_v, stop_t) the last tenant it served when it
-- filled its batch in the runnable index, `short` when it walked every candidate.
CREATE FUNCTION {schema}.claim_settle(
    q text, short bool, hi float8, stop_v float8, stop_t text,
    s_rows tid[], s_tenants text[], s_n int[], s_inc float8[], s_empty text[],
    w_rows tid[], w_tenants text[]
) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v float8;
    suspects text[];
    locked tid[];
    retired int;
BEGIN
    IF cardinality(w_rows) > 0 THEN
        v := {schema}.queue_vtime(q);  -- before any sleeper is active
    END IF;
    -- Served tenants (a sleeper among them wakes at V here); then the sleepers not served,
    -- whose rows are unchanged. Only by ctid: a condition on `active` would let the planner
    -- read the idle tenants' index for it.
    UPDATE {schema}.tenant_schedule ts
    SET running = ts.running + x.n, claimed_total = ts.claimed_total + x.n,
        vtime = CASE WHEN x.row_ = ANY (w_rows) THEN v ELSE ts.vtime END + x.inc,
        active = ts.active OR x.row_ = ANY (w_rows),
        wake_at = CASE WHEN x.row_ = ANY (w_rows) THEN NULL ELSE ts.wake_at END,
        last_served_at = now()
    FROM unnest(s_rows, s_n, s_inc) AS x(row_, n, inc)
    WHERE ts.ctid = x.row_;
    UPDATE {schema}.tenant_schedule ts
    SET active = true, wake_at = NULL, vtime = v
    WHERE ts.ctid = ANY (array(SELECT r FROM unnest(w_rows) r WHERE r <> ALL (s_rows)));

    -- Suspects: served and looking empty, sleepers it did not serve, and the runnable tenants
    -- its walk went past (held by other claims, or with nothing due).
    suspects := s_empty || array(SELECT x FROM unnest(w_tenants) x WHERE x <> ALL (s_tenants));
    IF stop_v IS NOT NULL THEN
        suspects := suspects || array(
            SELECT ts.tenant FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
              AND ts.vtime < stop_v AND ts.tenant <> ALL (s_tenants)
            UNION ALL
            SELECT ts.tenant FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
              AND ts.vtime = stop_v AND ts.tenant < stop_t AND ts.tenant <> ALL (s_tenants));
    ELSIF short AND hi IS NOT NULL THEN
        suspects := suspects || array(
            SELECT w.tenant FROM (
                SELECT ts.tenant FROM {schema}.tenant_schedule ts
                WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
                  AND ts.vtime <= hi
                ORDER BY ts.vtime, ts.tenant LIMIT 1000) w
            WHERE w.tenant <> ALL (s_tenants));
    END IF;
    IF cardinality(suspects) = 0 THEN
        RETURN 0;
    END IF;

    SELECT array_agg(x.ctid) INTO locked
    FROM (SELECT DISTINCT u.t FROM unnest(suspects) AS u(t) ORDER BY u.t) u
    CROSS JOIN LATERAL (
        SELECT ts.ctid FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.tenant = u.t AND ts.active
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = u.t AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1) IS NULL
        FOR UPDATE OF ts SKIP LOCKED) x;
    IF locked IS NULL THEN
        RETURN 0;
    END IF;
    -- The fresh snapshot: retire those that still have no due job.
    UPDATE {schema}.tenant_schedule ts
    SET active = false,
        wake_at = (SELECT j.run_at FROM {schema}.jobs j
                   WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
                   ORDER BY j.run_at LIMIT 1)
    WHERE ts.ctid = ANY (locked)
      AND (SELECT true FROM {schema}.jobs j
           WHERE j.queue = ts.queue AND j.tenant = ts.tenant AND j.status = 'queued'
             AND j.run_at <= now() LIMIT 1) IS NULL;
    GET DIAGNOSTICS retired = ROW_COUNT;
    RETURN retired;
END
$$;
