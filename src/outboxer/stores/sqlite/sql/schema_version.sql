-- The versions of this schema applied so far (one row per migration file of this folder);
-- 'outboxer db upgrade' applies the missing ones, the relay refuses to start unless the latest
-- is there. Times are Unix seconds, as in every table here.
CREATE TABLE IF NOT EXISTS {schema_version} (
    version     INTEGER PRIMARY KEY,
    applied_at  REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);
