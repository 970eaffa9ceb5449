-- Named queries of the PostgreSQL store. "-- name: x" starts query x.

-- The write side's INSERT belongs to its writers (outboxer/writers/), one per driver family.

-- name: claim_unordered
-- One statement claims a whole batch. SKIP LOCKED lets concurrent relays claim disjoint
-- batches without waiting on each other.
-- The rows are updated by ctid: they are locked by this statement, so their ctid cannot
-- change, and a TID scan avoids the hash join over the whole table a join on id plans.
-- Crash isolation (0005): a suspect (a message whose lease expired) is claimed alone, before
-- anything else; the probe of the partial index "{t}_suspects" costs nothing when there is none.
WITH suspect AS MATERIALIZED (
    SELECT ctid FROM {outbox}
    WHERE lease_expiries > 0 AND claim_token IS NULL AND available_at <= now()
    ORDER BY seq
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), candidates AS (
    SELECT ctid FROM {outbox}
    WHERE claim_token IS NULL AND available_at <= now() AND lease_expiries = 0
      AND NOT EXISTS (SELECT 1 FROM suspect)
    ORDER BY seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {outbox} AS o
SET claim_token = $2, locked_by = $3, locked_until = now() + make_interval(secs => $4),
    locked_alone = o.lease_expiries > 0
WHERE o.ctid = ANY(ARRAY(SELECT ctid FROM suspect UNION ALL SELECT ctid FROM candidates))
RETURNING o.id, o.seq, o.topic, o.key, o.type, o.payload, o.content_type, o.headers::text,
          o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths

-- name: claim_ordered
-- Per-key order with any number of relays. A keyed row may be claimed only when every older
-- row of its key is either gone (published/dead-lettered) or claimed in this same statement;
-- the relay then publishes a key's run in write order (Relay._publish_runs, or in waves).
-- A row is claimable when it is neither leased nor waiting (available_at), is no suspect, has
-- passed the commit-order gate (no xid below txid still runs: the writer's xid or, when larger,
-- its statement's snapshot's xmax, 0009) and, if the relay asks so, its key has no publish dead
-- letter.
--  1. Candidates are claimable rows whose key's head (its oldest row) is neither leased nor
--     waiting for a retry or a delayed time. Rows behind a blocked head are skipped, so a
--     failing message never holds back other keys. (Leased and retrying rows are always a
--     prefix of their key: runs are claimed from the head and a failure releases the rest of
--     its run.)
--  2. SKIP LOCKED leaves out rows another relay is claiming at this moment, and a delayed row
--     may sit in the middle of a key. So a candidate is kept only if the number of rows of its
--     key up to it equals its rank among our candidates of that key: no gap before it. (A
--     suspect is such a gap too: it is never a candidate.)
-- Where candidates are looked for (issue 14, docs/adr/0010 and 0011): a walk of the seq index
-- skips the rows behind a blocked head one by one, so with every key blocked it read the whole
-- backlog to find nothing (8 s on 1,000,000 rows). So:
--  a. front: the oldest rows, read without locks: at most 2 x $1 rows not leased under $6, in
--     the $7 values of seq from the oldest row ("edge": where the front ends). A key's head is
--     in the front when any of its rows is, so the front alone decides 1 and 2 for its rows,
--     with no probe per row or per key: a keyed row is eligible when it is claimable and every
--     row of its key before it in the front is too ("blocked": the first row of each key that
--     is not). The eligible rows are then locked oldest first, SKIP LOCKED, $1 at most, and a
--     locked row is kept only if no eligible row of its key before it was skipped ("missed").
--     Usually this fills the batch and nothing below runs (each of b-e waits on "short").
--  b. keys: otherwise each key's head, by a skip scan of the (key, seq) index (a recursive
--     CTE: one probe per key, never a walk over a key's rows), $8 keys at most; heads: each
--     key's first row not leased under $6 and whether it is claimable.
--  c. keyed: behind the front, the runs of the oldest claimable heads (a run that began in the
--     front goes on), each looked for through the (key, seq) index in the $1 values of seq from
--     its head, or from the front's end for a head in the front.
--  d. unkeyed: behind the front, the oldest claimable unkeyed rows ("{t}_unkeyed", 0007).
--  e. rest: with $8 keys or more, the walk goes on behind the front as before 0010. (With that
--     many keys claimable rows lie soon behind the front, unless thousands of keys are
--     blocked.) It passes the rows of the keys blocked in the front without a look at their
--     heads (their older row there fails 2. anyway), and probes each other key's head once
--     (Memoize caches the LATERAL probe by key): one blocked key's long run costs the walk over
--     its rows (about 1 us a row), not a head probe a row (15 us; docs/adr/0010).
-- b-e only narrow where candidates come from: 1 and 2 hold for all of them together (their
-- rows are kept by 2's count, in which the front's locked rows take part).
-- Crash isolation (0005): a suspect that heads its key is claimed alone, before anything else.
-- Rows leased under a token of $6 (behind: this relay's batches in flight, ADR 0008) neither
-- block their key's head nor count in 2.: the relay claims the next rows of keys it is
-- publishing itself, publishes them after the earlier ones and releases them if an earlier one
-- failed. Rows leased under any other token still break the count.
WITH RECURSIVE suspect AS MATERIALIZED (
    SELECT o.ctid FROM {outbox} o
    WHERE o.lease_expiries > 0 AND o.claim_token IS NULL AND o.available_at <= now()
      AND (NOT $5::bool OR o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {dead_letters} d WHERE d.key = o.key AND d.direction = 'publish'))
      AND (o.key IS NULL OR NOT EXISTS (
            SELECT 1 FROM {outbox} h WHERE h.key = o.key AND h.seq < o.seq))
    ORDER BY o.seq
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), bounds AS MATERIALIZED (
    SELECT min(f.seq) + $7 AS front_end, pg_snapshot_xmin(pg_current_snapshot()) AS gate
    FROM {outbox} f
), walk AS MATERIALIZED (
    -- a.: the front as this statement's snapshot shows it (no locks yet)
    SELECT o.key, o.seq,
           o.claim_token IS NULL AND o.available_at <= now() AND o.lease_expiries = 0
           AND (o.txid IS NULL OR o.txid <= (SELECT gate FROM bounds))
           AND (NOT $5::bool OR o.key IS NULL OR NOT EXISTS (
                 SELECT 1 FROM {dead_letters} d WHERE d.key = o.key AND d.direction = 'publish'))
           AS claimable, o.ctid
    FROM {outbox} o
    WHERE o.seq <= (SELECT front_end FROM bounds) AND NOT EXISTS (SELECT 1 FROM suspect)
      AND (o.claim_token IS NULL OR o.claim_token <> ALL($6::bigint[]))
    ORDER BY o.seq
    LIMIT 2 * $1
), edge AS MATERIALIZED (
    -- where the front ends: b-e look only behind it
    SELECT CASE WHEN count(*) = 2 * $1 THEN max(seq) ELSE (SELECT front_end FROM bounds) END
           AS front_end
    FROM walk
), blocked AS MATERIALIZED (
    -- each key's first row in the front that is not claimable (a head leased by another relay
    -- or waiting, a delayed or suspect row in the middle, a row behind the gate)
    SELECT key, min(seq) AS seq FROM walk WHERE NOT claimable AND key IS NOT NULL GROUP BY key
), eligible AS MATERIALIZED (
    SELECT w.ctid, w.key, w.seq FROM walk w
    WHERE w.claimable
      AND NOT EXISTS (SELECT 1 FROM blocked b WHERE b.key = w.key AND b.seq < w.seq)
), front AS MATERIALIZED (
    -- locked one by one (a TID probe each), oldest first, until $1 are; the quals are checked
    -- again on the row's newest version when another relay changed it since the snapshot
    SELECT l.ctid, e.key, e.seq
    FROM (SELECT ctid, key, seq FROM eligible ORDER BY seq) e
    CROSS JOIN LATERAL (
        SELECT o.ctid FROM {outbox} o
        WHERE o.ctid = e.ctid
          AND o.claim_token IS NULL AND o.available_at <= now() AND o.lease_expiries = 0
        FOR UPDATE SKIP LOCKED) l
    LIMIT $1
), missed AS MATERIALIZED (
    -- eligible rows the locks skipped (another relay is claiming them): a gap in their key
    SELECT e.key, min(e.seq) AS seq FROM eligible e
    WHERE e.key IS NOT NULL AND e.seq < (SELECT max(seq) FROM front)
      AND NOT EXISTS (SELECT 1 FROM front f WHERE f.seq = e.seq)
    GROUP BY e.key
), front_kept AS (
    SELECT f.ctid, f.seq FROM front f
    WHERE NOT EXISTS (SELECT 1 FROM missed m WHERE m.key = f.key AND m.seq < f.seq)
), short AS MATERIALIZED (
    -- what the batch still lacks after the front (0 when there is a suspect)
    SELECT CASE WHEN EXISTS (SELECT 1 FROM suspect) THEN 0 ELSE $1 - count(*) END AS n
    FROM front
), keys AS (
    (SELECT o.key, o.seq, o.claim_token, o.available_at, o.lease_expiries, o.txid, 1 AS n
     FROM {outbox} o
     WHERE o.key IS NOT NULL AND (SELECT n FROM short) > 0
     ORDER BY o.key, o.seq LIMIT 1)
    UNION ALL
    SELECT next.*, k.n + 1 FROM keys k
    CROSS JOIN LATERAL (
        SELECT o.key, o.seq, o.claim_token, o.available_at, o.lease_expiries, o.txid
        FROM {outbox} o WHERE o.key > k.key ORDER BY o.key, o.seq LIMIT 1) next
    WHERE k.n < $8
), heads AS MATERIALIZED (
    SELECT k.key, e.seq,
           e.claim_token IS NULL AND e.available_at <= now() AND e.lease_expiries = 0
           AND (e.txid IS NULL OR e.txid <= (SELECT gate FROM bounds))
           AND (NOT $5::bool OR NOT EXISTS (
                 SELECT 1 FROM {dead_letters} d WHERE d.key = k.key AND d.direction = 'publish'))
           AS free
    FROM keys k
    CROSS JOIN LATERAL (
        -- the head, or, when this relay's own batches in flight lead the key, the first row
        -- after them
        SELECT k.seq, k.claim_token, k.available_at, k.lease_expiries, k.txid
        WHERE k.claim_token IS NULL OR k.claim_token <> ALL($6::bigint[])
        UNION ALL
        (SELECT e.seq, e.claim_token, e.available_at, e.lease_expiries, e.txid FROM {outbox} e
         WHERE k.claim_token = ANY($6::bigint[]) AND e.key = k.key AND e.seq > k.seq
           AND (e.claim_token IS NULL OR e.claim_token <> ALL($6::bigint[]))
         ORDER BY e.seq LIMIT 1)) e
), few_keys AS MATERIALIZED (
    SELECT count(*) < $8 AS yes FROM keys
), keyed AS MATERIALIZED (
    SELECT o.ctid, o.key, o.seq
    FROM (SELECT h.key, h.seq FROM heads h
          WHERE h.free AND (SELECT yes FROM few_keys) AND (SELECT n FROM short) > 0
          ORDER BY h.seq LIMIT $1) h
    JOIN {outbox} o ON o.key = h.key
     AND o.seq BETWEEN h.seq AND greatest(h.seq, (SELECT front_end FROM edge)) + $1
    WHERE o.seq > (SELECT front_end FROM edge)
      AND o.claim_token IS NULL AND o.available_at <= now() AND o.lease_expiries = 0
      AND (o.txid IS NULL OR o.txid <= (SELECT gate FROM bounds))
    ORDER BY o.seq
    LIMIT (SELECT n FROM short)
    FOR UPDATE OF o SKIP LOCKED
), unkeyed AS MATERIALIZED (
    SELECT o.ctid, o.key, o.seq FROM {outbox} o
    WHERE o.key IS NULL AND o.seq > (SELECT front_end FROM edge)
      AND (SELECT n FROM short) > 0 AND (SELECT yes FROM few_keys)
      AND o.claim_token IS NULL AND o.available_at <= now() AND o.lease_expiries = 0
      AND (o.txid IS NULL OR o.txid <= (SELECT gate FROM bounds))
    ORDER BY o.seq
    LIMIT (SELECT n FROM short)
    FOR UPDATE SKIP LOCKED
), rest AS MATERIALIZED (
    -- the head: probed once per key (a Memoize node caches it by key), never for the keys
    -- blocked in the front (a hashed NOT IN, applied by the scan before the join)
    SELECT o.ctid, o.key, o.seq FROM {outbox} o
    LEFT JOIN LATERAL (
        SELECT (h.claim_token IS NOT NULL AND h.claim_token <> ALL($6::bigint[]))
               OR h.available_at > now()
               OR ($5::bool AND EXISTS (SELECT 1 FROM {dead_letters} d
                                       WHERE d.key = h.key AND d.direction = 'publish'))
               AS blocked
        FROM {outbox} h WHERE h.key = o.key ORDER BY h.seq LIMIT 1) head ON true
    WHERE o.seq > (SELECT front_end FROM edge)
      AND (SELECT n FROM short) > 0 AND NOT (SELECT yes FROM few_keys)
      AND o.claim_token IS NULL AND o.available_at <= now() AND o.lease_expiries = 0
      AND (o.txid IS NULL OR o.txid <= (SELECT gate FROM bounds))
      AND (o.key IS NULL OR o.key NOT IN (SELECT key FROM blocked))
      AND (o.key IS NULL OR NOT head.blocked)
    ORDER BY o.seq
    LIMIT (SELECT n FROM short)
    FOR UPDATE OF o SKIP LOCKED
), others AS (
    SELECT ctid, key, seq FROM keyed
    UNION ALL SELECT ctid, key, seq FROM unkeyed
    UNION ALL SELECT ctid, key, seq FROM rest
), ranked AS (
    -- 2. for the rows behind the front, ranked among all of this claim's rows of their key
    SELECT ctid, key, seq, past_front,
           row_number() OVER (PARTITION BY key ORDER BY seq) AS rank
    FROM (SELECT ctid, key, seq, false AS past_front FROM front
          WHERE key IS NOT NULL AND (SELECT n FROM short) > 0
          UNION ALL
          SELECT ctid, key, seq, true FROM others WHERE key IS NOT NULL) c
), kept AS (
    SELECT ctid, seq FROM front_kept
    UNION ALL
    SELECT ctid, seq FROM others WHERE key IS NULL
    UNION ALL
    SELECT r.ctid, r.seq FROM ranked r
    WHERE r.past_front
      AND (SELECT count(*) FROM {outbox} k
           WHERE k.key = r.key AND k.seq <= r.seq
             AND (k.claim_token IS NULL OR k.claim_token <> ALL($6::bigint[]))) = r.rank
)
UPDATE {outbox} AS o
SET claim_token = $2, locked_by = $3, locked_until = now() + make_interval(secs => $4),
    locked_alone = o.lease_expiries > 0
