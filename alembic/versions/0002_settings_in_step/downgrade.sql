-- Back to 0001: the functions 0002 added go, enqueue_many is 0001's again (downgrade_enqueue.sql,
-- run after this), and the settings' version column goes.
SET LOCAL lock_timeout = '10s';

DROP TRIGGER tenants_version ON {schema}.tenants;
DROP FUNCTION {schema}.tenants_version();
DROP FUNCTION {schema}.repair_schedule(integer);
DROP FUNCTION {schema}.ensure_schedule(text[], text[], timestamptz[]);
DROP FUNCTION {schema}.lock_settings(text[], boolean);
ALTER TABLE {schema}.tenants DROP COLUMN version;
ALTER POLICY settings_stamp_insert ON {schema}.settings WITH CHECK (key LIKE 'maintenance:%%');
ALTER POLICY settings_stamp_update ON {schema}.settings
    USING (key LIKE 'maintenance:%%') WITH CHECK (key LIKE 'maintenance:%%');
