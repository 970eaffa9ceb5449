-- outboxer schema version 1 (SQLite, the embedded default).
-- Times are UTC epoch seconds (REAL): (julianday('now') - 2440587.5) * 86400.0.

CREATE TABLE {outbox} (
    -- INTEGER PRIMARY KEY is the rowid: write order, always above every row still present.
    seq           INTEGER PRIMARY KEY,
    id            TEXT    NOT NULL UNIQUE,
    topic         TEXT    NOT NULL,
    key           TEXT,
    type          TEXT,
    payload       BLOB    NOT NULL,
    content_type  TEXT    NOT NULL DEFAULT 'application/json',
    headers       TEXT    NOT NULL DEFAULT '{}',
    created_at    REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    available_at  REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    attempts      INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT,
    claim_token   INTEGER,
    locked_by     TEXT,
    locked_until  REAL
);
-- seq is the rowid: claims walk the table in write order. Ordered claims probe this index.
CREATE INDEX "{t}_key_seq" ON {outbox} (key, seq) WHERE key IS NOT NULL;

CREATE TABLE {dead_letters} (
    dl_seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL UNIQUE,
    topic             TEXT    NOT NULL,
    key               TEXT,
    type              TEXT,
    payload           BLOB    NOT NULL,
    content_type      TEXT    NOT NULL,
    headers           TEXT    NOT NULL DEFAULT '{}',
    created_at        REAL    NOT NULL,
    dead_lettered_at  REAL    NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0),
    failure_reason    TEXT    NOT NULL,
    attempts          INTEGER NOT NULL,
    direction         TEXT    NOT NULL DEFAULT 'publish'
        CHECK (direction IN ('publish', 'consume'))
);
CREATE INDEX "{t}_dead_letters_topic" ON {dead_letters} (topic, dl_seq);

CREATE TABLE {relays} (
    relay_id      TEXT    PRIMARY KEY,
    hostname      TEXT    NOT NULL,
    pid           INTEGER NOT NULL,
    started_at    REAL    NOT NULL,
    heartbeat_at  REAL    NOT NULL
);
