-- Named queries of the PostgreSQL store. "-- name: x" starts query x.

-- name: insert
-- The write side, in asyncpg's parameter style; outboxer.outbox re-styles the parameters for
-- psycopg and SQLAlchemy (hence CAST rather than ::, which SQLAlchemy's text() would misread).
INSERT INTO {outbox} (id, topic, key, type, payload, content_type, headers, available_at)
VALUES ($1, $2, $3, $4, $5, $6, CAST($7 AS jsonb), COALESCE(CAST($8 AS timestamptz), now()))

-- name: claim_unordered
-- One statement claims a whole batch. SKIP LOCKED lets concurrent relays claim disjoint
-- batches without waiting on each other.
-- The rows are updated by ctid: they are locked by this statement, so their ctid cannot
-- change, and a TID scan avoids the hash join over the whole table a join on id plans.
WITH candidates AS (
    SELECT ctid FROM {outbox}
    WHERE claim_token IS NULL AND available_at <= now()
    ORDER BY seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {outbox} AS o
SET claim_token = $2, locked_by = $3, locked_until = now() + make_interval(secs => $4)
WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM candidates))
RETURNING o.id, o.seq, o.topic, o.key, o.type, o.payload, o.content_type, o.headers::text,
          o.created_at, o.available_at, o.attempts

-- name: claim_ordered
-- Per-key order with any number of relays. A keyed row may be claimed only when every older
-- row of its key is either gone (published/dead-lettered) or claimed in this same statement;
-- the relay then publishes a key's run in write order (see Relay._publish_in_waves).
--  1. candidates: the oldest claimable rows whose key's head (its oldest row) is neither leased
--     nor waiting for a retry or a delayed time: one probe of the key index and one heap visit.
--     Rows behind a blocked head are skipped, so a failing message never holds back other keys.
--     (Leased and retrying rows are always a prefix of their key: runs are claimed from the head
--     and a failure releases the rest of its run.)
--  2. SKIP LOCKED leaves out rows another relay is claiming at this moment, and a delayed row
--     may sit in the middle of a key. So a candidate is kept only if the number of rows of its
--     key up to it equals its rank among our candidates of that key: no gap before it.
WITH candidates AS MATERIALIZED (
    SELECT o.ctid, o.key, o.seq FROM {outbox} o
    WHERE o.claim_token IS NULL AND o.available_at <= now()
      -- commit-order gate: no transaction older than this row's is still writing
      AND (o.txid IS NULL OR o.txid < pg_snapshot_xmin(pg_current_snapshot()))
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM (SELECT h.claim_token, h.available_at FROM {outbox} h
                           WHERE h.key = o.key ORDER BY h.seq LIMIT 1) head
            WHERE head.claim_token IS NOT NULL OR head.available_at > now()))
    ORDER BY o.seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), ranked AS (
    SELECT ctid, key, seq, row_number() OVER (PARTITION BY key ORDER BY seq) AS rank
    FROM candidates WHERE key IS NOT NULL
)
UPDATE {outbox} AS o
SET claim_token = $2, locked_by = $3, locked_until = now() + make_interval(secs => $4)
WHERE o.ctid = ANY(ARRAY(
    SELECT ctid FROM candidates WHERE key IS NULL
    UNION ALL
    SELECT r.ctid FROM ranked r
    WHERE (SELECT count(*) FROM {outbox} k WHERE k.key = r.key AND k.seq <= r.seq) = r.rank))
RETURNING o.id, o.seq, o.topic, o.key, o.type, o.payload, o.content_type, o.headers::text,
          o.created_at, o.available_at, o.attempts

-- name: ack
DELETE FROM {outbox} WHERE id = ANY($1::text[]) AND claim_token = $2

-- name: retry
UPDATE {outbox} AS o
SET attempts = o.attempts + 1, last_error = u.reason,
    available_at = now() + make_interval(secs => u.delay),
    claim_token = NULL, locked_by = NULL, locked_until = NULL
FROM unnest($1::text[], $2::float8[], $3::text[]) AS u(id, delay, reason)
WHERE o.id = u.id AND o.claim_token = $4

-- name: release
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id = ANY($1::text[]) AND claim_token = $2

