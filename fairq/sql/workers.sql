-- The worker registry (fairq/runtime/registry.py): which workers are alive and which queues they
-- serve, for `fairq tenants explain` (no_worker). {schema} is the quoted schema identifier.

-- name: register_worker
-- A worker's beat: its row written (the first beat creates it), seen_at on the database clock.
-- The rows of workers gone for a day without a clean stop (killed, crashed) go with it: a
-- reader judges liveness by seen_at, these only fill the table.
WITH gone AS (
    DELETE FROM {schema}.workers w
    WHERE w.seen_at < now() - interval '1 day' AND w.worker_id <> %(worker_id)s
)
INSERT INTO {schema}.workers AS w (worker_id, queues, policy, beat_seconds, started_at, seen_at)
VALUES (%(worker_id)s, %(queues)s::text[], %(policy)s, %(beat_seconds)s::float8, now(), now())
ON CONFLICT (worker_id) DO UPDATE
SET queues = excluded.queues, policy = excluded.policy, beat_seconds = excluded.beat_seconds,
    seen_at = now();

-- name: unregister_worker
-- A clean stop: the worker is gone at once, not after its missed beats.
DELETE FROM {schema}.workers WHERE worker_id = %(worker_id)s;
