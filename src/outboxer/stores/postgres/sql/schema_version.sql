-- The versions of this schema applied so far (one row per migration file of this folder);
-- 'outboxer db upgrade' applies the missing ones, the relay refuses to start unless the latest
-- is there.
CREATE TABLE IF NOT EXISTS {schema_version} (
    version     integer     PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);
