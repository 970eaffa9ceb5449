-- Named queries of the MySQL/MariaDB store. "-- name: x" starts query x.
-- Parameters are named (%(name)s) and interpolated by the driver; a Python tuple parameter
-- becomes a parenthesized list, so "IN %(ids)s" takes a non-empty tuple. Lists whose items carry
-- several values (retries, dead letters) are one JSON array, expanded with JSON_TABLE and joined
-- on the unique id index. Durations are integer microseconds. Times are UTC (see 0001).

-- name: claim_unordered
-- The first half of a claim, in its own short transaction: lock the oldest claimable rows.
-- SKIP LOCKED lets concurrent relays take disjoint batches without waiting on each other. The
-- lock holds until claim_mark commits; publishing happens after that, outside any transaction.
-- The transaction runs at READ COMMITTED or lower, so InnoDB locks no gaps and releases the rows
-- it read but did not return. The scan is the primary key's: left to itself MariaDB walks the
-- suspects index (lease_expiries, seq), locking its entries, where SKIP LOCKED does not skip the
-- entries an acknowledgement is deleting but waits for them, while that DELETE waits for the
-- entries the claim holds: a deadlock (seen draining 1,000,000 messages).
SELECT o.seq, o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers,
       o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths
FROM {outbox} o FORCE INDEX (PRIMARY)
WHERE o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6) AND o.lease_expiries = 0
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: claim_heads
-- Where the claimable keys begin, for an ordered claim whose look at the front of the table
-- (claim_ordered_front) left the batch short: then the front holds keys in flight, and what
-- lies behind it is found from here without walking their rows (docs/adr/0003, "a claim bounded
-- by the keys"). One row per key, the NULL group standing for the unkeyed rows, with its head
-- (its oldest row, uncommitted rows included: this runs at READ UNCOMMITTED too) and whether
-- that head may be claimed. InnoDB answers from the (key, seq) index, one dive per key ("Using
-- index for group-by"): it costs the number of keys, never the backlog. At most %(keys)s keys
-- are read; a table with more takes the scan behind the front (relay.py).
SELECT h.`key`, h.head,
       (o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6) AND o.lease_expiries = 0
        AND (NOT %(hold)s OR h.`key` IS NULL OR NOT EXISTS (
              SELECT 1 FROM {dead_letters} d
              WHERE d.`key` = h.`key` AND d.direction = 'publish'))) AS free
FROM (SELECT `key`, MIN(seq) AS head FROM {outbox} GROUP BY `key` LIMIT %(keys)s) h
JOIN {outbox} o ON o.seq = h.head

-- name: claim_ordered
-- Per-key order with any number of relays (docs/adr/0001 and 0003). Runs in a READ UNCOMMITTED
-- transaction: the subqueries below are plain (non-locking) reads, so they also see rows that
-- other transactions have inserted but not committed yet. That is the commit-order gate.
--  1. Candidates are the oldest claimable rows whose key's head (its oldest row, committed or
--     not) is neither leased nor waiting: rows behind a blocked head are skipped, so a failing
--     message never holds back other keys, and blocked rows do not fill the batch.
--  2. head = the key's oldest row and next_seq = the row of the key that follows this one,
--     uncommitted rows included. The store keeps a key's first candidate only if it is the head,
--     and each further one only if it is next_seq of the one before: every earlier row of the
--     key is in this very batch. A row locked by another relay (SKIP LOCKED), a delayed row, and
--     a row whose transaction has not committed all break that chain: an auto-increment value
--     handed to a slower transaction is never overtaken by a later row of its key.
--     Both probes read the (key, seq) index in seq order from the key's first entry and stop at
--     the first match: they cost the candidate's place in its key, not the key's backlog (a
--     count of the rows up to the candidate read all of them: InnoDB cannot seek to an outer
--     row's seq in a correlated subquery, so the count walked the key to its end).
-- The ranges placeholder bounds the scan to primary-key ranges, so that the rows of keys in
-- flight are not walked (relay.py, _claim_ordered): the front of the table; behind it, keyed rows
-- in the ranges that start at the claimable heads found by claim_heads (claim_unkeyed takes the
-- unkeyed rows); or all of the rest. It only narrows the candidates, so it cannot break 2.
SELECT o.seq, o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers,
       o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths,
       (SELECT h.seq FROM {outbox} h WHERE h.`key` = o.`key` ORDER BY h.seq LIMIT 1) AS head,
       (SELECT n.seq FROM {outbox} n WHERE n.`key` = o.`key` AND n.seq > o.seq
        ORDER BY n.seq LIMIT 1) AS next_seq
FROM {outbox} o
WHERE ({ranges})
  AND o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6) AND o.lease_expiries = 0
  AND (o.`key` IS NULL OR NOT (
        SELECT h.claim_token IS NOT NULL OR h.available_at > UTC_TIMESTAMP(6)
        FROM {outbox} h WHERE h.`key` = o.`key` ORDER BY h.seq LIMIT 1))
  -- a key whose earlier message is a dead letter stays on hold, if the relay asks so
  AND (NOT %(hold)s OR o.`key` IS NULL OR NOT EXISTS (
        SELECT 1 FROM {dead_letters} d WHERE d.`key` = o.`key` AND d.direction = 'publish'))
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: claim_ordered_front
-- The ranges of an ordered claim's first look: the front of the table, %(front)s values of seq
-- from its oldest row. MariaDB evaluates the MIN (one index dive) once, before planning, so this
-- is a primary-key range.
o.seq <= (SELECT MIN(f.seq) FROM {outbox} f) + %(front)s