WHERE o.ctid = ANY(ARRAY(
    SELECT ctid FROM suspect
    UNION ALL
    -- the oldest $1: the front's rows all (it has at most $1), then the oldest of the rest. A
    -- key's kept rows are a run from its head, so cutting the newest keeps every key's a run.
    (SELECT ctid FROM kept ORDER BY seq LIMIT $1)))
RETURNING o.id, o.seq, o.topic, o.key, o.type, o.payload, o.content_type, o.headers::text,
          o.created_at, o.available_at, o.attempts, o.lease_expiries, o.solo_deaths

-- name: outbox_size
-- Before a claim that follows a short one: has the table grown since its plans were made?
-- (PlanWatch, stores/postgres/connection.py)
SELECT pg_relation_size('{outbox}'::regclass)

-- name: ack
DELETE FROM {outbox} WHERE id = ANY($1::text[]) AND claim_token = $2

-- name: retry
-- The retries are counted for the next sweep's publish_retries in the same statement (no round
-- trip of its own). The counter row is locked only by batches with a retry, for the length of
-- this statement: relays that publish successfully never touch it.
WITH retried AS (
    UPDATE {outbox} AS o
    SET attempts = o.attempts + 1, last_error = u.reason,
        available_at = now() + make_interval(secs => u.delay),
        claim_token = NULL, locked_by = NULL, locked_until = NULL
    FROM unnest($1::text[], $2::float8[], $3::text[]) AS u(id, delay, reason)
    WHERE o.id = u.id AND o.claim_token = $4
    RETURNING 1
)
UPDATE {sweeps} SET released_since_sweep = released_since_sweep + (SELECT count(*) FROM retried)
WHERE name = 'default' AND EXISTS (SELECT 1 FROM retried)

