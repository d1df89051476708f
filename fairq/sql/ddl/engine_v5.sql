-- The fair engine's functions, version 5 (migration 0010): the wait picks its jobs after it
-- holds the tenant's row. {schema} is the quoted schema name. engine_v4.sql stays as migration
-- 0009 applied it; this file adds claim_wait. claim_head (engine_v3.sql) stays for workers of
-- the earlier release during a rolling upgrade; claim_fair no longer calls it.
-- Never edit it once released; a change is a new file and a new migration.
--
-- A claim that finds every tenant with a due job held by other claims waits for the first one
-- (docs/algorithm.md, step 5). Before, it waited in claim_head and then picked the tenant's
-- jobs in the claim statement, whose snapshot predates the wait: every job the claim it waited
-- for had just taken still looked queued to it, and each was locked, found updated and
-- rechecked (EvalPlanQual) before it was skipped, ten rechecks for a batch of ten. Each
-- statement of a VOLATILE plpgsql function runs in a snapshot of its own, so the jobs are now
-- picked here, after the lock, in a snapshot that sees that claim's work committed.

-- The first runnable tenant with a due job and room, in (vtime, tenant) order, that still has
-- one once its row is held: its row (locked FOR NO KEY UPDATE, waiting)
-- and up to least(room, lim) of its due jobs (locked FOR UPDATE SKIP LOCKED), one row per job.
-- A tenant left with nothing to give is let go (the subtransaction gives its row back) and the
-- next is waited for. No rows: nobody had a due job this claim could take.
CREATE FUNCTION {schema}.claim_wait(q text, lim int)
RETURNS TABLE (row_ tid, tenant text, vtime float8, weight float8, id bigint, cost float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    r record;
    tried text[] := '{}';
BEGIN
    LOOP
        SELECT ts.tenant INTO t FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND {schema}.claim_room(ts) > 0 AND ts.tenant <> ALL (tried)
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        tried := tried || t;
        BEGIN
            -- Locked by the key alone, then read as it is now.
            SELECT ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room
            INTO r FROM {schema}.tenant_schedule ts WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
            IF FOUND AND r.active AND r.room > 0 THEN
                RETURN QUERY
                    SELECT r.ctid, t, r.vtime, r.weight, j.id, j.cost
                    FROM {schema}.jobs j
                    WHERE j.queue = q AND j.tenant = t AND j.status = 'queued'
                      AND j.run_at <= now()
                    ORDER BY j.priority DESC, j.run_at, j.id
                    LIMIT least(r.room, lim)
                    FOR UPDATE OF j SKIP LOCKED;
                IF FOUND THEN
                    RETURN;  -- leaves the block: its row and jobs stay locked
                END IF;
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'FQ001';
        EXCEPTION WHEN SQLSTATE 'FQ001' THEN
            NULL;  -- the lock on that row is given back with the subtransaction
        END;
    END LOOP;
END
$$;
