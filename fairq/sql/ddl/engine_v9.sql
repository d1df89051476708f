-- The fair engine's functions, version 9 (migration 0015): the wait locks its tenant's row in
-- the claim's own transaction, not in a subtransaction. {schema} is the quoted schema name.
-- This file replaces wait_and_pick (engine_v7.sql), same signature and result: workers of the
-- earlier release call it unchanged. Never edit it once released; a change is a new file and
-- a new migration.
--
-- engine_v7.sql locked the waited row in a subtransaction (a plpgsql block with an EXCEPTION
-- clause), so that a tenant left without room after the wait could be given back and the next
-- one waited for. That cost every waiting claim a subtransaction, and the tenant's row a
-- MultiXact as its xmax (a row locked by a subtransaction and then updated by its parent keeps
-- both ids); with one busy tenant most fair claims wait. Here there is neither. Measured
-- against engine_v7.sql in the same claim_cpu.py runs (one tenant), the throughput is the same
-- within the noise: the saving is in what is left behind, not in time.
--
-- Here the first row the wait locks is kept, whatever it holds; the wait holds no other
-- tenant row then (claim_fair calls it only when its statement holds nothing), so it cannot
-- close a lock cycle. A tenant left without room after the wait (a claim it waited for took it
-- to its cap, or it was paused) is not given back: the claim holds it until it commits, a few
-- milliseconds, and serves it nothing. The next tenants are then locked SKIP LOCKED, never
-- waited for: a claim holding a row must not wait for another (a finish or fifo claim holding
-- that one, locking rows in tenant order, may be waiting for this one). When every one of them
-- is held the wait returns no rows; the claim comes back empty and the store's second
-- statement (`wait`), holding nothing, waits again, for a tenant that has room in its newer
-- snapshot. The tenant, its jobs and `more` are found as in engine_v7.sql.
CREATE OR REPLACE FUNCTION {schema}.wait_and_pick(q text, lim int, by_weight bool, by_cost bool)
RETURNS TABLE (row_ tid, tenant text, vtime float8, inc float8, id bigint, more bool)
LANGUAGE plpgsql VOLATILE AS $$
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
                   {schema}.claim_room(ts) AS room
            INTO r FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts SKIP LOCKED;
        ELSE
            -- Waits for the claim or finish holding the row, then reads it as it is now.
            SELECT ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room
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
                       CASE WHEN by_cost THEN j.cost ELSE 1.0 END
                       / CASE WHEN by_weight THEN r.weight ELSE 1.0 END,
                       j.id, more
                FROM {schema}.jobs j WHERE j.id = ANY (ids[1:n]);
            RETURN;
        END IF;
    END LOOP;
END
$$;
