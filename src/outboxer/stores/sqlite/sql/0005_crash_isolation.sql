-- outboxer schema version 5 (SQLite): crash isolation. See the PostgreSQL migration of the same
-- name: a message whose lease expired is a suspect, claimed alone; a relay dying while it held
-- one alone is a solo death, and after --max-solo-deaths of them the message is dead-lettered.
ALTER TABLE {outbox} ADD COLUMN lease_expiries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {outbox} ADD COLUMN solo_deaths INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {outbox} ADD COLUMN locked_alone INTEGER NOT NULL DEFAULT 0;
CREATE INDEX "{t}_suspects" ON {outbox} (seq) WHERE lease_expiries > 0;
