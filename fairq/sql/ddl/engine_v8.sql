-- The fair engine's functions, version 8 (migration 0014): whether a tenant has a due job after
-- the last one a claim took, read from there. {schema} is the quoted schema name. Never edit
-- this file once released; a change is a new file and a new migration.
--
-- claim_fair asks this of the tenant the batch cut short (the stop, or the last sleeper): it
-- stays runnable if it has a due job left. It asked for a queued due job whose id is not among
-- those it took: a read from the head of the tenant's queue (jobs_tenant_ready_idx), which
-- steps over the entries of every job claimed since the last VACUUM of jobs, and over the jobs
-- it took (still queued in its snapshot). The pick had just read the same head: with one
-- busy tenant, each claim read it twice, where fifo reads its queue's head once (claim_bench at
-- one tenant: 1,909 buffers a fair claim against fifo's 1,407). Here the read starts after the
-- last job taken, in the queue's order (priority DESC, run_at, id): the rest of its priority,
-- then the lower ones, as wait_and_pick (engine_v7.sql) asks after its wait.
--
-- A queued job before the last one taken is one the pick skipped, locked by another
-- transaction: a wait_and_pick that will take it or give it back (this claim holds the
-- tenant's row, so no walk does), or a cancel. claim_settle's check under the row lock (in a
-- fresh snapshot) keeps the tenant runnable while that transaction is open. STABLE: the claim
-- statement's snapshot, as before.
CREATE FUNCTION {schema}.due_after(q text, t text, ids bigint[]) RETURNS bool
LANGUAGE plpgsql STABLE AS $$
DECLARE
    l record;
BEGIN
    SELECT j.priority, j.run_at, j.id INTO l FROM {schema}.jobs j
    WHERE j.id = ANY (ids)
    ORDER BY j.priority, j.run_at DESC, j.id DESC LIMIT 1;
    RETURN EXISTS (
        SELECT FROM {schema}.jobs j
        WHERE j.queue = q AND j.tenant = t AND j.status = 'queued' AND j.run_at <= now()
          AND j.priority = l.priority AND (j.run_at, j.id) > (l.run_at, l.id)
    ) OR EXISTS (
        SELECT FROM {schema}.jobs j
        WHERE j.queue = q AND j.tenant = t AND j.status = 'queued' AND j.run_at <= now()
          AND j.priority < l.priority);
END
$$;
