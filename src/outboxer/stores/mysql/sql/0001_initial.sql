-- outboxer schema version 1 (MySQL 8 / MariaDB 10.6+, InnoDB).
-- Placeholders in braces are validated identifiers substituted by outboxer.stores._sql.
--
-- Choices shared by every table here:
-- * Identifiers and names that are compared (id, topic, key, type, consumer) are VARBINARY:
--   UTF-8 bytes compared byte by byte, as PostgreSQL compares text. A VARCHAR column would
--   compare with its collation: case-insensitive by default, and with trailing spaces ignored
--   even in utf8mb4_bin (PAD SPACE), so 'a' and 'a ' would be one key, or one inbox entry.
--   The limits are checked by the write API before any SQL is sent.
-- * Times are DATETIME(6) in UTC, always written as UTC_TIMESTAMP(6): unlike TIMESTAMP they
--   do not end in 2038, and unlike NOW() they do not depend on the session's time_zone.
-- * MySQL commits DDL statement by statement, so a migration that fails half-way cannot be
--   rolled back: every migration is safe to run again instead (CREATE ... IF NOT EXISTS, and
--   at most one ALTER, as its last statement). Upgrades are serialized with GET_LOCK.

-- The outbox: one row per message not yet acknowledged by the broker. Acknowledged rows are
-- deleted, so the table and its indexes stay as small as the backlog.
CREATE TABLE IF NOT EXISTS {outbox} (
    -- Write order, and the clustered index: InnoDB stores a table in primary-key order, so
    -- inserts append at the end of the table and claims read the oldest rows at its front.
    seq           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    id            VARBINARY(255)  NOT NULL,
    topic         VARBINARY(255)  NOT NULL,
    `key`         VARBINARY(512),
    type          VARBINARY(255),
    payload       LONGBLOB        NOT NULL,
    content_type  VARBINARY(255)  NOT NULL DEFAULT 'application/json',
    headers       LONGTEXT        NOT NULL,
    created_at    DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at  DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    attempts      INT             NOT NULL DEFAULT 0,
    last_error    TEXT,
    -- Lease: a relay owns the row while claim_token is set and locked_until is in the future.
    -- The token is the fencing token every settle statement matches on. No index covers
    -- these columns, so a claim rewrites the row in its page and touches no other index.
    claim_token   BIGINT,
    locked_by     VARCHAR(255),
    locked_until  DATETIME(6),
    PRIMARY KEY (seq),
    -- Settles (ack, retry, dead letter) find claimed rows by message id.
    UNIQUE KEY `{t}_id` (id),
    -- Ordered claims: "which is the oldest row of this key?" and "how many rows of this key
    -- come before this one?" (see queries.sql, claim_ordered).
    KEY `{t}_key_seq` (`key`, seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {dead_letters} (
    dl_seq            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    id                VARBINARY(255)  NOT NULL,
    topic             VARBINARY(255)  NOT NULL,
    `key`             VARBINARY(512),
    type              VARBINARY(255),
    payload           LONGBLOB        NOT NULL,
    content_type      VARBINARY(255)  NOT NULL,
    headers           LONGTEXT        NOT NULL,
    created_at        DATETIME(6)     NOT NULL,
    dead_lettered_at  DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    failure_reason    TEXT            NOT NULL,
    attempts          INT             NOT NULL,
    direction         VARCHAR(7)      NOT NULL DEFAULT 'publish'
        CHECK (direction IN ('publish', 'consume')),
    PRIMARY KEY (dl_seq),
    UNIQUE KEY `{t}_dead_letters_id` (id),
    KEY `{t}_dead_letters_topic` (topic, dl_seq)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {relays} (
    relay_id      VARCHAR(255) NOT NULL,
    hostname      VARCHAR(255) NOT NULL,
    pid           INT          NOT NULL,
    started_at    DATETIME(6)  NOT NULL,
    heartbeat_at  DATETIME(6)  NOT NULL,
    PRIMARY KEY (relay_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
