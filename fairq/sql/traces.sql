-- The trace contexts of traced enqueues (fairq.otel, docs/tracing.md): the table job_traces and
-- the function trace_jobs are the engine's (fairq/sql/engine/tables.sql, traces.sql). {schema}
-- is the quoted schema identifier; the rest are bound parameters.

-- name: enqueue_traced
-- The enqueue statement (jobs.sql, enqueue: the same call, kept in step by
-- tests/integration/test_otel.py) with the chunk's ids given to trace_jobs in the same
-- statement: one round trip a chunk, the jobs and their contexts in one transaction.
-- MATERIALIZED: enqueue_many runs once, however often its result is named.
WITH e AS MATERIALIZED (
SELECT {schema}.enqueue_many(
    tasks => %(tasks)b::text[], tenants => %(tenants)b::text[],
    payloads => CASE WHEN %(payloads)b::text[] IS NOT NULL THEN
        ARRAY(SELECT p::jsonb FROM unnest(%(payloads)b::text[]) WITH ORDINALITY AS u(p, o)
              ORDER BY o) END,
    queues => %(queues)b::text[],
    run_ats => %(run_ats)b::timestamptz[], delays => %(delays)b::float8[],
    priorities => %(priorities)b::int[], costs => %(costs)b::float8[],
    max_attempts => %(max_attempts)b::int[], lease_seconds => %(leases)b::int[],
    keys => %(keys)b::text[]
) AS ids
)
SELECT e.ids, {schema}.trace_jobs(e.ids, %(traceparent)s::text, %(tracestate)s::text) AS traced
FROM e;

-- name: get_job_trace
-- One job's trace context (a worker's attempt reads it before the handler runs).
SELECT traceparent, tracestate FROM {schema}.job_traces WHERE job_id = %(id)s;

-- name: get_claim_traces
-- The trace contexts of the jobs one claim took, NULL for those without (fairq.otel reads them
-- at the first attempt of a claim's batch, not one round trip an attempt): they share the
-- claim's started_at and, while no heartbeat moved it, their lease's end, which finds them
-- through jobs_lease_idx. A job whose lease moved is read on its own (get_job_trace).
SELECT j.id AS job_id, t.traceparent, t.tracestate
FROM {schema}.jobs j LEFT JOIN {schema}.job_traces t ON t.job_id = j.id
WHERE j.locked_until = %(locked_until)s AND j.started_at = %(started_at)s;