-- name: dead_letter
-- Moves rows in one statement: the DELETE and the INSERT commit or fail together.
WITH failed AS (
    SELECT * FROM unnest($1::text[], $2::text[]) AS f(id, reason)
), moved AS (
    DELETE FROM {outbox} AS o USING failed f
    WHERE o.id = f.id AND o.claim_token = $3
    RETURNING o.*, f.reason
)
INSERT INTO {dead_letters} (id, topic, key, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
SELECT id, topic, key, type, payload, content_type, headers, created_at, reason, attempts + 1,
       'publish'
FROM moved

-- name: release_expired
-- No index covers claim_token (see the fillfactor note in the schema): this scans the table,
-- which is why the sweeper runs it only every half lease. The count is kept for the next sweep.
WITH released AS (
    UPDATE {outbox}
    SET claim_token = NULL, locked_by = NULL, locked_until = NULL,
        last_error = 'lease of relay ' || locked_by || ' expired'
    WHERE claim_token IS NOT NULL AND locked_until < now()
    RETURNING 1
), counted AS (
    UPDATE {sweeps} SET released_since_sweep = released_since_sweep + (SELECT count(*) FROM released)
    WHERE name = 'default' AND EXISTS (SELECT 1 FROM released)
)
SELECT count(*) AS released FROM released

-- name: sweep_lock
-- Only one sweeper at a time across all relays: a transaction-level advisory lock, released
-- at commit (or when the sweeping relay's connection dies).
SELECT pg_try_advisory_xact_lock(hashtext($1))
   AND (SELECT started_at IS NULL OR started_at <= now() - make_interval(secs => $2)
        FROM {sweeps} WHERE name = 'default')

-- name: sweep
-- One full sweep: purge dead letters past their retention (a bounded batch), record what
-- happened since the previous sweep. Runs in the transaction holding the sweep lock.
WITH purged AS (
    DELETE FROM {dead_letters} WHERE dl_seq IN (
        SELECT dl_seq FROM {dead_letters}
        WHERE $2::float8 > 0 AND dead_lettered_at < now() - make_interval(secs => $2)
        ORDER BY dead_lettered_at LIMIT $3)
    RETURNING 1
), previous AS (
    SELECT COALESCE(started_at, '-infinity'::timestamptz) AS since
    FROM {sweeps} WHERE name = 'default'
)
UPDATE {sweeps} s
SET started_at = now(), completed_at = clock_timestamp(), swept_by = $1,
    publish_retries = s.released_since_sweep, released_since_sweep = 0,
    publish_failures = (SELECT count(*) FROM {dead_letters} d, previous p
                        WHERE d.direction = 'publish' AND d.dead_lettered_at >= p.since),
    consume_retries = 0,
    consume_failures = (SELECT count(*) FROM {dead_letters} d, previous p
                        WHERE d.direction = 'consume' AND d.dead_lettered_at >= p.since),
    purged = (SELECT count(*) FROM purged)
WHERE s.name = 'default'
RETURNING s.started_at, s.completed_at, s.swept_by, s.publish_retries, s.publish_failures,
          s.consume_retries, s.consume_failures, s.purged

-- name: last_sweep
SELECT started_at, completed_at, swept_by, publish_retries, publish_failures,
       consume_retries, consume_failures, purged
FROM {sweeps} WHERE name = 'default' AND completed_at IS NOT NULL

-- name: heartbeat
INSERT INTO {relays} (relay_id, hostname, pid, started_at, heartbeat_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = now()

-- name: unregister
DELETE FROM {relays} WHERE relay_id = $1

-- name: stats
SELECT
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NULL) AS pending,
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NOT NULL) AS in_flight,
    (SELECT count(*) FROM {dead_letters}) AS dead_letters,
    (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM {outbox}) AS oldest_age,
    -- in flight for a relay with no live heartbeat: waiting for its lease to expire
    (SELECT count(*) FROM {outbox} o
     WHERE o.claim_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM {relays} r
        WHERE r.relay_id = o.locked_by
          AND r.heartbeat_at > now() - make_interval(secs => $1))) AS unowned

-- name: live_relays
-- A relay is live while its heartbeat is younger than $1 seconds; dead ones are pruned here.
SELECT r.relay_id, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       (SELECT count(*) FROM {outbox} o
        WHERE o.locked_by = r.relay_id AND o.claim_token IS NOT NULL) AS in_flight
FROM {relays} r
WHERE r.heartbeat_at > now() - make_interval(secs => $1)
ORDER BY r.started_at

-- name: list_dead_letters
SELECT dl_seq, id, topic, key, type, payload, content_type, headers::text, created_at,
       dead_lettered_at, failure_reason, attempts, direction
FROM {dead_letters}
WHERE ($1::text IS NULL OR topic = $1)
  AND ($2::text IS NULL OR type = $2)
  AND ($3::text IS NULL OR key = $3)
  AND ($4::text[] IS NULL OR id = ANY($4))
  AND ($5::bigint IS NULL OR dl_seq < $5)
ORDER BY dl_seq DESC
LIMIT $6

-- name: replay_dead_letters
-- Back to the outbox with the same id (consumers can still dedupe) and attempts reset.
WITH moved AS (
    DELETE FROM {dead_letters}
    WHERE ($1::text IS NULL OR topic = $1)
      AND ($2::text IS NULL OR type = $2)
      AND ($3::text IS NULL OR key = $3)
      AND ($4::text[] IS NULL OR id = ANY($4))
      AND direction = 'publish'
    RETURNING *
)
INSERT INTO {outbox} (id, topic, key, type, payload, content_type, headers, created_at)
SELECT id, topic, key, type, payload, content_type, headers, created_at
FROM moved ORDER BY dl_seq
RETURNING id

-- name: purge_dead_letters
DELETE FROM {dead_letters}
WHERE ($1::text IS NULL OR topic = $1)
  AND ($2::text IS NULL OR type = $2)
  AND ($3::text IS NULL OR key = $3)
  AND ($4::text[] IS NULL OR id = ANY($4))
RETURNING id
