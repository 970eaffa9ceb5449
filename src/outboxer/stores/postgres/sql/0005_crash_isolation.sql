-- outboxer schema version 5 (PostgreSQL): crash isolation.
-- A message whose publish kills the relay process (segfault, OOM, os._exit) never gets a
-- result, so it never counts an attempt: every relay that takes it dies, forever. So a message
-- whose lease expired is a suspect: it is claimed alone (claim_* "suspect"), and when its lease
-- expires again while it was alone, that is a solo death. After --max-solo-deaths of them the
-- relay dead-letters it instead of publishing it. Messages of a batch that died together only
-- become suspects: a random kill under load never counts against a healthy message.
-- Constant defaults: the columns are added without rewriting the table.
ALTER TABLE {outbox} ADD COLUMN lease_expiries integer NOT NULL DEFAULT 0;
ALTER TABLE {outbox} ADD COLUMN solo_deaths integer NOT NULL DEFAULT 0;
ALTER TABLE {outbox} ADD COLUMN locked_alone boolean NOT NULL DEFAULT false;
-- Claims look for a suspect first: this index is empty unless a relay died. Claims do not change
-- lease_expiries, so they stay HOT updates (see the fillfactor note in 0001).
CREATE INDEX "{t}_suspects" ON {outbox} (seq) WHERE lease_expiries > 0;
