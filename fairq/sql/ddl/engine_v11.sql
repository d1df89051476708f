-- The fair engine's functions, version 11 (migration 0018): whether a tenant has a due job after
-- a given job of its, found from that one job. {schema} is the quoted schema name. Never edit
-- this file once released; a change is a new file and a new migration.
--
-- due_after (engine_v8.sql) was given every id a claim took from the tenant and looked each one
-- up to find the last in the queue's order (priority DESC, run_at, id): ten primary-key lookups
-- for a claim of ten, about 24 buffers, to learn a key the claim's pick had just read in order.
-- claim_fair now numbers the jobs each tenant's pick gives and passes the last one it took; this
-- reads that job's key (one lookup, by the primary key) and asks, as due_after does, for a due
-- job after it: the rest of its priority, then the lower ones. due_after stays in the database
-- for workers of the earlier release. STABLE: the claim statement's snapshot, as before (see
-- engine_v8.sql for what a job skipped before the last one means).
CREATE FUNCTION {schema}.due_after_job(q text, t text, last bigint) RETURNS bool
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT FROM {schema}.jobs l, {schema}.jobs j
        WHERE l.id = last AND j.queue = q AND j.tenant = t
          AND j.status = 'queued' AND j.run_at <= now()
          AND j.priority = l.priority AND (j.run_at, j.id) > (l.run_at, l.id)
    ) OR EXISTS (
        SELECT FROM {schema}.jobs l, {schema}.jobs j
        WHERE l.id = last AND j.queue = q AND j.tenant = t
          AND j.status = 'queued' AND j.run_at <= now() AND j.priority < l.priority);
END
$$;
