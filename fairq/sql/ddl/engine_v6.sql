-- The fair engine's functions, version 6 (migration 0011): the wait picks its jobs before it
-- waits, and nothing it locks for good is locked in a subtransaction. {schema} is the quoted
-- schema name. This file replaces claim_wait (engine_v5.sql, same signature and result).
-- Never edit it once released; a change is a new file and a new migration.
--
-- engine_v5.sql's claim_wait locked the tenant's row and then its jobs inside a subtransaction
-- (so that a tenant left with nothing to give could be let go), and the claim statement then
-- updated those rows in the claim's own transaction. A row locked by a subtransaction and
-- updated by its parent gets a MultiXact as its xmax (both transaction ids must be kept): one
-- claim that waited created eleven of them, on the tenant's row and on each job it took. Here
-- the jobs are locked in the claim's own transaction, before the wait, and the tenant's row is
-- taken, in the subtransaction, by a no-op UPDATE rather than a lock: the claim then updates
-- the row version its own subtransaction wrote. The jobs get no MultiXact; the row still gets
-- one when the holder waited for had written it (the UPDATE follows the update chain), none
-- when the holder only held it. Picking before
-- the wait also takes the pick out of the time the tenant's row is held: with one tenant and
-- four claimers, every claim and finish queues for that row.
--
-- Holding only queued jobs' locks while it waits cannot close a lock cycle: the statements that
-- lock queued jobs skip a locked one (claims, cancel_tenant, retries), except the single-job
-- cancel, which waits but holds no tenant row this wait could need (a producer's transaction
-- holds the rows of the idle tenants it wakes, and the wait is only for runnable ones).

-- The first runnable tenant with a due job and room, in (vtime, tenant) order, that still has
-- room once its row is held: its row (held) and up to least(room, lim) of its due jobs (locked
-- FOR UPDATE SKIP LOCKED), one row per job. A tenant left without room is let go (the
-- subtransaction gives its row back; the jobs picked for it stay locked until the claim ends,
-- and are not taken) and the next is waited for. No rows: nobody had a due job this claim could
-- take.
CREATE OR REPLACE FUNCTION {schema}.claim_wait(q text, lim int)
RETURNS TABLE (row_ tid, tenant text, vtime float8, weight float8, id bigint, cost float8)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    room int;
    r record;
    ids bigint[];
    tried text[] := '{}';
BEGIN
    LOOP
        SELECT ts.tenant, {schema}.claim_room(ts) INTO t, room FROM {schema}.tenant_schedule ts
        WHERE ts.queue = q AND ts.active AND ts.running < ts.max_running
          AND {schema}.claim_room(ts) > 0 AND ts.tenant <> ALL (tried)
          AND (SELECT true FROM {schema}.jobs j
               WHERE j.queue = q AND j.tenant = ts.tenant AND j.status = 'queued'
                 AND j.run_at <= now() LIMIT 1)
        ORDER BY ts.vtime, ts.tenant
        LIMIT 1;
        EXIT WHEN NOT FOUND;
        tried := tried || t;
        -- Its room as this snapshot sees it bounds the pick: the claim holding the row can only
        -- lower it. The jobs that claim took are locked (skipped) or, committed, not queued.
        ids := array(SELECT j.id FROM {schema}.jobs j
                     WHERE j.queue = q AND j.tenant = t AND j.status = 'queued'
                       AND j.run_at <= now()
                     ORDER BY j.priority DESC, j.run_at, j.id
                     LIMIT least(room, lim)
                     FOR UPDATE OF j SKIP LOCKED);
        CONTINUE WHEN cardinality(ids) = 0;
        BEGIN
            -- Waits for the claim or finish holding the row, then reads it as it is now.
            UPDATE {schema}.tenant_schedule ts SET running = ts.running
            WHERE ts.queue = q AND ts.tenant = t
            RETURNING ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                      {schema}.claim_room(ts) AS room
            INTO r;
            IF FOUND AND r.active AND r.room > 0 THEN
                RETURN QUERY
                    SELECT r.ctid, t, r.vtime, r.weight, j.id, j.cost
                    FROM {schema}.jobs j WHERE j.id = ANY (ids[1:least(r.room, lim)]);
                RETURN;  -- leaves the block: the new row version stays
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'FQ001';
        EXCEPTION WHEN SQLSTATE 'FQ001' THEN
            NULL;  -- the row is given back with the subtransaction
        END;
    END LOOP;
END
$$;
