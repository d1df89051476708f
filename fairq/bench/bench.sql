-- Statements of the benchmark suite itself (not of fairq): the article's reference schema's
-- fixtures and the side samplers. Each starts with "-- name: NAME".

-- name: rr_insert_tenants
INSERT INTO tenant_schedule (tenant_id) SELECT unnest(%(tenants)s::bigint[])
ON CONFLICT DO NOTHING;

-- name: rr_insert_jobs
INSERT INTO jobs (tenant_id, run_at)
SELECT t, now() + make_interval(secs => d)
FROM unnest(%(tenants)s::bigint[], %(delays)s::float8[]) AS u(t, d);

-- name: rr_served
SELECT tenant_id, EXTRACT(EPOCH FROM claimed_at)::float8 AS started,
       EXTRACT(EPOCH FROM claimed_at - greatest(run_at, to_timestamp(%(released)s)))::float8 AS wait
FROM jobs WHERE claimed_at IS NOT NULL;

-- name: db_epoch
SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8;

-- name: lock_sample
SELECT count(*) FILTER (WHERE a.wait_event_type = 'Lock') AS lock_waiting,
       count(*) FILTER (WHERE a.state = 'active') AS active,
       (SELECT count(*) FROM pg_locks l
        WHERE NOT l.granted AND l.database = (SELECT oid FROM pg_database
                                              WHERE datname = current_database())) AS not_granted
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.backend_type = 'client backend';
