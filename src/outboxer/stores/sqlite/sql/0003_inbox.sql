-- outboxer schema version 3 (SQLite): the inbox that makes consumers idempotent.
-- Same tables as PostgreSQL (see postgres/0003_inbox.sql for the reasoning); times are UTC
-- epoch seconds.

-- WITHOUT ROWID: the primary key is the table, one B-tree write per consumed message.
CREATE TABLE {inbox} (
    consumer    TEXT    NOT NULL,
    message_id  TEXT    NOT NULL,
    expires_at  REAL,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;
CREATE INDEX "{t}_inbox_expires" ON {inbox} (expires_at);

CREATE TABLE {inbox_failures} (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer         TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    topic            TEXT    NOT NULL,
    key              TEXT,
    type             TEXT,
    payload          BLOB    NOT NULL,
    content_type     TEXT    NOT NULL,
    headers          TEXT    NOT NULL DEFAULT '{}',
    created_at       REAL    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL    NOT NULL,
    last_error       TEXT,
    failed_at        REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    state            TEXT    NOT NULL DEFAULT 'retrying'
        CHECK (state IN ('retrying', 'dead')),
    UNIQUE (consumer, message_id)
);
CREATE INDEX "{t}_inbox_failures_due" ON {inbox_failures} (consumer, next_attempt_at)
    WHERE state = 'retrying';
CREATE INDEX "{t}_inbox_failures_key" ON {inbox_failures} (consumer, key, seq)
    WHERE key IS NOT NULL AND state = 'retrying';
CREATE INDEX "{t}_inbox_failures_dead" ON {inbox_failures} (message_id) WHERE state = 'dead';

ALTER TABLE {sweeps} ADD COLUMN consume_retried_since_sweep INTEGER NOT NULL DEFAULT 0;
