-- What `run(until_empty=True)` asks before it ends (fairq/runtime/drain.py).

-- name: held_running
-- Jobs still running under this worker's lease: once nothing of the worker runs, any such job is
-- stranded (its claim committed, its rows never reached the worker), and the drain waits for
-- the first of their leases to expire so that the reaper hands them back. Read through the
-- running jobs' lease index.
SELECT count(*)::int AS n, extract(epoch FROM min(j.locked_until) - now())::float8 AS seconds
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.locked_until IS NOT NULL AND j.locked_by = %(worker)s;

-- name: held_jobs
-- The jobs running under this worker's lease, to resolve a claim whose commit is unknown (its
-- connection was lost before the answer came): the worker hands back those it never received
-- (fairq/runtime/read_back.py), fenced on the claim's time like every hand-back.
SELECT j.id, j.attempts, j.started_at
FROM {schema}.jobs j
WHERE j.status = 'running' AND j.locked_until IS NOT NULL AND j.locked_by = %(worker)s
ORDER BY j.id;

-- name: expired_lease_exists
-- Is a running job's lease expired (a drain not yet allowed to reap waits only then)?
SELECT EXISTS (SELECT 1 FROM {schema}.jobs j
               WHERE j.status = 'running' AND j.locked_until < now()) AS expired;
