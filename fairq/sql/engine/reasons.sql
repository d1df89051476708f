-- Why a tenant's next job has not started. {schema} is the quoted schema name.

-- The first reason that holds, in the order docs/explain.md gives: the one definition of that
-- order, for `fairq tenants explain` (fairq/sql/explain.sql) and the console's tenant list
-- (fairq/sql/web.sql), which differ only in how they decide `group_at_share`. An sql function
-- with no search path of its own (every operator named in pg_catalog), so that it is inlined.
CREATE OR REPLACE FUNCTION {schema}.wait_reason(
    queued int, running int, workers int, max_running int, dry bool, token_due timestamptz,
    next_run_at timestamptz, due int, group_at_share bool) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN queued OPERATOR(pg_catalog.=) 0 AND running OPERATOR(pg_catalog.=) 0
                    THEN 'no_jobs'
                WHEN workers OPERATOR(pg_catalog.=) 0 THEN 'no_worker'
                WHEN queued OPERATOR(pg_catalog.=) 0 THEN 'running'
                WHEN running OPERATOR(pg_catalog.>=) max_running THEN 'at_cap'
                WHEN dry AND token_due OPERATOR(pg_catalog.>) next_run_at THEN 'rate_limited'
                WHEN due OPERATOR(pg_catalog.=) 0 THEN 'no_due_jobs'
                WHEN group_at_share THEN 'group_at_share'
                ELSE 'waiting_turn' END
$$;
