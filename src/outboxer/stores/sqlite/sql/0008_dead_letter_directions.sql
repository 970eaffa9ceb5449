-- outboxer schema version 8 (SQLite): an id may have a publish and a consume dead letter.
-- A service that consumes what it publishes can fail on one id both ways (ids may be reused,
-- and a publish whose acknowledgement was lost did reach the broker). With one dead letter per
-- id the second was dropped or replaced the first, and a consume failure left without its dead
-- letter was forgotten by the sweep. Now each direction keeps its own. SQLite cannot drop a
-- column's UNIQUE: the table is rebuilt, keeping every dl_seq and the AUTOINCREMENT counter
-- (list cursors and "newest first" go on from where they were).
CREATE TABLE "{t}_dead_letters_v8" (
    dl_seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL,
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
        CHECK (direction IN ('publish', 'consume')),
    UNIQUE (id, direction)
);
INSERT INTO "{t}_dead_letters_v8" (dl_seq, id, topic, key, type, payload, content_type, headers,
                                   created_at, dead_lettered_at, failure_reason, attempts,
                                   direction)
SELECT dl_seq, id, topic, key, type, payload, content_type, headers, created_at,
       dead_lettered_at, failure_reason, attempts, direction
FROM {dead_letters};
UPDATE sqlite_sequence SET seq = max(seq, (SELECT o.seq FROM sqlite_sequence o
                                           WHERE o.name = '{t}_dead_letters'))
WHERE name = '{t}_dead_letters_v8';
INSERT INTO sqlite_sequence (name, seq)
SELECT '{t}_dead_letters_v8', seq FROM sqlite_sequence WHERE name = '{t}_dead_letters'
  AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = '{t}_dead_letters_v8');
DROP TABLE {dead_letters};
ALTER TABLE "{t}_dead_letters_v8" RENAME TO "{t}_dead_letters";
CREATE INDEX "{t}_dead_letters_topic" ON {dead_letters} (topic, dl_seq);
CREATE INDEX "{t}_dead_letters_at" ON {dead_letters} (dead_lettered_at);
CREATE INDEX "{t}_dead_letters_key" ON {dead_letters} (key) WHERE key IS NOT NULL;
