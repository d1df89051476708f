-- 0003: the trace contexts of traced enqueues (fairq.otel, docs/tracing.md). Safe while 0002's
-- workers and producers run: a new table and a new function (traces.sql, run after this), which
-- nothing of 0002 reads or writes; no lock on any existing table. The previous release's pruner
-- does not delete a pruned job's context: this release's sweeps it (jobs.sql, prune_finished).

-- Fail rather than queue behind a long transaction: run `fairq migrate` again.
SET LOCAL lock_timeout = '10s';

CREATE TABLE {schema}.job_traces (
    job_id bigint NOT NULL,
    traceparent text NOT NULL,
    tracestate text,
    CONSTRAINT job_traces_pkey PRIMARY KEY (job_id),
    -- The column lengths: 55 characters (version 00's form), and the W3C's 512 at most. Checked
    -- per row, so only the lengths: trace_jobs checks the whole form, once a call.
    CONSTRAINT job_traces_traceparent_check CHECK (length(traceparent) = 55),
    CONSTRAINT job_traces_tracestate_check CHECK (length(tracestate) BETWEEN 1 AND 512)
);
