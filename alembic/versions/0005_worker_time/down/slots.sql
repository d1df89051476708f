-- Slots given back: the end of every finish, failure, release and reap (fairq/sql/jobs.sql).
-- {schema} is the quoted schema name.

-- The tenants' running counts lowered by the jobs that left them, in (queue, tenant) order as
-- every statement locks tenant rows, one UPDATE per tenant. Each UPDATE is a statement of its
-- own, so its snapshot is taken when it starts and it reaches the row through its newest
-- committed version, locking it once. Locked and then updated by one statement, a row that
-- changed after that statement's snapshot is reached twice: the lock follows it to its newest
-- version, the UPDATE starts again from the older version its snapshot sees, and waits there
-- behind any claim queued on that version, which waits for this transaction: a deadlock.
--
-- Per tenant: `counts` jobs left it; `due_now`: one of them is queued again and due (a reaped
-- or released job), so the tenant is runnable again (at the queue's virtual time if it was
-- idle); `retry_ats`: the earliest retry of a failed job, which an idle tenant wakes for.
-- NULL arrays: none. Returns how many tenant rows it wrote.
CREATE FUNCTION {schema}.return_slots(queues text[], tenants text[], counts int[],
                                      due_now bool[], retry_ats timestamptz[]) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    written int := 0;
BEGIN
    FOR r IN SELECT x.queue, x.tenant, x.n, coalesce(x.requeued, false) AS requeued,
                    x.retry_at
             FROM unnest(queues, tenants, counts, due_now, retry_ats)
                 AS x(queue, tenant, n, requeued, retry_at)
             WHERE x.tenant IS NOT NULL
             ORDER BY x.queue, x.tenant
    LOOP
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running - r.n,
            active = ts.active OR r.requeued,
            vtime = CASE WHEN NOT ts.active AND r.requeued THEN {schema}.queue_vtime(ts.queue)
                         ELSE ts.vtime END,
            wake_at = CASE WHEN r.requeued THEN NULL
                           WHEN NOT ts.active AND r.retry_at IS NOT NULL
                           THEN least(ts.wake_at, r.retry_at)
                           ELSE ts.wake_at END
        WHERE ts.queue = r.queue AND ts.tenant = r.tenant;
        written := written + 1;
    END LOOP;
    RETURN written;
END
$$;
