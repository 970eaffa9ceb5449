-- Named queries of the SQLite store. SQLite has one writer at a time, so claims need no
-- SKIP LOCKED: a claim runs in a BEGIN IMMEDIATE transaction and leased rows are excluded.
-- Lists are passed as one JSON array parameter and expanded with json_each.

-- The write side's INSERT belongs to its writers (outboxer/writers/sqlite3.py).

-- name: claim_unordered
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay,
    locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE seq IN (
    SELECT seq FROM {outbox}
    WHERE claim_token IS NULL AND available_at <= (julianday('now') - 2440587.5) * 86400.0
      AND lease_expiries = 0
    ORDER BY seq LIMIT :limit)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts, lease_expiries, solo_deaths

-- name: claim_ordered
-- See the PostgreSQL query of the same name. SQLite claims are serialized by BEGIN IMMEDIATE,
-- so no other relay can be claiming concurrently: no SKIP LOCKED gaps, only delayed rows.
-- Rows leased under a token of :behind (this relay's batches in flight, a JSON list) neither
-- block their key nor count as a gap (ADR 0008); a row leased under any other token does.
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay,
    locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE seq IN (
    SELECT o.seq FROM {outbox} o
    WHERE o.claim_token IS NULL AND o.available_at <= (julianday('now') - 2440587.5) * 86400.0
      AND o.lease_expiries = 0
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM (SELECT h.claim_token, h.available_at FROM {outbox} h
                           WHERE h.key = o.key ORDER BY h.seq LIMIT 1) head
            WHERE (head.claim_token IS NOT NULL
                   AND head.claim_token NOT IN (SELECT value FROM json_each(:behind)))
               OR head.available_at > (julianday('now') - 2440587.5) * 86400.0))
      -- a key whose earlier message is a dead letter stays on hold, if the relay asks so
      AND (NOT :hold OR o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {dead_letters} d WHERE d.key = o.key AND d.direction = 'publish'))
      -- no gap (a delayed row, a suspect: it goes alone, or a row another relay holds) between
      -- the key's head and this row
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} g
            WHERE g.key = o.key AND g.seq < o.seq
              AND (g.available_at > (julianday('now') - 2440587.5) * 86400.0 OR g.lease_expiries > 0
                   OR (g.claim_token IS NOT NULL
                       AND g.claim_token NOT IN (SELECT value FROM json_each(:behind))))))
    ORDER BY o.seq LIMIT :limit)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts, lease_expiries, solo_deaths

-- name: claim_suspect_unordered
-- Crash isolation (0005): run first in the claim's transaction; a suspect (a message whose lease
-- expired) is claimed alone, and then the claim is only that.
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay, locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease, locked_alone = 1
WHERE seq = (
    SELECT seq FROM {outbox}
    WHERE lease_expiries > 0 AND claim_token IS NULL AND available_at <= (julianday('now') - 2440587.5) * 86400.0
    ORDER BY seq LIMIT 1)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts, lease_expiries, solo_deaths

-- name: claim_suspect_ordered
-- The same, for a suspect that heads its key.
UPDATE {outbox}
SET claim_token = :token, locked_by = :relay, locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease, locked_alone = 1
WHERE seq = (
    SELECT o.seq FROM {outbox} o
    WHERE o.lease_expiries > 0 AND o.claim_token IS NULL AND o.available_at <= (julianday('now') - 2440587.5) * 86400.0
      AND (NOT :hold OR o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {dead_letters} d WHERE d.key = o.key AND d.direction = 'publish'))
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} h WHERE h.key = o.key AND h.seq < o.seq))
    ORDER BY o.seq LIMIT 1)
RETURNING id, seq, topic, key, type, payload, content_type, headers, created_at, available_at,
          attempts, lease_expiries, solo_deaths

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

-- name: extend_lease
-- A relay keeps the lease of a batch it is still publishing (see the PostgreSQL query).
UPDATE {outbox}
SET locked_until = (julianday('now') - 2440587.5) * 86400.0 + :lease
WHERE id IN (SELECT value FROM json_each(:ids)) AND claim_token = :token

-- name: release
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id IN (SELECT value FROM json_each(:ids)) AND claim_token = :token

