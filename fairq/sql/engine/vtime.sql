-- The queue's virtual time. {schema} is the quoted schema name.

-- The queue's virtual time V: the minimum vtime of the runnable tenants; if every active tenant
-- is at its cap, the maximum of theirs; if no tenant is active, 0. A new tenant starts at V. An
-- idle tenant that becomes runnable again (enqueue, a delayed job falling due, a retry or a job
-- handed back, ops' wake-ups) starts at greatest(V, least(vtime, V + greatest(1, 1 / weight))):
-- no credit for its idle time, and the debt of its last job kept, up to one job at its
-- weight (1 / weight), or at weight 1 when that is more (a round_robin job). At V it would tie with a backlogged tenant and win by name every time it came back
-- (docs/decisions/001). The cap keeps a debt from another busy period (V is 0 again once the
-- queue idles) to one job. The one definition of V: every statement that activates a tenant
-- calls this, and writes that expression with it.
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
