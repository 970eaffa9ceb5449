-- outboxer schema version 2 (PostgreSQL): the commit-order gate and the sweeper's state.

-- The inserting transaction's id. Ordered claims take only rows whose transaction is older than
-- every transaction still running (pg_snapshot_xmin), so a row can never be published before an
-- older-xid row of the same key that was still being written. Added without a default first
-- and the default set afterwards, so existing rows stay NULL and the table is not rewritten.
ALTER TABLE {outbox} ADD COLUMN txid xid8;
ALTER TABLE {outbox} ALTER COLUMN txid SET DEFAULT pg_current_xact_id();

-- One row per sweeper: what its last sweep did (persisted, so it survives restarts).
CREATE TABLE {sweeps} (
    name                    text        PRIMARY KEY,
    started_at              timestamptz,
    completed_at            timestamptz,
    swept_by                text,
    publish_retries         integer     NOT NULL DEFAULT 0,
    publish_failures        integer     NOT NULL DEFAULT 0,
    consume_retries         integer     NOT NULL DEFAULT 0,
    consume_failures        integer     NOT NULL DEFAULT 0,
    purged                  integer     NOT NULL DEFAULT 0,
    -- expired leases taken back since the last full sweep (reaped every half lease)
    released_since_sweep    integer     NOT NULL DEFAULT 0
);
INSERT INTO {sweeps} (name) VALUES ('default');

-- Sweeps count the dead letters since the previous sweep and purge old ones by this column.
CREATE INDEX "{t}_dead_letters_at" ON {dead_letters} (dead_lettered_at);
