-- 0002: tenant settings and schedule rows kept in step (decision 020). Safe while 0.1.0 workers
-- run: a column with a constant default (no rewrite), a trigger, new functions, and
-- enqueue_many replaced with the same arguments and result.

-- Fail rather than queue behind a long transaction (every statement touching tenants or
-- settings would wait behind this one): run `fairq migrate` again.
SET LOCAL lock_timeout = '10s';

ALTER TABLE {schema}.tenants ADD COLUMN version bigint NOT NULL DEFAULT 1;

-- 0001 wrote these patterns with a doubled % (two wildcards, the same match): one, as written.
ALTER POLICY settings_stamp_insert ON {schema}.settings WITH CHECK (key LIKE 'maintenance:%');
ALTER POLICY settings_stamp_update ON {schema}.settings
    USING (key LIKE 'maintenance:%') WITH CHECK (key LIKE 'maintenance:%');
