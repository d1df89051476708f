-- The fair engine's functions, version 7 (migration 0012): the wait reads its tenant's queue
-- head once, and says, from a snapshot taken after it, whether the tenant has a due job left.
-- {schema} is the quoted schema name. This file adds wait_and_pick; claim_wait (engine_v6.sql)
-- stays for workers of the earlier release. Never edit it once released; a change is a new
-- file and a new migration.
--
-- claim_wait asked first whether a tenant had a due job, then picked its jobs: two reads of
-- the head of its queue (jobs_tenant_ready_idx), each stepping over the entries of jobs
-- claimed since the last VACUUM that some snapshot may still see. One read does both here (a
-- tenant with no due job left to pick is passed over as before). The claim statement then
-- asked whether the tenant had a due job left (if not, it leaves the runnable set), in the
-- statement's snapshot, taken before the wait: the jobs the claim it waited for had just taken
-- still looked queued there, so a claim that took a tenant's last jobs after a wait left it
-- runnable and empty (test_a_waited_claim_that_takes_a_tenants_last_jobs_retires_it). The
-- question is asked here, after the wait, in a fresh snapshot, and only about the jobs after
-- the last one taken in the queue's order: two short index scans that start there, not one
-- more walk over the head. A job before it that is still queued is one another claim has
-- locked and is about to take or give back; claim_settle's check under the row lock, which
-- every tenant said empty gets, keeps the tenant runnable while such a claim is open, and
-- the claim that commits last decides.
--
-- The tenant, in (vtime, tenant) order: the first runnable one with room not tried yet. Its
-- due jobs, up to the room this snapshot sees (the claim holding the row can only lower it)
-- and the batch, are locked FOR UPDATE SKIP LOCKED in the claim's own transaction (the
-- holder's jobs are locked, so skipped); none: the next tenant. Then its row is locked in a
-- subtransaction (it waits for the holder, then reads the row as it is now) and as many of the
-- picked jobs as fit are returned, each with its virtual time increment (cost and weight as
-- the policy counts them) and `more`: the tenant has a due job left (one picked and not
-- taken, or one after the last taken). A tenant left without room is given back (the
-- subtransaction is rolled back; the jobs picked for it stay locked until the claim ends, and
-- are not taken) and the next is tried. No rows: nobody had a due job this claim could take.
--
-- The row's lock is the subtransaction's and the claim then updates the row, so the row gets
-- a MultiXact as its xmax, one per waiting claim. engine_v6.sql took the row with a no-op
-- UPDATE to avoid it, which it did only when the claim or finish waited for had not written
-- the row (they always do), at the cost of one more row version: with one tenant and four
-- claimers, 0.88x and 0.84x fifo against 0.90x and 0.89x for the lock, in two claim_cpu.py
-- runs. The jobs are locked in the claim's own transaction, so they get none.
CREATE FUNCTION {schema}.wait_and_pick(q text, lim int, by_weight bool, by_cost bool)
RETURNS TABLE (row_ tid, tenant text, vtime float8, inc float8, id bigint, more bool)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t text;
    ids bigint[];
    r record;
    n int;
    more bool;
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
        BEGIN
            -- Waits for the claim or finish holding the row, then reads it as it is now.
            SELECT ts.ctid, ts.vtime, {schema}.eff_weight(ts) AS weight, ts.active,
                   {schema}.claim_room(ts) AS room
            INTO r FROM {schema}.tenant_schedule ts
            WHERE ts.queue = q AND ts.tenant = t
            FOR NO KEY UPDATE OF ts;
            IF FOUND AND r.active AND r.room > 0 THEN
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
                RETURN;  -- leaves the block: the lock stays
            END IF;
            RAISE EXCEPTION USING ERRCODE = 'FQ001';
        EXCEPTION WHEN SQLSTATE 'FQ001' THEN
            NULL;  -- the row is given back with the subtransaction
        END;
    END LOOP;
END
$$;