-- name: claim_ordered_behind_front
-- ... and everything behind it, when there are too many keys to read their heads.
o.seq > (SELECT MIN(f.seq) FROM {outbox} f) + %(front)s

-- name: claim_unkeyed
-- The unkeyed rows of a bounded ordered claim (they have no order to keep, and may lie anywhere
-- behind the keyed ranges): the oldest claimable ones, from the NULL end of the (key, seq) index.
SELECT o.seq, o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers,
       o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths
FROM {outbox} o
WHERE o.`key` IS NULL
  AND o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6) AND o.lease_expiries = 0
ORDER BY o.seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: claim_suspect_unordered
-- Crash isolation (0005), first in the claim's transaction: a suspect (a message whose lease
-- expired) is claimed alone, and then the claim is only that.
SELECT o.seq, o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers,
       o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths
FROM {outbox} o
WHERE o.lease_expiries > 0 AND o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6)
ORDER BY o.seq
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: claim_suspect_ordered
-- The same, for a suspect that heads its key.
SELECT o.seq, o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers,
       o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths
FROM {outbox} o
WHERE o.lease_expiries > 0 AND o.claim_token IS NULL AND o.available_at <= UTC_TIMESTAMP(6)
  AND (o.`key` IS NULL OR NOT EXISTS (
        SELECT 1 FROM {outbox} h WHERE h.`key` = o.`key` AND h.seq < o.seq))
  AND (NOT %(hold)s OR o.`key` IS NULL OR NOT EXISTS (
        SELECT 1 FROM {dead_letters} d WHERE d.`key` = o.`key` AND d.direction = 'publish'))
ORDER BY o.seq
LIMIT 1
FOR UPDATE SKIP LOCKED

-- name: claim_mark
-- The second half of a claim: lease the kept rows (locked by claim_*), then commit.
UPDATE {outbox}
SET claim_token = %(token)s, locked_by = %(relay)s,
    locked_until = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND,
    locked_alone = %(alone)s
WHERE seq IN %(seqs)s

-- name: ack
-- Pinned to the id index (as dead_letter_delete): on a small table MariaDB reads the whole
-- table instead, and a DELETE (unlike an UPDATE at READ COMMITTED) waits for each row it reads
-- that another transaction holds: every settle waited for the rows an application's open
-- transaction had written (a long business transaction stalled every ack, up to
-- innodb_lock_wait_timeout, then failed it). DELETE takes an index hint only in its
-- multi-table form.
DELETE o FROM {outbox} o FORCE INDEX (`{t}_id`)
WHERE o.id IN %(ids)s AND o.claim_token = %(token)s

-- name: retry
-- items: [[id, delay seconds, reason], ...]
UPDATE {outbox} o
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
        id     VARCHAR(255) PATH '$[0]',
        delay  DOUBLE       PATH '$[1]',
        reason LONGTEXT     PATH '$[2]')) u ON o.id = u.id
SET o.attempts = o.attempts + 1, o.last_error = u.reason,
    o.available_at = UTC_TIMESTAMP(6) + INTERVAL ROUND(u.delay * 1000000) MICROSECOND,
    o.claim_token = NULL, o.locked_by = NULL, o.locked_until = NULL
WHERE o.claim_token = %(token)s