-- name: dead_letter_copy
-- OR REPLACE: a message whose id already has a publish dead letter (ids may be reused) replaces
-- it, as the newest (a new dl_seq), and leaves a consume dead letter of the id alone (0008); a
-- plain INSERT would fail the settle of the whole batch, forever.
-- dead_lettered_at is set here rather than by the column default, on the store's clock.
INSERT OR REPLACE INTO {dead_letters} (id, topic, key, type, payload, content_type, headers,
                                       created_at, dead_lettered_at, failure_reason, attempts,
                                       direction)
SELECT o.id, o.topic, o.key, o.type, o.payload, o.content_type, o.headers, o.created_at,
       (julianday('now') - 2440587.5) * 86400.0, json_extract(f.value, '$[1]'),
       o.attempts + 1, 'publish'
FROM {outbox} o JOIN json_each(:items) f ON json_extract(f.value, '$[0]') = o.id
WHERE o.claim_token = :token

-- name: dead_letter_delete
DELETE FROM {outbox}
WHERE id IN (SELECT json_extract(value, '$[0]') FROM json_each(:items)) AND claim_token = :token

-- name: release_expired
-- Each message taken back becomes a suspect; one that was alone counts a solo death (0005).
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL,
    lease_expiries = lease_expiries + 1, solo_deaths = solo_deaths + locked_alone,
    locked_alone = 0,
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

-- name: sweep_forget_relays
-- Relays silent for a day (killed, their host gone): their rows would only pile up.
DELETE FROM {relays} WHERE heartbeat_at < (julianday('now') - 2440587.5) * 86400.0 - 86400

-- name: sweep
UPDATE {sweeps}
-- released_since_sweep counts expired leases and the relays' retries (settle): the
-- publish retries since the previous sweep (the column kept its first name).
SET publish_retries = released_since_sweep, released_since_sweep = 0,
    publish_failures = (SELECT count(*) FROM {dead_letters} d
                        WHERE d.direction = 'publish'
                          AND d.dead_lettered_at >= COALESCE({sweeps}.started_at, 0)),
    consume_retries = consume_retried_since_sweep, consume_retried_since_sweep = 0,
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
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NULL AND attempts = 0
        AND available_at > (julianday('now') - 2440587.5) * 86400.0) AS scheduled,
    -- pending, not scheduled, behind a scheduled message of their key (see PostgreSQL's)
    (SELECT count(*) FROM (
        SELECT key, min(seq) AS seq FROM {outbox}
        WHERE key IS NOT NULL AND claim_token IS NULL AND attempts = 0
          AND available_at > (julianday('now') - 2440587.5) * 86400.0
        GROUP BY key) s
     JOIN {outbox} o ON o.key = s.key AND o.seq > s.seq
     WHERE o.claim_token IS NULL AND NOT (o.attempts = 0
        AND o.available_at > (julianday('now') - 2440587.5) * 86400.0)) AS behind_scheduled,
    (SELECT count(*) FROM {dead_letters}) AS dead_letters,
    (SELECT (julianday('now') - 2440587.5) * 86400.0 - min(created_at) FROM {outbox}) AS oldest_age,
    (SELECT count(*) FROM {outbox} o
     WHERE o.claim_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM {relays} r
        WHERE r.relay_id = o.locked_by AND r.heartbeat_at > (julianday('now') - 2440587.5) * 86400.0 - :live)) AS unowned

-- name: consume_failures
-- The inbox's side of stats: per consumer, its failures still to re-drive. Retrying: the
-- handlers failed (attempts >= 1). Waiting: stored and not tried since (attempts 0): behind an
-- earlier failure of its key, or a replayed consume dead letter before its re-drive. 'dead'
-- rows are dead letters, counted there. A small table (failures only), scanned through the
-- partial index of its retrying rows (inbox_failures_due, 0003_inbox.sql): dead rows are
-- skipped and the rows come grouped by consumer.
SELECT consumer,
       sum(attempts > 0) AS retrying,
       sum(attempts = 0) AS waiting,
       (julianday('now') - 2440587.5) * 86400.0 - min(failed_at) AS oldest_age
FROM {inbox_failures}
WHERE state = 'retrying'
GROUP BY consumer

