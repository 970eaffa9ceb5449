-- outboxer schema version 2 (MySQL/MariaDB): the sweeper's state. No commit-order column: the
-- ordered claim itself cannot overtake a row still being written (docs/adr/0003).

-- One row per sweeper: what its last sweep did (persisted, so it survives restarts).
CREATE TABLE IF NOT EXISTS {sweeps} (
    name                    VARCHAR(64)  NOT NULL,
    started_at              DATETIME(6),
    completed_at            DATETIME(6),
    swept_by                VARCHAR(255),
    publish_retries         INT          NOT NULL DEFAULT 0,
    publish_failures        INT          NOT NULL DEFAULT 0,
    consume_retries         INT          NOT NULL DEFAULT 0,
    consume_failures        INT          NOT NULL DEFAULT 0,
    purged                  INT          NOT NULL DEFAULT 0,
    -- expired leases taken back since the last full sweep (reaped every half lease)
    released_since_sweep    INT          NOT NULL DEFAULT 0,
    PRIMARY KEY (name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
INSERT IGNORE INTO {sweeps} (name) VALUES ('default');

-- Sweeps count the dead letters since the previous sweep and purge old ones by this column.
ALTER TABLE {dead_letters} ADD KEY `{t}_dead_letters_at` (dead_lettered_at);