-- name: extend_lease
-- A relay keeps the lease of a batch it is still publishing (a slow broker or webhook). By id
-- (the primary key) rather than by claim_token, which no index covers; locked_until is in no
-- index either, so this is a HOT update.
UPDATE {outbox} SET locked_until = now() + make_interval(secs => $3)
WHERE id = ANY($1::text[]) AND claim_token = $2

-- name: release
UPDATE {outbox}
SET claim_token = NULL, locked_by = NULL, locked_until = NULL
WHERE id = ANY($1::text[]) AND claim_token = $2

-- name: dead_letter
-- Moves rows in one statement: the DELETE and the INSERT commit or fail together.
-- Ids may be reused (docs/guarantees.md): a message whose id already has a publish dead letter
-- replaces it, as the newest (a fresh dl_seq); a consume dead letter of the id stays (0008). A
-- plain INSERT would fail on the unique key and with it the settle of the whole batch, forever.
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
ON CONFLICT (id, direction) DO UPDATE
    SET dl_seq = DEFAULT, topic = EXCLUDED.topic, key = EXCLUDED.key, type = EXCLUDED.type,
        payload = EXCLUDED.payload, content_type = EXCLUDED.content_type,
        headers = EXCLUDED.headers, created_at = EXCLUDED.created_at,
        dead_lettered_at = now(), failure_reason = EXCLUDED.failure_reason,
        attempts = EXCLUDED.attempts

