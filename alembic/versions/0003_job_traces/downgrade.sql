-- Back to 0002: the trace contexts and their function go. Stop this release's workers first
-- (their pruner's statement names job_traces); 0002's run on as before.
SET LOCAL lock_timeout = '10s';

DROP FUNCTION {schema}.trace_jobs(bigint[], text, text);
DROP TABLE {schema}.job_traces;
-- The pruner's sweep mark (jobs.sql, prune_finished).
DELETE FROM {schema}.settings WHERE key = 'maintenance:trace_sweep';
