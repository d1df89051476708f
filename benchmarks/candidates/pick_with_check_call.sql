SELECT c.id, c.queue, c.tenant, c.task, c.payload, c.attempts, c.max_attempts, c.lease_seconds,
       c.priority, c.cost, c.run_at, c.started_at, c.locked_until
FROM {schema}.candidate_pick_with_check(%(queue)s, %(batch)s::int, %(by_weight)s, %(by_cost)s, %(window)s::float8, %(wait)s, %(worker)s) c