-- name: release_expired
-- No index covers claim_token (see the fillfactor note in the schema): this scans the table,
-- which is why the sweeper runs it only every half lease. The count is kept for the next sweep.
-- Each message taken back becomes a suspect (claimed alone from now on); one that was alone
-- when its relay died counts a solo death (crash isolation, 0005).
WITH released AS (
    UPDATE {outbox}
    SET claim_token = NULL, locked_by = NULL, locked_until = NULL,
        lease_expiries = lease_expiries + 1,
        solo_deaths = solo_deaths + CASE WHEN locked_alone THEN 1 ELSE 0 END,
        locked_alone = false,
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
), gone AS (
    -- relays silent for a day (killed, their host gone): their rows would only pile up
    DELETE FROM {relays} WHERE heartbeat_at < now() - interval '1 day'
), previous AS (
    SELECT COALESCE(started_at, '-infinity'::timestamptz) AS since
    FROM {sweeps} WHERE name = 'default'
)
UPDATE {sweeps} s
SET started_at = now(), completed_at = clock_timestamp(), swept_by = $1,
    -- released_since_sweep counts expired leases and the relays' retries (settle): the
    -- publish retries since the previous sweep (the column kept its first name).
    publish_retries = s.released_since_sweep, released_since_sweep = 0,
    publish_failures = (SELECT count(*) FROM {dead_letters} d, previous p
                        WHERE d.direction = 'publish' AND d.dead_lettered_at >= p.since),
    -- re-drives of failed consumptions counted by the consumers since the last sweep
    consume_retries = s.consume_retried_since_sweep, consume_retried_since_sweep = 0,
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
    -- written for later and never tried: what a drain leaves for a later run
    (SELECT count(*) FROM {outbox}
     WHERE claim_token IS NULL AND attempts = 0 AND available_at > now()) AS scheduled,
    -- pending, not scheduled, behind a scheduled message of their key: an ordered relay
    -- publishes them after it (a drain leaves them too; one probe per scheduled key)
    (SELECT count(*) FROM (
        SELECT key, min(seq) AS seq FROM {outbox}
        WHERE key IS NOT NULL AND claim_token IS NULL AND attempts = 0 AND available_at > now()
        GROUP BY key) s
     JOIN {outbox} o ON o.key = s.key AND o.seq > s.seq
     WHERE o.claim_token IS NULL AND NOT (o.attempts = 0 AND o.available_at > now()))
        AS behind_scheduled,
    (SELECT count(*) FROM {dead_letters}) AS dead_letters,
    (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM {outbox}) AS oldest_age,
    -- in flight for a relay with no live heartbeat: waiting for its lease to expire
    (SELECT count(*) FROM {outbox} o
     WHERE o.claim_token IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM {relays} r
        WHERE r.relay_id = o.locked_by
          AND r.heartbeat_at > now() - make_interval(secs => $1))) AS unowned