-- name: extend_lease
-- A relay keeps the lease of a batch it is still publishing (see the PostgreSQL query).
UPDATE {outbox}
SET locked_until = UTC_TIMESTAMP(6) + INTERVAL %(lease_us)s MICROSECOND
WHERE id IN %(ids)s AND claim_token = %(token)s

-- name: release
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id IN %(ids)s AND claim_token = %(token)s

-- name: dead_letter_copy
-- items: [[id, reason], ...]. Followed by dead_letter_delete in the same transaction, so the
-- rows move or stay together; the claim token fences both statements.
-- Ids may be reused (docs/guarantees.md): REPLACE deletes a publish dead letter with the same
-- id and inserts this one as the newest (a fresh dl_seq); a consume dead letter of the id stays
-- (the unique key is (id, direction), 0008). A plain INSERT would fail on the unique key and
-- with it the settle of the whole batch, forever (every lease).
REPLACE INTO {dead_letters} (id, topic, `key`, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
SELECT o.id, o.topic, o.`key`, o.type, o.payload, o.content_type, o.headers, o.created_at,
       f.reason, o.attempts + 1, 'publish'
FROM {outbox} o
JOIN JSON_TABLE(%(items)s, '$[*]' COLUMNS (
        id     VARCHAR(255) PATH '$[0]',
        reason LONGTEXT     PATH '$[1]')) f ON o.id = f.id
WHERE o.claim_token = %(token)s
ORDER BY o.seq

-- name: dead_letter_delete
DELETE o FROM {outbox} o FORCE INDEX (`{t}_id`)
WHERE o.id IN %(ids)s AND o.claim_token = %(token)s

-- name: release_expired
-- No index covers claim_token (a claim would then write it): this scans the table, which is
-- why the sweeper runs it only every half lease. The count is added to the sweep report next.
-- Each message taken back becomes a suspect; one that was alone counts a solo death (0005).
UPDATE {outbox}
SET claim_token = NULL, last_error = CONCAT('lease of relay ', locked_by, ' expired'),
    locked_by = NULL, locked_until = NULL,
    lease_expiries = lease_expiries + 1, solo_deaths = solo_deaths + locked_alone,
    locked_alone = FALSE
WHERE claim_token IS NOT NULL AND locked_until < UTC_TIMESTAMP(6)

-- name: count_released
UPDATE {sweeps} SET released_since_sweep = released_since_sweep + %(count)s
WHERE name = 'default'

-- name: sweep_lock
-- Only one sweeper at a time across all relays: a named lock of the server, held by the
-- sweeping connection until RELEASE_LOCK (or until that connection dies). Then the sweep runs
-- only if the last one is older than the interval.
SELECT GET_LOCK(%(lock)s, 0) = 1
   AND (SELECT started_at IS NULL
               OR started_at <= UTC_TIMESTAMP(6) - INTERVAL %(interval_us)s MICROSECOND
        FROM {sweeps} WHERE name = 'default') AS won

-- name: sweep_purge
-- Dead letters past their retention, a bounded batch per sweep, oldest first.
DELETE FROM {dead_letters}
WHERE %(retention_us)s > 0
  AND dead_lettered_at < UTC_TIMESTAMP(6) - INTERVAL %(retention_us)s MICROSECOND
ORDER BY dead_lettered_at
LIMIT %(batch)s

-- name: sweep_forget_relays
-- Relays silent for a day (killed, their host gone): their rows would only pile up.
DELETE FROM {relays} WHERE heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL 1 DAY

-- name: sweep_record
-- What happened since the previous sweep: the failures counted from the dead letters written
-- since its start, the re-drives from the counters the relays and consumers keep.
UPDATE {sweeps} s
JOIN (SELECT
        (SELECT count(*) FROM {dead_letters} d
         WHERE d.direction = 'publish'
           AND d.dead_lettered_at >= COALESCE(p.started_at, '1000-01-01')) AS publish_failures,
        (SELECT count(*) FROM {dead_letters} d
         WHERE d.direction = 'consume'
           AND d.dead_lettered_at >= COALESCE(p.started_at, '1000-01-01')) AS consume_failures
      FROM {sweeps} p WHERE p.name = 'default') c
SET s.started_at = %(started_at)s, s.completed_at = UTC_TIMESTAMP(6), s.swept_by = %(sweeper)s,
    -- released_since_sweep counts expired leases and the relays' retries (settle): the
    -- publish retries since the previous sweep (the column kept its first name).
    s.publish_retries = s.released_since_sweep, s.released_since_sweep = 0,
    s.publish_failures = c.publish_failures,
    s.consume_retries = s.consume_retried_since_sweep, s.consume_retried_since_sweep = 0,
    s.consume_failures = c.consume_failures,
    s.purged = %(purged)s
WHERE s.name = 'default'

-- name: last_sweep
SELECT started_at, completed_at, swept_by, publish_retries, publish_failures,
       consume_retries, consume_failures, purged
FROM {sweeps} WHERE name = 'default' AND completed_at IS NOT NULL

-- name: latest_seq
-- The doorbell MySQL lacks (there is no LISTEN/NOTIFY): the newest row, read from the end of
-- the primary key. Polled on one connection while the relay is idle; a change rings.
SELECT COALESCE(MAX(seq), 0) AS seq FROM {outbox}

-- name: heartbeat
INSERT INTO {relays} (relay_id, hostname, pid, started_at, heartbeat_at)
VALUES (%(relay_id)s, %(hostname)s, %(pid)s, %(started_at)s, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE heartbeat_at = UTC_TIMESTAMP(6)

-- name: unregister
DELETE FROM {relays} WHERE relay_id = %(relay_id)s

-- name: stats
SELECT
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NULL) AS pending,
    (SELECT count(*) FROM {outbox} WHERE claim_token IS NOT NULL) AS in_flight,
    (SELECT count(*) FROM {outbox}
     WHERE claim_token IS NULL AND attempts = 0 AND available_at > UTC_TIMESTAMP(6)) AS scheduled,
    -- pending, not scheduled, behind a scheduled message of their key (see PostgreSQL's)
    (SELECT count(*) FROM (
        SELECT `key`, MIN(seq) AS seq FROM {outbox}
        WHERE `key` IS NOT NULL AND claim_token IS NULL AND attempts = 0
          AND available_at > UTC_TIMESTAMP(6)
        GROUP BY `key`) s
     JOIN {outbox} o ON o.`key` = s.`key` AND o.seq > s.seq
     WHERE o.claim_token IS NULL
       AND NOT (o.attempts = 0 AND o.available_at > UTC_TIMESTAMP(6))) AS behind_scheduled,
    (SELECT count(*) FROM {dead_letters}) AS dead_letters,
    (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6
     FROM {outbox}) AS oldest_age,
    -- in flight for a relay with no live heartbeat: waiting for its lease to expire
    (SELECT count(*) FROM {outbox} o
     WHERE o.claim_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM {relays} r
        WHERE r.relay_id = o.locked_by
          AND r.heartbeat_at > UTC_TIMESTAMP(6) - INTERVAL %(live_us)s MICROSECOND)) AS unowned

-- name: consume_failures
-- The inbox's side of stats: per consumer, its failures still to re-drive. Retrying: the
-- handlers failed (attempts >= 1). Waiting: stored and not tried since (attempts 0): behind an
-- earlier failure of its key, or a replayed consume dead letter before its re-drive. 'dead'
-- rows are dead letters, counted there. A small table (failures only), read in consumer
-- order through one of its indexes that start with consumer: the grouping needs no sort.
SELECT consumer,
       SUM(attempts > 0) AS retrying,
       SUM(attempts = 0) AS waiting,
       TIMESTAMPDIFF(MICROSECOND, MIN(failed_at), UTC_TIMESTAMP(6)) / 1e6 AS oldest_age
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
WHERE r.heartbeat_at > UTC_TIMESTAMP(6) - INTERVAL %(live_us)s MICROSECOND
ORDER BY r.started_at

-- name: known_dead_letter_ids
SELECT id FROM {dead_letters} WHERE id IN %(ids)s

-- name: known_message_ids
SELECT id FROM {outbox} WHERE id IN %(ids)s

-- name: list_dead_letters
-- The filters: NULL matches everything. by_id is a constant once the driver has interpolated
-- the parameters, so the server folds "NOT 0 OR ..." away and uses the id index when it is 1.
-- See the PostgreSQL query of the same name for the byte budget: the walk with its LIMIT reads
-- only the payloads' sizes (no payload in the candidates, so the window runs over at most
-- limit small rows, never the table), the page ends early once the payloads before a row reach
-- the budget, only the page's payloads are read (by primary key), and the row past the page
-- comes without its payload.
SELECT c.dl_seq, d.id, d.topic, d.`key`, d.type,
       CASE WHEN c.in_page THEN d.payload END AS payload, d.content_type, d.headers,
       d.created_at, d.dead_lettered_at, d.failure_reason, d.attempts, d.direction, c.in_page
