-- outboxer schema version 3 (PostgreSQL): the inbox that makes consumers idempotent.
-- See docs/inbox.md for the life of a delivery through these tables.

-- One row per (consumer, message id) the consumer has seen. It is inserted in the transaction
-- of the handler's own writes, so "the handler's effects exist" and "the message counts as
-- processed" commit together; the primary key turns a redelivery into a duplicate.
-- expires_at: when the sweep may forget the row (handled or given up + retention). NULL while
-- the message waits in {inbox_failures} for another attempt: such a row is never purged, and a
-- redelivery of the message meanwhile is still a duplicate (the failure row owns it).
-- Narrow on purpose: it is written once per consumed message.
CREATE TABLE {inbox} (
    consumer    text        NOT NULL,
    message_id  text        NOT NULL,
    expires_at  timestamptz,
    PRIMARY KEY (consumer, message_id)
) WITH (autovacuum_vacuum_scale_factor = 0.05);
-- The sweep purges expired rows oldest first, in batches, through this index.
CREATE INDEX "{t}_inbox_expires" ON {inbox} (expires_at);

-- Consumptions that failed and are retried later (state 'retrying'), messages waiting behind
-- an earlier failing message of their key (also 'retrying', attempts 0), and consumptions that
-- failed for good ('dead': kept so that replaying the dead letter re-drives the message to the
-- consumer that gave up). The whole message is kept: the broker has already been acknowledged.
CREATE TABLE {inbox_failures} (
    -- Arrival order: a key's waiting messages are re-driven in this order.
    seq              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer         text        NOT NULL,
    message_id       text        NOT NULL,
    topic            text        NOT NULL,
    key              text,
    type             text,
    payload          bytea       NOT NULL,
    content_type     text        NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at       timestamptz NOT NULL,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_error       text,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    state            text        NOT NULL DEFAULT 'retrying'
        CHECK (state IN ('retrying', 'dead')),
    UNIQUE (consumer, message_id)
);
-- The re-drive loop of each consumer: its due failures, soonest first.
CREATE INDEX "{t}_inbox_failures_due" ON {inbox_failures} (consumer, next_attempt_at)
    WHERE state = 'retrying';
-- "Is an earlier message of this key still failing for this consumer?" (per-key order).
CREATE INDEX "{t}_inbox_failures_key" ON {inbox_failures} (consumer, key, seq)
    WHERE key IS NOT NULL AND state = 'retrying';
-- Replaying a consume dead letter finds the consumers that gave up on it by message id.
CREATE INDEX "{t}_inbox_failures_dead" ON {inbox_failures} (message_id) WHERE state = 'dead';

-- Re-drive attempts made since the last sweep; the sweep reports them as consume_retries.
ALTER TABLE {sweeps} ADD COLUMN consume_retried_since_sweep integer NOT NULL DEFAULT 0;
