-- outboxer schema version 8 (MySQL, MariaDB): an id may have a publish and a consume dead
-- letter. A service that consumes what it publishes can fail on one id both ways (ids may be
-- reused, and a publish whose acknowledgement was lost did reach the broker). With one dead
-- letter per id the second was dropped or replaced the first, and a consume failure left
-- without its dead letter was forgotten by the sweep. Now each direction keeps its own.
ALTER TABLE {dead_letters}
    ADD UNIQUE KEY `{t}_dead_letters_unique` (id, direction),
    DROP INDEX `{t}_dead_letters_id`;
