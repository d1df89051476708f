-- Trace contexts of enqueued jobs (fairq.otel, docs/tracing.md). {schema} is the quoted schema
-- name. Python's traced enqueue calls trace_jobs in the statement that enqueues (fairq/sql/
-- traces.sql, enqueue_traced); any other producer calls it in its own transaction, after the
-- enqueue, with the traceparent (and tracestate) of the span the jobs were sent in:
--     SELECT {schema}.trace_jobs(ARRAY[{schema}.enqueue(task => 'send_report', tenant => 'acme')],
--                                '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01');
-- SECURITY DEFINER with a fixed search_path, as enqueue: the producer role gets EXECUTE on it
-- and nothing on job_traces (docs/roles.md). Bad input raises SQLSTATE FQ001 with one line,
-- before anything is written.

-- Store one trace context for the jobs `ids` (each an existing job: one just enqueued, or the
-- live job an enqueue with a key returned). A job that has a context keeps it: the first
-- enqueue's trace is the job's. Returns the rows written.
CREATE OR REPLACE FUNCTION {schema}.trace_jobs(
    ids bigint[], traceparent text, tracestate text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text;
    written int;
BEGIN
    SELECT coalesce(
        CASE WHEN trace_jobs.traceparent IS NULL THEN 'traceparent must not be null' END,
        -- The W3C's valid traceparent (job_traces checks only the lengths, row by row).
        CASE WHEN trace_jobs.traceparent !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                  OR left(trace_jobs.traceparent, 2) = 'ff'
                  OR substr(trace_jobs.traceparent, 4, 32) = '00000000000000000000000000000000'
                  OR substr(trace_jobs.traceparent, 37, 16) = '0000000000000000'
             THEN 'traceparent must be a W3C traceparent, 55 characters '
                  || '(00-<32 hex digits>-<16 hex digits>-<2 hex digits>, lowercase, ids not '
                  || 'all zero), not '
                  || quote_literal(left(regexp_replace(trace_jobs.traceparent, '[^ -~]', '?', 'g'),
                                        60))
                  || CASE WHEN length(trace_jobs.traceparent) > 60
                          THEN '... (' || length(trace_jobs.traceparent) || ' characters)'
                          ELSE '' END END,
        CASE WHEN length(trace_jobs.tracestate) > 512
             THEN 'tracestate must be at most 512 characters, not '
                  || length(trace_jobs.tracestate) END,
        CASE WHEN trace_jobs.tracestate !~ '^[ -~]*$'
             THEN 'tracestate must be printable ASCII' END,
        CASE WHEN array_ndims(ids) > 1 THEN 'ids must be a one-dimensional array' END,
        CASE WHEN array_position(ids, NULL) IS NOT NULL THEN 'ids must not contain null' END,
        -- Every id a job: counted through the primary key, and only when one is missing,
        -- looked for (an anti-join would read the whole table).
        CASE WHEN (SELECT count(*) FROM {schema}.jobs j WHERE j.id = ANY(ids))
                  < (SELECT count(DISTINCT u.i) FROM unnest(ids) AS u(i))
             THEN (SELECT 'no job ' || u.i FROM unnest(ids) AS u(i)
                   WHERE NOT EXISTS (SELECT FROM {schema}.jobs j WHERE j.id = u.i) LIMIT 1) END
    ) INTO problem;
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'FQ001', MESSAGE = 'fairq: ' || problem;
    END IF;
    INSERT INTO {schema}.job_traces AS t (job_id, traceparent, tracestate)
    SELECT DISTINCT u.i, trace_jobs.traceparent, nullif(trace_jobs.tracestate, '')
    FROM unnest(ids) AS u(i)
    ON CONFLICT (job_id) DO NOTHING;
    GET DIAGNOSTICS written = ROW_COUNT;
    RETURN written;
END
$$;

REVOKE EXECUTE ON FUNCTION {schema}.trace_jobs(bigint[], text, text) FROM PUBLIC;
