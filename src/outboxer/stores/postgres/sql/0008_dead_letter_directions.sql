-- outboxer schema version 8 (PostgreSQL): an id may have a publish and a consume dead letter.
-- A service that consumes what it publishes can fail on one id both ways (ids may be reused,
-- and a publish whose acknowledgement was lost did reach the broker). With one dead letter per
-- id the second was dropped or replaced the first, and a consume failure left without its dead
-- letter was forgotten by the sweep. Now each direction keeps its own (docs/guarantees.md).
-- On a live outbox: building the new unique index blocks writes to the dead letters while it
-- reads them (a small table as a rule).
ALTER TABLE {dead_letters} ADD CONSTRAINT "{t}_dead_letters_unique" UNIQUE (id, direction);
ALTER TABLE {dead_letters} DROP CONSTRAINT "{t}_dead_letters_id_key";
