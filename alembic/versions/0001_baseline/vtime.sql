-- The queue's virtual time. {schema} is the quoted schema name.

-- The queue's virtual time V, where a tenant that becomes runnable starts (enqueue, a delayed
-- job falling due, a job handed back): the minimum vtime of the runnable tenants; if every
-- active tenant is at its cap, the maximum of theirs; if no tenant is active, 0. So an idle
-- tenant comes back with neither credit nor debt, and an idle queue starts afresh.
-- The one definition of it: every statement that activates a tenant calls this.
CREATE OR REPLACE FUNCTION {schema}.queue_vtime(q text) RETURNS float8
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $$
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