FROM (
    SELECT dl_seq,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < %(budget)s AS in_page,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < %(budget)s AS listed
    FROM (
        SELECT dl_seq, length(payload) AS size
        FROM {dead_letters}
        WHERE (%(topic)s IS NULL OR topic = %(topic)s)
          AND (%(type)s IS NULL OR type = %(type)s)
          AND (%(key)s IS NULL OR `key` = %(key)s)
          AND (NOT %(by_id)s OR id IN %(ids)s)
          AND (%(direction)s IS NULL OR direction = %(direction)s)
          AND (%(after)s IS NULL OR dl_seq < %(after)s)
        ORDER BY dl_seq DESC
        LIMIT %(limit)s
    ) candidates
) c
JOIN {dead_letters} d ON d.dl_seq = c.dl_seq
WHERE c.listed
ORDER BY c.dl_seq DESC

-- name: select_dead_letters
-- The dead letters a replay or purge acts on, locked for the rest of its transaction (MySQL has
-- no DELETE ... RETURNING): the statements that follow act on exactly these rows.
SELECT dl_seq, id, direction
FROM {dead_letters} d
WHERE (%(topic)s IS NULL OR topic = %(topic)s)
  AND (%(type)s IS NULL OR type = %(type)s)
  AND (%(key)s IS NULL OR `key` = %(key)s)
  AND (NOT %(by_id)s OR id IN %(ids)s)
  AND (%(direction)s IS NULL OR direction = %(direction)s)
