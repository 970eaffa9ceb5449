-- outboxer schema version 3 (MySQL/MariaDB): the inbox that makes consumers idempotent.
-- Same tables as PostgreSQL (see postgres/0003_inbox.sql for the reasoning and docs/inbox.md
-- for the life of a delivery); MySQL has no partial indexes, so the indexes carry the state.

-- One row per (consumer, message id) the consumer has seen, inserted in the transaction of the
-- handler's own writes. The primary key is the table: one B-tree write per consumed message.
CREATE TABLE IF NOT EXISTS {inbox} (
    consumer    VARBINARY(255) NOT NULL,
    message_id  VARBINARY(255) NOT NULL,
    expires_at  DATETIME(6),
    PRIMARY KEY (consumer, message_id),
    -- The sweep purges expired rows oldest first, in batches, through this index.
    KEY `{t}_inbox_expires` (expires_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {inbox_failures} (
    -- Arrival order: a key's waiting messages are re-driven in this order.
    seq              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    consumer         VARBINARY(255)  NOT NULL,
    message_id       VARBINARY(255)  NOT NULL,
    topic            VARBINARY(255)  NOT NULL,
    `key`            VARBINARY(512),
    type             VARBINARY(255),
    payload          LONGBLOB        NOT NULL,
    content_type     VARBINARY(255)  NOT NULL,
    headers          LONGTEXT        NOT NULL,
    created_at       DATETIME(6)     NOT NULL,
    attempts         INT             NOT NULL DEFAULT 0,
    next_attempt_at  DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_error       TEXT,
    failed_at        DATETIME(6)     NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    state            VARCHAR(8)      NOT NULL DEFAULT 'retrying'
        CHECK (state IN ('retrying', 'dead')),
    PRIMARY KEY (seq),
    UNIQUE KEY `{t}_inbox_failures_message` (consumer, message_id),
    -- The re-drive loop of each consumer: its due failures, soonest first.
    KEY `{t}_inbox_failures_due` (consumer, state, next_attempt_at),
    -- "Is an earlier message of this key still failing for this consumer?" (per-key order).
    KEY `{t}_inbox_failures_key` (consumer, `key`, state, seq),
    -- Replaying a consume dead letter finds the consumers that gave up on it by message id.
    KEY `{t}_inbox_failures_dead` (message_id, state)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Re-drive attempts made since the last sweep; the sweep reports them as consume_retries.
ALTER TABLE {sweeps} ADD COLUMN consume_retried_since_sweep INT NOT NULL DEFAULT 0;
