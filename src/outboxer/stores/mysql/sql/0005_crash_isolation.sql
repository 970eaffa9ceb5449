-- outboxer schema version 5: crash isolation. See the PostgreSQL migration of the same name: a
-- message whose lease expired is a suspect, claimed alone; a relay dying while it held one alone
-- is a solo death, and after --max-solo-deaths of them the message is dead-lettered. Claims do
-- not change lease_expiries, so the index costs them nothing.
ALTER TABLE {outbox}
    ADD COLUMN lease_expiries INT NOT NULL DEFAULT 0,
    ADD COLUMN solo_deaths INT NOT NULL DEFAULT 0,
    ADD COLUMN locked_alone BOOLEAN NOT NULL DEFAULT FALSE,
    ADD KEY `{t}_suspects` (lease_expiries, seq);