ORDER BY dl_seq
FOR UPDATE

-- name: replayable_dead_letters
-- Of the selected publish dead letters, those whose id is not in the outbox again (written
-- anew by the application): the others stay put.
SELECT d.dl_seq, d.id FROM {dead_letters} d
WHERE d.dl_seq IN %(seqs)s AND NOT EXISTS (SELECT 1 FROM {outbox} o WHERE o.id = d.id)
ORDER BY d.dl_seq

-- name: replay_dead_letters
-- Back to the outbox with the same id (consumers can still dedupe) and attempts reset, in
-- dead-letter order.
INSERT INTO {outbox} (id, topic, `key`, type, payload, content_type, headers, created_at)
SELECT d.id, d.topic, d.`key`, d.type, d.payload, d.content_type, d.headers, d.created_at
FROM {dead_letters} d
WHERE d.dl_seq IN %(seqs)s
ORDER BY d.dl_seq

-- name: delete_dead_letters
DELETE FROM {dead_letters} WHERE dl_seq IN %(seqs)s

-- name: list_messages
-- The backlog as operators see it (outboxer messages, GET /api/messages), oldest first.
-- {filters} becomes fixed conditions for the filters given (AND o.`key` = the key parameter;
-- a value), so a key filter walks the (key, seq) index and the others the primary key from the
-- cursor, stopping at limit matching rows. The state is judged in the order of
-- outboxer.ports.MessageState; "held" asks the dead letters' key index. The page ends early
-- once the payloads before a row reach the budget (as list_dead_letters).
SELECT c.*, CASE WHEN c.in_page THEN p.payload END AS payload
FROM (
    SELECT w.*,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < %(budget)s AS in_page,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < %(budget)s AS listed
    FROM (
        SELECT m.* FROM (
            SELECT o.seq, o.id, o.topic, o.`key`, o.type, length(o.payload) AS size,
                   o.content_type, o.headers, o.created_at, o.available_at, o.attempts,
                   o.last_error, o.locked_by, o.locked_until,
                   CASE
                       WHEN o.claim_token IS NOT NULL THEN 'in_flight'
                       WHEN o.`key` IS NOT NULL AND EXISTS (
                           SELECT 1 FROM {dead_letters} d
                           WHERE d.`key` = o.`key` AND d.direction = 'publish') THEN 'held'
                       WHEN o.available_at > UTC_TIMESTAMP(6) AND o.attempts > 0 THEN 'retrying'
                       WHEN o.available_at > UTC_TIMESTAMP(6) THEN 'scheduled'
                       ELSE 'pending'
                   END AS state
            FROM {outbox} o
            WHERE o.seq > %(after)s {filters}
        ) m
        WHERE (%(state)s IS NULL OR m.state = %(state)s)
        ORDER BY m.seq
        LIMIT %(limit)s
    ) w
) c
JOIN {outbox} p ON p.seq = c.seq
WHERE c.listed
ORDER BY c.seq

