-- outboxer schema version 2 (SQLite): the sweeper's state. SQLite needs no commit-order gate:
-- its single writer commits rows in rowid order.
CREATE TABLE {sweeps} (
    name                    TEXT    PRIMARY KEY,
    started_at              REAL,
    completed_at            REAL,
    swept_by                TEXT,
    publish_retries         INTEGER NOT NULL DEFAULT 0,
    publish_failures        INTEGER NOT NULL DEFAULT 0,
    consume_retries         INTEGER NOT NULL DEFAULT 0,
    consume_failures        INTEGER NOT NULL DEFAULT 0,
    purged                  INTEGER NOT NULL DEFAULT 0,
    released_since_sweep    INTEGER NOT NULL DEFAULT 0
);
INSERT INTO {sweeps} (name) VALUES ('default');
CREATE INDEX "{t}_dead_letters_at" ON {dead_letters} (dead_lettered_at);