-- name: consume_failures
-- The inbox's side of stats: per consumer, its failures still to re-drive. Retrying: the
-- handlers failed (attempts >= 1). Waiting: stored and not tried since (attempts 0): behind an
-- earlier failure of its key, or a replayed consume dead letter before its re-drive. 'dead'
-- rows are dead letters, counted there. It runs at every dashboard poll and scrape: the table
-- holds only failures (normally a handful of rows), and once many dead rows pile up the
-- partial index of the retrying ones (inbox_failures_due, 0003_inbox.sql) leaves them out.
SELECT consumer,
       count(*) FILTER (WHERE attempts > 0) AS retrying,
       count(*) FILTER (WHERE attempts = 0) AS waiting,
       extract(epoch FROM now() - min(failed_at))::float8 AS oldest_age
FROM {inbox_failures}
WHERE state = 'retrying'
GROUP BY consumer

-- name: live_relays
-- A relay is live while its heartbeat is younger than $1 seconds; dead ones are pruned here.
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
WHERE r.heartbeat_at > now() - make_interval(secs => $1)
ORDER BY r.started_at

-- name: known_dead_letter_ids
SELECT id FROM {dead_letters} WHERE id = ANY($1::text[])

-- name: known_message_ids
SELECT id FROM {outbox} WHERE id = ANY($1::text[])

-- name: list_dead_letters
-- A page ends after $6 rows, or earlier once the payloads before a row reach $7 bytes
-- (outboxer.ports.PAGE_PAYLOAD_BYTES): a list never carries an unbounded sum of payloads into
-- the process. The candidates are the usual walk of the dl_seq index with its LIMIT, reading
-- only the payloads' sizes (octet_length of a TOASTed value reads its header, not the value);
-- the running sums over those at most $6 small rows decide which rows are in the page, and only
-- those rows' payloads are fetched, by primary key. The first candidate is always in the page
-- (nothing before it), so a single payload over the budget still comes back alone. One row
-- past the page comes back too, without its payload (in_page false): it says there is a next
-- page, as the row past $6 - 1 does.
SELECT c.dl_seq, d.id, d.topic, d.key, d.type,
       CASE WHEN c.in_page THEN d.payload END AS payload, d.content_type, d.headers::text,
       d.created_at, d.dead_lettered_at, d.failure_reason, d.attempts, d.direction, c.in_page
