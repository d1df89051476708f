-- Slots given back: the end of every finish, failure, release and reap (fairq/sql/jobs.sql),
-- and policy time's correction of its charges. {schema} is the quoted schema name.

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
-- Policy time: `corrections`, the seconds its jobs ran minus the seconds the claims charged
-- them (jobs.charged_s), added to an active tenant's virtual time over its effective weight
-- (an idle one starts again at V: no credit, no debt); `run_counts` of its jobs ran for
-- `run_means` seconds on average, which move its expected run time (avg_run_s) as an
-- exponential moving average, each job weighing 0.2 (the first one sets it). NULL arrays: none.
-- Returns how many tenant rows it wrote.
CREATE FUNCTION {schema}.return_slots(queues text[], tenants text[], counts int[],
                                      due_now bool[], retry_ats timestamptz[],
                                      corrections float8[] DEFAULT NULL,
                                      run_counts int[] DEFAULT NULL,
                                      run_means float8[] DEFAULT NULL) RETURNS int
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r record;
    written int := 0;
BEGIN
    FOR r IN SELECT x.queue, x.tenant, x.n, coalesce(x.requeued, false) AS requeued,
                    x.retry_at, coalesce(x.corr, 0.0) AS corr, coalesce(x.runs, 0) AS runs,
                    x.mean
             FROM unnest(queues, tenants, counts, due_now, retry_ats, corrections, run_counts,
                         run_means)
                 AS x(queue, tenant, n, requeued, retry_at, corr, runs, mean)
             WHERE x.tenant IS NOT NULL
             ORDER BY x.queue, x.tenant
    LOOP
        UPDATE {schema}.tenant_schedule ts
        SET running = ts.running - r.n,
            active = ts.active OR r.requeued,
            vtime = CASE WHEN NOT ts.active AND r.requeued THEN {schema}.queue_vtime(ts.queue)
                         WHEN ts.active AND r.corr <> 0.0
                         THEN ts.vtime + r.corr / {schema}.eff_weight(ts)
                         ELSE ts.vtime END,
            wake_at = CASE WHEN r.requeued THEN NULL
                           WHEN NOT ts.active AND r.retry_at IS NOT NULL
                           THEN least(ts.wake_at, r.retry_at)
                           ELSE ts.wake_at END,
            avg_run_s = CASE WHEN r.runs > 0 AND r.mean IS NOT NULL
                             THEN r.mean + (coalesce(ts.avg_run_s, r.mean) - r.mean)
                                           * power(0.8::float8, r.runs)
                             ELSE ts.avg_run_s END
        WHERE ts.queue = r.queue AND ts.tenant = r.tenant;
        written := written + 1;
    END LOOP;
    RETURN written;
END
$$;