-- name: live_relays
-- What each holds is counted in one pass over the leased rows, grouped by relay: a count per
-- relay (a correlated subquery) read the whole outbox once per live relay, as no index covers
-- locked_by (a claim must stay a HOT update), and 200 relays over a backlog of 300,000 took 6 s,
-- past the 5 s of /readyz, which then called the database unreachable (a probe).
SELECT r.relay_id, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       COALESCE(h.in_flight, 0) AS in_flight
FROM {relays} r
LEFT JOIN (
    SELECT o.locked_by, count(*) AS in_flight FROM {outbox} o
    WHERE o.claim_token IS NOT NULL
    GROUP BY o.locked_by
) h ON h.locked_by = r.relay_id
WHERE r.heartbeat_at > (julianday('now') - 2440587.5) * 86400.0 - :live
ORDER BY r.started_at

-- name: dead_letter_where
(:topic IS NULL OR topic = :topic)
AND (:type IS NULL OR type = :type)
AND (:key IS NULL OR key = :key)
AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
AND (:direction IS NULL OR direction = :direction)

-- name: known_dead_letter_ids
SELECT id FROM {dead_letters} WHERE id IN (SELECT value FROM json_each(:ids))

-- name: known_message_ids
SELECT id FROM {outbox} WHERE id IN (SELECT value FROM json_each(:ids))

-- name: list_dead_letters
-- See the PostgreSQL query of the same name: the walk with its LIMIT reads only the payloads'
-- sizes, the page ends early once the payloads before a row reach :budget bytes, only the
-- page's payloads are read (by dl_seq), and the row past the page comes without its payload.
SELECT c.dl_seq, d.id, d.topic, d.key, d.type,
       CASE WHEN c.in_page THEN d.payload END AS payload, d.content_type, d.headers,
       d.created_at, d.dead_lettered_at, d.failure_reason, d.attempts, d.direction, c.in_page
FROM (
    SELECT dl_seq,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < :budget AS in_page,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < :budget AS listed
    FROM (
        SELECT dl_seq, length(payload) AS size  -- a BLOB: its length in bytes
        FROM {dead_letters}
        WHERE {where} AND (:after IS NULL OR dl_seq < :after)
        ORDER BY dl_seq DESC
        LIMIT :limit
    ) candidates
) c
JOIN {dead_letters} d ON d.dl_seq = c.dl_seq
WHERE c.listed
ORDER BY c.dl_seq DESC

-- name: list_messages
-- See the PostgreSQL query of the same name; {filters} becomes "AND o.key = :key" ... for the
-- filters given, so a key filter walks the (key, seq) index and the others the rowid. The page
-- ends early once the payloads before a row reach :budget bytes (as list_dead_letters).
SELECT c.*, CASE WHEN c.in_page THEN p.payload END AS payload
FROM (
    SELECT w.*,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < :budget AS in_page,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < :budget AS listed
    FROM (
        SELECT m.* FROM (
            SELECT o.seq, o.id, o.topic, o.key, o.type, length(o.payload) AS size,
                   o.content_type, o.headers, o.created_at, o.available_at, o.attempts,
                   o.last_error, o.locked_by, o.locked_until,
                   CASE
                       WHEN o.claim_token IS NOT NULL THEN 'in_flight'
                       WHEN o.key IS NOT NULL AND EXISTS (
                           SELECT 1 FROM {dead_letters} d
                           WHERE d.key = o.key AND d.direction = 'publish') THEN 'held'
                       WHEN o.available_at > (julianday('now') - 2440587.5) * 86400.0
                            AND o.attempts > 0 THEN 'retrying'
                       WHEN o.available_at > (julianday('now') - 2440587.5) * 86400.0
                            THEN 'scheduled'
                       ELSE 'pending'
                   END AS state
            FROM {outbox} o
            WHERE o.seq > :after {filters}
        ) m
        WHERE (:state IS NULL OR m.state = :state)
        ORDER BY m.seq
        LIMIT :limit
    ) w
) c
JOIN {outbox} p ON p.seq = c.seq
WHERE c.listed
ORDER BY c.seq

