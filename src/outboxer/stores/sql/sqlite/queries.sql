-- Named queries of the SQLite store. SQLite has one writer at a time, so claims need no
-- SKIP LOCKED: a claim runs in a BEGIN IMMEDIATE transaction and leased rows are excluded.
-- Lists are passed as one JSON array parameter and expanded with json_each.

-- name: insert
INSERT INTO {outbox} (id, topic, key, type, payload, content_type, headers, available_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, (julianday('now') - 2440587.5) * 86400.0))

-- name: claim_unordered
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay,
    locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE seq IN (
    SELECT seq FROM {outbox}
    WHERE claim_token IS NULL AND available_at <= (julianday('now') - 2440587.5) * 86400.0
    ORDER BY seq LIMIT :limit)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts

-- name: claim_ordered
-- See the PostgreSQL query of the same name. SQLite claims are serialized by BEGIN IMMEDIATE,
-- so no other relay can be claiming concurrently: no SKIP LOCKED gaps, only delayed rows.
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay,
    locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE seq IN (
    SELECT o.seq FROM {outbox} o
    WHERE o.claim_token IS NULL AND o.available_at <= (julianday('now') - 2440587.5) * 86400.0
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM (SELECT h.claim_token, h.available_at FROM {outbox} h
                           WHERE h.key = o.key ORDER BY h.seq LIMIT 1) head
            WHERE head.claim_token IS NOT NULL
               OR head.available_at > (julianday('now') - 2440587.5) * 86400.0))
      -- no gap (a delayed row) between the key's head and this row
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} g
            WHERE g.key = o.key AND g.seq < o.seq
              AND g.available_at > (julianday('now') - 2440587.5) * 86400.0))
    ORDER BY o.seq LIMIT :limit)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts

-- name: ack
DELETE FROM {outbox}
WHERE id IN (SELECT value FROM json_each(:ids)) AND claim_token = :token

-- name: retry
UPDATE {outbox}
SET attempts = attempts + 1,
    last_error = (SELECT json_extract(value, '$[2]') FROM json_each(:items)
                  WHERE json_extract(value, '$[0]') = {outbox}.id),
    available_at = (julianday('now') - 2440587.5) * 86400.0
        + (SELECT json_extract(value, '$[1]') FROM json_each(:items)
           WHERE json_extract(value, '$[0]') = {outbox}.id),
    claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(:items)) AND claim_token = :token

-- name: release
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND claim_token = :token

-- name: dead_letter_copy
INSERT INTO {dead_letters} (id, topic, key, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
SELECT o.id, o.topic, o.key, o.type, o.payload, o.content_type, o.headers, o.created_at,
       json_extract(f.value, '$[1]'), o.attempts + 1, 'publish'
FROM {outbox} o JOIN json_each(:items) f ON json_extract(f.value, '$[0]') = o.id
WHERE o.claim_token = :token

-- name: dead_letter_delete
DELETE FROM {outbox}
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(:items)) AND claim_token = :token

-- name: release_expired
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL,
    last_error = 'lease of relay ' || locked_by || ' expired'
WHERE claim_token IS NOT NULL AND locked_until < (julianday('now') - 2440587.5) * 86400.0

-- name: count_released
UPDATE {sweeps} SET released_since_sweep = released_since_sweep + :released
WHERE name = 'default'

-- name: sweep_due
SELECT started_at IS NULL OR started_at <= (julianday('now') - 2440587.5) * 86400.0 - :interval AS due
FROM {sweeps} WHERE name = 'default'

-- name: sweep_purge
DELETE FROM {dead_letters} WHERE dl_seq IN (
    SELECT dl_seq FROM {dead_letters}
    WHERE :retention > 0 AND dead_lettered_at < (julianday('now') - 2440587.5) * 86400.0 - :retention
    ORDER BY dead_lettered_at LIMIT :batch)

-- name: sweep
UPDATE {sweeps}
SET publish_retries = released_since_sweep, released_since_sweep = 0,
    publish_failures = (SELECT count(*) FROM {dead_letters} d
                        WHERE d.direction = 'publish'
                          AND d.dead_lettered_at >= COALESCE({sweeps}.started_at, 0)),
    consume_retries = 0,
    consume_failures = (SELECT count(*) FROM {dead_letters} d
                        WHERE d.direction = 'consume'
                          AND d.dead_lettered_at >= COALESCE({sweeps}.started_at, 0)),
    purged = :purged, swept_by = :sweeper, started_at = :started, completed_at = (julianday('now') - 2440587.5) * 86400.0
WHERE name = 'default'
RETURNING started_at, completed_at, swept_by, publish_retries, publish_failures,
          consume_retries, consume_failures, purged

-- name: last_sweep
SELECT started_at, completed_at, swept_by, publish_retries, publish_failures,
       consume_retries, consume_failures, purged
FROM {sweeps} WHERE name = 'default' AND completed_at IS NOT NULL

-- name: heartbeat
INSERT INTO {relays} (relay_id, hostname, pid, started_at, heartbeat_at)
VALUES (:relay_id, :hostname, :pid, :started_at, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (relay_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at

-- name: unregister
DELETE FROM {relays} WHERE relay_id = :relay_id

-- name: stats
SELECT
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NULL) AS pending,
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NOT NULL) AS in_flight,
    (SELECT count(*) FROM {dead_letters}) AS dead_letters,
    (SELECT (julianday('now') - 2440587.5) * 86400.0 - min(created_at) FROM {outbox}) AS oldest_age,
    (SELECT count(*) FROM {outbox} o
     WHERE o.claim_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM {relays} r
        WHERE r.relay_id = o.locked_by AND r.heartbeat_at > (julianday('now') - 2440587.5) * 86400.0 - :live)) AS unowned

-- name: live_relays
SELECT r.relay_id, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       (SELECT count(*) FROM {outbox} o
        WHERE o.locked_by = r.relay_id AND o.claim_token IS NOT NULL) AS in_flight
FROM {relays} r
WHERE r.heartbeat_at > (julianday('now') - 2440587.5) * 86400.0 - :live
ORDER BY r.started_at

-- name: dead_letter_where
(:topic IS NULL OR topic = :topic)
AND (:type IS NULL OR type = :type)
AND (:key IS NULL OR key = :key)
AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))

-- name: list_dead_letters
SELECT dl_seq, id, topic, key, type, payload, content_type, headers, created_at,
       dead_lettered_at, failure_reason, attempts, direction
FROM {dead_letters}
WHERE {where} AND (:after IS NULL OR dl_seq < :after)
ORDER BY dl_seq DESC
LIMIT :limit

-- name: replay_copy
INSERT INTO {outbox} (id, topic, key, type, payload, content_type, headers, created_at)
SELECT id, topic, key, type, payload, content_type, headers, created_at
FROM {dead_letters} WHERE {where} AND direction = 'publish'
ORDER BY dl_seq
RETURNING id

-- name: replay_delete
DELETE FROM {dead_letters} WHERE id IN (SELECT value FROM json_each(:replayed))

-- name: purge_dead_letters
DELETE FROM {dead_letters} WHERE {where}
RETURNING id