-- ---------------------------------------------------------------------------------------------
-- Inbox (consumers). See docs/inbox.md, 0003_inbox.sql and postgres/sql/queries.sql, whose
-- queries of the same names these follow.

-- name: inbox_receive
-- One message of a batch's first statements; ``stores/mysql/inbox.py`` repeats it for every
-- message (in id order, so that overlapping batches lock their rows in the same order and
-- cannot deadlock on them) and sends them in one round trip. Whether an earlier message of the
-- same key is still failing for this consumer is decided once, into a session variable, so the
-- inbox row and the answer agree (a blocked message's row gets no expiry). The row is inserted
-- unless (consumer, id) is there already: then ROW_COUNT() is 0 and the delivery is a
-- duplicate. A concurrent transaction inserting the same pair makes this one wait for its
-- outcome (InnoDB's duplicate-key check): duplicates never run side by side. The answer
-- (f: fresh, b: fresh but blocked, d: duplicate) is appended to @outboxer_received.
SET @outboxer_blocked = (%(key)s IS NOT NULL AND EXISTS (
        SELECT 1 FROM {inbox_failures} f
        WHERE f.consumer = %(consumer)s AND f.`key` = %(key)s AND f.state = 'retrying'));
INSERT INTO {inbox} (consumer, message_id, expires_at)
VALUES (%(consumer)s, %(id)s,
        IF(@outboxer_blocked, NULL, UTC_TIMESTAMP(6) + INTERVAL %(retention_us)s MICROSECOND))
ON DUPLICATE KEY UPDATE consumer = consumer;
SET @outboxer_received = CONCAT(@outboxer_received,
        IF(ROW_COUNT() = 1, IF(@outboxer_blocked, 'b', 'f'), 'd'))

-- name: inbox_failure_insert
-- A failed first delivery ('retrying' after retry_us, or 'dead'), or a message waiting behind
-- its key (attempts 0, due at once: it runs as soon as it is the key's earliest). While it is
-- retrying its inbox row must not expire: the pair has to outlive the failure.
INSERT INTO {inbox_failures} (consumer, message_id, topic, `key`, type, payload, content_type,
                              headers, created_at, attempts, next_attempt_at, last_error, state)
VALUES (%(consumer)s, %(id)s, %(topic)s, %(key)s, %(type)s, %(payload)s, %(content_type)s,
        %(headers)s, %(created_at)s, %(attempts)s,
        UTC_TIMESTAMP(6) + INTERVAL %(retry_us)s MICROSECOND, %(reason)s, %(state)s)
ON DUPLICATE KEY UPDATE consumer = consumer;
UPDATE {inbox} SET expires_at = NULL
WHERE consumer = %(consumer)s AND message_id = %(id)s AND %(state)s = 'retrying'

-- name: inbox_set_done
-- Handled or given up: the row stays for the retention window, then the sweep purges it.
INSERT INTO {inbox} (consumer, message_id, expires_at)
VALUES (%(consumer)s, %(id)s, UTC_TIMESTAMP(6) + INTERVAL %(retention_us)s MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = UTC_TIMESTAMP(6) + INTERVAL %(retention_us)s MICROSECOND

-- name: inbox_dead_letter
-- A consumption that failed for good, in the dead-letter table every operator tool reads. The
-- dead letter's id is the message id; when a second consumer gives up on the same message the
-- existing consume dead letter is updated (a publish dead letter of the id is another row).
INSERT INTO {dead_letters} (id, topic, `key`, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
VALUES (%(id)s, %(topic)s, %(key)s, %(type)s, %(payload)s, %(content_type)s, %(headers)s,
        %(created_at)s, %(reason)s, %(attempts)s, 'consume')
ON DUPLICATE KEY UPDATE
    failure_reason = %(reason)s, dead_lettered_at = UTC_TIMESTAMP(6),
    attempts = GREATEST(attempts, %(attempts)s)

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
    WHERE f.consumer = %(consumer)s AND f.state = 'retrying'
    WINDOW w AS (PARTITION BY f.`key`, CASE WHEN f.`key` IS NULL THEN f.seq END ORDER BY f.seq)
) r
WHERE r.next_attempt_at <= UTC_TIMESTAMP(6) AND r.head_due_at <= UTC_TIMESTAMP(6)
ORDER BY r.place, r.next_attempt_at, r.seq
LIMIT %(limit)s

-- name: inbox_failure_lock
-- Take one due failure for a re-drive, in the re-drive's transaction. SKIP LOCKED: another
-- instance of the same consumer re-driving it right now keeps it. (Whether the inbox says the
-- message was handled meanwhile is asked next, by inbox_handled: a locking read's subqueries
-- are not the place for it.)
SELECT f.seq, f.message_id AS id, f.topic, f.`key`, f.type, f.payload, f.content_type,
       f.headers, f.created_at, f.created_at AS available_at, 0 AS attempts,
       f.attempts AS consume_attempts
FROM {inbox_failures} f
WHERE f.consumer = %(consumer)s AND f.message_id = %(id)s AND f.state = 'retrying'
  AND f.next_attempt_at <= UTC_TIMESTAMP(6)
FOR UPDATE SKIP LOCKED

-- name: inbox_handled
-- A replayed dead letter whose message the broker delivered again after the inbox row expired
-- (handled); an earlier failure of its key still there (waiting: per-key order, as
-- inbox_failure_lock on the other databases; one another instance is re-driving is there
-- until it commits).
SELECT EXISTS (SELECT 1 FROM {inbox} i
               WHERE i.consumer = %(consumer)s AND i.message_id = %(id)s
                 AND i.expires_at IS NOT NULL) AS handled,
       EXISTS (SELECT 1 FROM {inbox_failures} f JOIN {inbox_failures} h
                 ON h.consumer = f.consumer AND h.`key` = f.`key`
               WHERE f.consumer = %(consumer)s AND f.message_id = %(id)s
                 AND h.state = 'retrying' AND h.seq < f.seq) AS waiting

-- name: inbox_forget
-- The inbox rows of messages never handled, after a handler ended the inbox's transaction
-- (a commit had committed them with it): their redelivery must not be taken for duplicates.
-- asyncmy writes the tuple of ids as a parenthesized list.
DELETE FROM {inbox} WHERE consumer = %(consumer)s AND message_id IN %(ids)s

-- name: inbox_failure_delete
DELETE FROM {inbox_failures} WHERE seq = %(seq)s

-- name: inbox_failure_retry
UPDATE {inbox_failures}
SET attempts = %(attempts)s, last_error = %(reason)s,
    next_attempt_at = UTC_TIMESTAMP(6) + INTERVAL %(retry_us)s MICROSECOND
WHERE seq = %(seq)s

-- name: inbox_failure_dead
UPDATE {inbox_failures}
SET attempts = %(attempts)s, last_error = %(reason)s, state = 'dead',
    next_attempt_at = UTC_TIMESTAMP(6)
WHERE seq = %(seq)s

-- name: inbox_count_retries
UPDATE {sweeps} SET consume_retried_since_sweep = consume_retried_since_sweep + %(count)s
WHERE name = 'default'

-- name: replay_consume_dead_letters
-- Replaying consume dead letters (ids) re-drives each message to the consumer(s) that gave up
-- on it: their failure rows become due again with attempts reset, and their inbox rows get no
-- expiry while they wait (see inbox_set_retrying). The message is not published again, so
-- other consumers of the topic see nothing. The store deletes the dead letters after this.
UPDATE {inbox_failures} f
LEFT JOIN {inbox} i ON i.consumer = f.consumer AND i.message_id = f.message_id
SET f.state = 'retrying', f.attempts = 0, f.next_attempt_at = UTC_TIMESTAMP(6),
    f.last_error = CONCAT('replayed: ', COALESCE(f.last_error, '')),
    i.expires_at = NULL
WHERE f.message_id IN %(ids)s AND f.state = 'dead'

-- name: inbox_purge
-- Inbox rows past their retention, a batch at a time (the sweep repeats it).
DELETE FROM {inbox}
WHERE expires_at < UTC_TIMESTAMP(6)
ORDER BY expires_at
LIMIT %(batch)s

-- name: inbox_forget_dead
-- Failure rows of consume dead letters that were purged (by an operator or the retention):
-- nothing can replay them any more.
DELETE FROM {inbox_failures}
WHERE state = 'dead' AND NOT EXISTS (
    SELECT 1 FROM {dead_letters} d
    WHERE d.id = {inbox_failures}.message_id AND d.direction = 'consume')
LIMIT %(batch)s