-- name: replay_copy
INSERT INTO {outbox} (id, topic, key, type, payload, content_type, headers, created_at)
SELECT id, topic, key, type, payload, content_type, headers, created_at
FROM {dead_letters} d WHERE {where} AND direction = 'publish'
  AND NOT EXISTS (SELECT 1 FROM {outbox} o WHERE o.id = d.id)
ORDER BY dl_seq
RETURNING id

-- name: replay_delete
DELETE FROM {dead_letters}
WHERE direction = 'publish' AND id IN (SELECT value FROM json_each(:replayed))

-- name: purge_dead_letters
DELETE FROM {dead_letters} WHERE {where}
RETURNING id

-- ---------------------------------------------------------------------------------------------
-- Inbox (consumers). See the PostgreSQL queries of the same names and docs/inbox.md. SQLite
-- has no data-modifying CTEs: the store runs these one after the other in one BEGIN IMMEDIATE
-- transaction (one writer at a time, so no SKIP LOCKED is needed either).

-- name: inbox_receive
-- The first statement of a batch's transaction: records (consumer, id) of every message
-- (:messages, a JSON array of [id, key], distinct ids) unless it is there already, and returns
-- the rows it inserted: the others are duplicates. A message whose key has an earlier message
-- still failing for this consumer waits behind it ("blocked"): its row gets no expiry. (WHERE
-- true: SQLite's parser needs it before ON CONFLICT after a SELECT. The caller tests
-- expires_at for NULL: "RETURNING expires_at IS NULL" answers 0 for a NULL in a WITHOUT ROWID
-- table on SQLite 3.40.)
INSERT INTO {inbox} (consumer, message_id, expires_at)
SELECT :consumer, json_extract(d.value, '$[0]'),
       CASE WHEN json_extract(d.value, '$[1]') IS NOT NULL AND EXISTS (
                SELECT 1 FROM {inbox_failures} f
                WHERE f.consumer = :consumer AND f.key = json_extract(d.value, '$[1]')
                  AND f.state = 'retrying')
            THEN NULL ELSE (julianday('now') - 2440587.5) * 86400.0 + :retention END
FROM json_each(:messages) AS d
WHERE true
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id, expires_at

-- name: inbox_failure_insert
INSERT INTO {inbox_failures} (consumer, message_id, topic, key, type, payload, content_type,
                              headers, created_at, attempts, next_attempt_at, last_error, state)
VALUES (:consumer, :id, :topic, :key, :type, :payload, :content_type, :headers, :created_at,
        :attempts, (julianday('now') - 2440587.5) * 86400.0 + :delay, :reason, :state)
ON CONFLICT (consumer, message_id) DO NOTHING

-- name: inbox_hold
-- The message now has a pending failure: keep its inbox row until it is handled or given up.
UPDATE {inbox} SET expires_at = NULL WHERE consumer = :consumer AND message_id = :id

-- name: inbox_set_done
INSERT INTO {inbox} (consumer, message_id, expires_at)
VALUES (:consumer, :id, (julianday('now') - 2440587.5) * 86400.0 + :retention)
ON CONFLICT (consumer, message_id) DO UPDATE SET expires_at = excluded.expires_at

