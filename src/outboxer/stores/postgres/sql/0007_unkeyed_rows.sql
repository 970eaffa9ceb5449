-- outboxer schema version 7 (PostgreSQL): the unkeyed rows in an index of their own.
-- An ordered claim whose look at the front of the table leaves its batch short finds what lies
-- behind the front without walking the rows of blocked keys (issue 14, docs/adr/0010): the
-- keys' heads from "{t}_key_seq", the unkeyed rows (which that partial index leaves out) from
-- this one. Keyed rows are not in it, so it costs a write only to unkeyed messages (which have
-- no entry in "{t}_key_seq"), and no claim writes it (the columns a claim sets are in no index:
-- claims stay HOT updates, see the fillfactor note in 0001).
-- On a live outbox: CREATE INDEX blocks writes to the table while it reads it (seconds on
-- millions of rows).
CREATE INDEX "{t}_unkeyed" ON {outbox} (seq) WHERE key IS NULL;