FROM (
    SELECT dl_seq,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < $7 AS in_page,
           coalesce(sum(size) OVER (ORDER BY dl_seq DESC
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < $7 AS listed
    FROM (
        SELECT dl_seq, octet_length(payload) AS size
        FROM {dead_letters}
        WHERE ($1::text IS NULL OR topic = $1)
          AND ($2::text IS NULL OR type = $2)
          AND ($3::text IS NULL OR key = $3)
          AND ($4::text[] IS NULL OR id = ANY($4))
          AND ($5::bigint IS NULL OR dl_seq < $5)
          AND ($8::text IS NULL OR direction = $8)
        ORDER BY dl_seq DESC
        LIMIT $6
    ) candidates
) c
JOIN {dead_letters} d ON d.dl_seq = c.dl_seq
WHERE c.listed
ORDER BY c.dl_seq DESC

-- name: replay_dead_letters
-- Back to the outbox with the same id (consumers can still dedupe) and attempts reset. A dead
-- letter whose id is in the outbox again (written anew by the application) stays put.
WITH moved AS (
    DELETE FROM {dead_letters} d
    WHERE ($1::text IS NULL OR topic = $1)
      AND ($2::text IS NULL OR type = $2)
      AND ($3::text IS NULL OR key = $3)
      AND ($4::text[] IS NULL OR id = ANY($4))
      AND ($5::text IS NULL OR direction = $5)
      AND direction = 'publish'
      AND NOT EXISTS (SELECT 1 FROM {outbox} o WHERE o.id = d.id)
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
  AND ($5::text IS NULL OR direction = $5)
RETURNING id

-- name: list_messages
-- The backlog as operators see it (outboxer messages, GET /api/messages), oldest first.
-- {filters} becomes fixed conditions for the filters given ("AND o.key = $5" ...; never a
-- value), so each combination gets its own plan: with a key, the (key, seq) index; otherwise
-- a walk of the seq index from the cursor that stops at $2 matching rows, never a scan of the
-- whole backlog. The state is judged in the order of outboxer.ports.MessageState; "held" asks
-- the dead letters' key index. The walk reads only the payloads' sizes; a page ends early once
-- the payloads before a row reach $4 bytes, and only the page's payloads are fetched, by seq
-- (see list_dead_letters: the same budget, the same row past the page without its payload).
SELECT c.*, CASE WHEN c.in_page THEN p.payload END AS payload
FROM (
    SELECT w.*,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) < $4 AS in_page,
           coalesce(sum(w.size) OVER (ORDER BY w.seq
               ROWS BETWEEN UNBOUNDED PRECEDING AND 2 PRECEDING), 0) < $4 AS listed
    FROM (
        SELECT m.* FROM (
            SELECT o.seq, o.id, o.topic, o.key, o.type, octet_length(o.payload) AS size,
                   o.content_type, o.headers::text, o.created_at, o.available_at, o.attempts,
                   o.last_error, o.locked_by, o.locked_until,
                   CASE
                       WHEN o.claim_token IS NOT NULL THEN 'in_flight'
                       WHEN o.key IS NOT NULL AND EXISTS (
                           SELECT 1 FROM {dead_letters} d
                           WHERE d.key = o.key AND d.direction = 'publish') THEN 'held'
                       WHEN o.available_at > now() AND o.attempts > 0 THEN 'retrying'
                       WHEN o.available_at > now() THEN 'scheduled'
                       ELSE 'pending'
                   END AS state
            FROM {outbox} o
            WHERE o.seq > $1 {filters}
        ) m
        WHERE ($3::text IS NULL OR m.state = $3)
        ORDER BY m.seq
        LIMIT $2
    ) w
) c
JOIN {outbox} p ON p.seq = c.seq
WHERE c.listed
ORDER BY c.seq

-- ---------------------------------------------------------------------------------------------
-- Inbox (consumers). See docs/inbox.md and 0003_inbox.sql.

-- name: inbox_receive
-- The first statement of a batch's transaction: records (consumer, id) of every message ($2,
-- distinct ids; $3 their keys) unless it is there already. A message whose key has an earlier
-- message still failing for this consumer waits behind it ("blocked"): its row gets no expiry,
-- like any message that has a failure row. A concurrent transaction holding one of the pairs
-- makes this one wait for its outcome, so duplicates never run side by side; inserting in id
-- order means two overlapping batches lock their rows in the same order and cannot deadlock
-- on them. One row answers: how many were inserted, the blocked ones, and the inserted ids
-- only when some were not (duplicates are rare): a row per message cost the client ≈ 2 µs a
-- message to decode and map, for the same work on the server. The ids and keys come as two JSON
-- arrays of strings (keys may be null), zipped by ROWS FROM: asyncpg encodes a text[] at
-- ≈ 0.35 µs an element on the consumer's event loop, json.dumps the same list ten times faster,
-- and parsing it costs the server no more than reading the array (batches of 100).
WITH inserted AS (
    INSERT INTO {inbox} (consumer, message_id, expires_at)
    SELECT $1, d.message_id,
           CASE WHEN d.key IS NOT NULL AND EXISTS (
                    SELECT 1 FROM {inbox_failures} f
                    WHERE f.consumer = $1 AND f.key = d.key AND f.state = 'retrying')
                THEN NULL ELSE now() + make_interval(secs => $4) END
    FROM ROWS FROM (json_array_elements_text($2::json), json_array_elements_text($3::json))
         AS d(message_id, key)
    ORDER BY d.message_id
    ON CONFLICT (consumer, message_id) DO NOTHING
    RETURNING message_id, expires_at IS NULL AS blocked
)
SELECT count(*)::int AS fresh,
       array_agg(message_id) FILTER (WHERE blocked) AS blocked,
       CASE WHEN count(*) < json_array_length($2::json) THEN array_agg(message_id) END AS inserted
FROM inserted

-- name: inbox_receive_at_begin
-- inbox_receive for a batch that is new, as batches are but after a redelivery: a plain INSERT
-- (no speculative insertion: ≈ 30 % less server CPU a row), run by EXECUTE in the simple
-- protocol together with the transaction's BEGIN and the handlers' first SAVEPOINT (see
-- stores/postgres/inbox.py). That protocol returns no rows, so the statement answers by failing:
-- a message there already breaks the primary key, and a message whose key waits behind a failure
-- fails the cast below on purpose (its text, depending on the row, is never cast at plan time).
-- Either way the session rolls back and runs inbox_receive. A concurrent transaction holding one
-- of the pairs makes it wait for that one's outcome, as inbox_receive does. Same arguments as
-- inbox_receive.
INSERT INTO {inbox} (consumer, message_id, expires_at)
SELECT $1, d.message_id,
       CASE WHEN d.key IS NOT NULL AND EXISTS (
                SELECT 1 FROM {inbox_failures} f
                WHERE f.consumer = $1 AND f.key = d.key AND f.state = 'retrying')
            THEN CAST('outboxer: waits behind a failure of key ' || d.key AS timestamptz)
            ELSE now() + make_interval(secs => $4) END
FROM ROWS FROM (json_array_elements_text($2::json), json_array_elements_text($3::json))
     AS d(message_id, key)
ORDER BY d.message_id

-- name: inbox_failure_insert
-- A failed first delivery ('retrying' after $10 attempts, or 'dead'), or a message waiting
-- behind its key (attempts 0, due at once: it runs as soon as it is the key's earliest). While
-- it is retrying its inbox row must not expire: the pair has to outlive the failure.
WITH failure AS (
    INSERT INTO {inbox_failures} (consumer, message_id, topic, key, type, payload, content_type,
                                  headers, created_at, attempts, next_attempt_at, last_error,
                                  state)
    VALUES ($1, $2, $3, $4, $5, $6, $7, CAST($8 AS jsonb), $9, $10,
            now() + make_interval(secs => $11), $12, $13)
    ON CONFLICT (consumer, message_id) DO NOTHING
)
UPDATE {inbox} SET expires_at = NULL
WHERE consumer = $1 AND message_id = $2 AND $13::text = 'retrying'

-- name: inbox_set_done
-- Handled or given up: the row stays for the retention window, then the sweep purges it.
INSERT INTO {inbox} (consumer, message_id, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (consumer, message_id) DO UPDATE SET expires_at = EXCLUDED.expires_at

-- name: inbox_dead_letter
-- A consumption that failed for good, in the dead-letter table every operator tool reads. The
-- dead letter's id is the message id; when a second consumer gives up on the same message the
-- existing consume dead letter is updated (its failure rows in {inbox_failures} say which
-- consumers gave up, and replay re-drives it to each of them). A publish dead letter of the
-- same id is another row (0008).
INSERT INTO {dead_letters} (id, topic, key, type, payload, content_type, headers, created_at,
                            failure_reason, attempts, direction)
VALUES ($1, $2, $3, $4, $5, $6, CAST($7 AS jsonb), $8, $9, $10, 'consume')
ON CONFLICT (id, direction) DO UPDATE
    SET failure_reason = EXCLUDED.failure_reason, dead_lettered_at = now(),
        attempts = GREATEST({dead_letters}.attempts, EXCLUDED.attempts)

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
    WHERE f.consumer = $1 AND f.state = 'retrying'
    WINDOW w AS (PARTITION BY f.key, CASE WHEN f.key IS NULL THEN f.seq END ORDER BY f.seq)
) r
WHERE r.next_attempt_at <= now() AND r.head_due_at <= now()
ORDER BY r.place, r.next_attempt_at, r.seq
LIMIT $2

-- name: inbox_failure_lock
-- Take one due failure for a re-drive, in the re-drive's transaction, if no earlier failure
-- of its key is left (per-key order). SKIP LOCKED: another instance of the same consumer
-- re-driving it right now keeps it; one re-driving an earlier one of its key holds it back
-- too (that row is still there until it commits). "handled" is true when the
-- inbox row says the message was processed meanwhile (a replayed dead letter whose message the
-- broker had delivered again after the inbox row expired).
SELECT f.seq, f.message_id AS id, f.topic, f.key, f.type, f.payload, f.content_type,
       f.headers::text AS headers, f.created_at, f.created_at AS available_at,
       0 AS attempts, f.attempts AS consume_attempts,
       EXISTS (SELECT 1 FROM {inbox} i
               WHERE i.consumer = f.consumer AND i.message_id = f.message_id
                 AND i.expires_at IS NOT NULL) AS handled
FROM {inbox_failures} f
WHERE f.consumer = $1 AND f.message_id = $2 AND f.state = 'retrying'
  AND f.next_attempt_at <= now()
  AND (f.key IS NULL OR NOT EXISTS (
        SELECT 1 FROM {inbox_failures} h
        WHERE h.consumer = f.consumer AND h.key = f.key AND h.state = 'retrying'
          AND h.seq < f.seq))
FOR UPDATE OF f SKIP LOCKED

-- name: inbox_forget
-- The inbox rows of messages never handled, after a handler ended the inbox's transaction
-- (a commit had committed them with it): their redelivery must not be taken for duplicates.
DELETE FROM {inbox} WHERE consumer = $1 AND message_id = ANY($2::text[])

-- name: inbox_failure_delete
DELETE FROM {inbox_failures} WHERE seq = $1

-- name: inbox_failure_retry
UPDATE {inbox_failures}
SET attempts = $2, next_attempt_at = now() + make_interval(secs => $3), last_error = $4
WHERE seq = $1

-- name: inbox_failure_dead
UPDATE {inbox_failures}
SET attempts = $2, last_error = $3, state = 'dead', next_attempt_at = now()
WHERE seq = $1

-- name: inbox_count_retries
UPDATE {sweeps} SET consume_retried_since_sweep = consume_retried_since_sweep + $1
WHERE name = 'default'

-- name: replay_consume_dead_letters
-- Replaying a consume dead letter re-drives the message to the consumer(s) that gave up on it
-- (their failure rows become due again with attempts reset); it is not published again, so
-- other consumers of the topic see nothing. The dead letter leaves the table.
WITH moved AS (
    DELETE FROM {dead_letters}
    WHERE ($1::text IS NULL OR topic = $1)
      AND ($2::text IS NULL OR type = $2)
      AND ($3::text IS NULL OR key = $3)
      AND ($4::text[] IS NULL OR id = ANY($4))
      AND ($5::text IS NULL OR direction = $5)
      AND direction = 'consume'
    RETURNING id, dl_seq
), revived AS (
    UPDATE {inbox_failures} f
    SET state = 'retrying', attempts = 0, next_attempt_at = now(),
        last_error = 'replayed: ' || COALESCE(f.last_error, '')
    FROM moved m
    WHERE f.message_id = m.id AND f.state = 'dead'
    RETURNING f.consumer, f.message_id
), kept AS (
    -- no expiry while it waits again (see inbox_set_retrying)
    UPDATE {inbox} i SET expires_at = NULL
    FROM revived r
    WHERE i.consumer = r.consumer AND i.message_id = r.message_id
)
SELECT id FROM moved ORDER BY dl_seq

-- name: inbox_purge
-- Inbox rows past their retention, a batch at a time (the sweep repeats it).
DELETE FROM {inbox}
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM {inbox}
    WHERE expires_at < now()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
  AND expires_at < now()

-- name: inbox_sizes
-- Before a chunk of deliveries (at most once a second) and a purge batch: have the inbox's tables
-- grown since their plans were made? (PlanWatch, stores/postgres/connection.py)
SELECT pg_relation_size('{inbox}'::regclass), pg_relation_size('{inbox_failures}'::regclass)

-- name: inbox_forget_dead
-- Failure rows of consume dead letters that were purged (by an operator or the retention):
-- nothing can replay them any more.
DELETE FROM {inbox_failures} WHERE seq IN (
    SELECT f.seq FROM {inbox_failures} f
    WHERE f.state = 'dead' AND NOT EXISTS (
        SELECT 1 FROM {dead_letters} d WHERE d.id = f.message_id AND d.direction = 'consume')
    LIMIT $1)