-- name: inbox_dead_letter
INSERT INTO {dead_letters} (id, topic, key, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
VALUES (:id, :topic, :key, :type, :payload, :content_type, :headers, :created_at, :reason,
        :attempts, 'consume')
ON CONFLICT (id, direction) DO UPDATE
    SET failure_reason = excluded.failure_reason,
        dead_lettered_at = (julianday('now') - 2440587.5) * 86400.0,
        attempts = max(attempts, excluded.attempts)

-- name: inbox_due
-- Due failures of one consumer: of each key, those behind its earliest failure when that one is
-- due; every key's first before any key's second, and so on, so a key whose first failure another
-- instance holds (a slow handler) takes one place of the round, not all of them; among those, the
-- one due the longest first (then arrival order), so that failures due again at once (a retry
-- delay under the re-drive interval) cannot fill every round and starve the keys that failed
-- after them (a probe). A round re-drives them one after the other, each locked only once nothing
-- earlier of its key is left (inbox_failure_lock): the backlog of a key that was waiting behind
-- a failure drains a batch per round, not one message per round. An unkeyed failure is a key
-- of its own.
SELECT r.message_id FROM (
    SELECT f.message_id, f.seq, f.next_attempt_at,
           row_number() OVER w AS place, first_value(f.next_attempt_at) OVER w AS head_due_at
    FROM {inbox_failures} f
    WHERE f.consumer = :consumer AND f.state = 'retrying'
    WINDOW w AS (PARTITION BY f.key, CASE WHEN f.key IS NULL THEN f.seq END ORDER BY f.seq)
) r
WHERE max(r.next_attempt_at, r.head_due_at) <= (julianday('now') - 2440587.5) * 86400.0
ORDER BY r.place, r.next_attempt_at, r.seq
LIMIT :limit

-- name: inbox_failure_lock
SELECT f.seq, f.message_id AS id, f.topic, f.key, f.type, f.payload, f.content_type,
       f.headers, f.created_at, f.created_at AS available_at,
       0 AS attempts, f.attempts AS consume_attempts,
       EXISTS (SELECT 1 FROM {inbox} i
               WHERE i.consumer = f.consumer AND i.message_id = f.message_id
                 AND i.expires_at IS NOT NULL) AS handled
FROM {inbox_failures} f
WHERE f.consumer = :consumer AND f.message_id = :id AND f.state = 'retrying'
  AND f.next_attempt_at <= (julianday('now') - 2440587.5) * 86400.0
  AND (f.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {inbox_failures} h
        WHERE h.consumer = f.consumer AND h.key = f.key AND h.state = 'retrying'
          AND h.seq < f.seq))

-- name: inbox_forget
-- The inbox rows of messages never handled, after a handler ended the inbox's transaction
-- (a commit had committed them with it): their redelivery must not be taken for duplicates.
DELETE FROM {inbox}
WHERE consumer = :consumer AND message_id IN (SELECT value FROM json_each(:ids))

-- name: inbox_failure_delete
DELETE FROM {inbox_failures} WHERE seq = :seq

-- name: inbox_failure_retry
UPDATE {inbox_failures}
SET attempts = :attempts, last_error = :reason,
    next_attempt_at = (julianday('now') - 2440587.5) * 86400.0 + :delay
WHERE seq = :seq

-- name: inbox_failure_dead
UPDATE {inbox_failures}
SET attempts = :attempts, last_error = :reason, state = 'dead',
    next_attempt_at = (julianday('now') - 2440587.5) * 86400.0
WHERE seq = :seq

-- name: inbox_count_retries
UPDATE {sweeps} SET consume_retried_since_sweep = consume_retried_since_sweep + :count
WHERE name = 'default'

-- name: replay_consume_select
SELECT id FROM {dead_letters} WHERE {where} AND direction = 'consume' ORDER BY dl_seq

-- name: replay_consume_revive
UPDATE {inbox_failures}
SET state = 'retrying', attempts = 0,
    next_attempt_at = (julianday('now') - 2440587.5) * 86400.0,
    last_error = 'replayed: ' || COALESCE(last_error, '')
WHERE state = 'dead' AND message_id IN (SELECT value FROM json_each(:replayed))

-- name: replay_consume_keep
UPDATE {inbox} SET expires_at = NULL
WHERE EXISTS (SELECT 1 FROM {inbox_failures} f
              WHERE f.consumer = {inbox}.consumer AND f.message_id = {inbox}.message_id
                AND f.state = 'retrying'
                AND f.message_id IN (SELECT value FROM json_each(:replayed)))

-- name: replay_consume_delete
DELETE FROM {dead_letters}
WHERE direction = 'consume' AND id IN (SELECT value FROM json_each(:replayed))

-- name: inbox_purge
DELETE FROM {inbox}
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM {inbox}
    WHERE expires_at < (julianday('now') - 2440587.5) * 86400.0
    ORDER BY expires_at
    LIMIT :batch)

-- name: inbox_forget_dead
DELETE FROM {inbox_failures} WHERE seq IN (
    SELECT f.seq FROM {inbox_failures} f
    WHERE f.state = 'dead' AND NOT EXISTS (
        SELECT 1 FROM {dead_letters} d WHERE d.id = f.message_id AND d.direction = 'consume')
    LIMIT :batch)
