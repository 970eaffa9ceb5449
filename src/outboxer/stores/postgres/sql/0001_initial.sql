-- outboxer schema version 1 (PostgreSQL).
-- Placeholders in braces are validated identifiers substituted by outboxer.stores._sql.

-- The outbox: one row per message not yet acknowledged by the broker. Acknowledged rows are
-- deleted (not flagged), so the table and its indexes stay as small as the backlog.
CREATE TABLE {outbox} (
    id            text        PRIMARY KEY,
    -- Write order; per-key ordering and "oldest first" claims follow it.
    seq           bigint      GENERATED ALWAYS AS IDENTITY,
    topic         text        NOT NULL,
    key           text,
    type          text,
    payload       bytea       NOT NULL,
    content_type  text        NOT NULL DEFAULT 'application/json',
    headers       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now(),
    available_at  timestamptz NOT NULL DEFAULT now(),
    attempts      integer     NOT NULL DEFAULT 0,
    last_error    text,
    -- Lease: a relay owns the row while claim_token is set and locked_until is in the future.
    -- The token is the fencing token every settle statement matches on.
    claim_token   bigint,
    locked_by     text,
    locked_until  timestamptz
) WITH (
    -- Every row is updated once (the claim) and then deleted. No index covers a column the
    -- claim changes, so with half of each page kept free the claim is a HOT update: a new row
    -- version in the same page and no index write at all (measured 3x cheaper than a claim
    -- that updates indexes). The price is a backlog taking about twice its data size on disk.
    fillfactor = 50,
    -- A queue table churns: vacuum it after 2% dead rows instead of the default 20%.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.05
);

-- Claims walk this index in write order; leased rows (at most the relays' in-flight windows,
-- at the front) are filtered on the heap. It must not be partial on claim_token: see fillfactor.
CREATE INDEX "{t}_seq" ON {outbox} (seq);
-- Ordered claims: "is an older row of this key still here, leased or waiting?"
CREATE INDEX "{t}_key_seq" ON {outbox} (key, seq) WHERE key IS NOT NULL;

CREATE TABLE {dead_letters} (
    dl_seq            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id                text        NOT NULL UNIQUE,
    topic             text        NOT NULL,
    key               text,
    type              text,
    payload           bytea       NOT NULL,
    content_type      text        NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at        timestamptz NOT NULL,
    dead_lettered_at  timestamptz NOT NULL DEFAULT now(),
    failure_reason    text        NOT NULL,
    attempts          integer     NOT NULL,
    direction         text        NOT NULL DEFAULT 'publish'
        CHECK (direction IN ('publish', 'consume'))
);
CREATE INDEX "{t}_dead_letters_topic" ON {dead_letters} (topic, dl_seq);

CREATE TABLE {relays} (
    relay_id      text        PRIMARY KEY,
    hostname      text        NOT NULL,
    pid           integer     NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL
);

-- The doorbell: one notification per committed inserting transaction (PostgreSQL folds
-- identical notifications of a transaction into one and sends them only at commit).
CREATE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_ARGV[0], '');
    RETURN NULL;
END
$$;
CREATE TRIGGER "{t}_notify" AFTER INSERT ON {outbox}
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_fn}('{channel}');
