-- outboxer schema version 4: find a key's dead letters fast, for relays that keep a key on
-- hold while its dead letter waits for an operator (--hold-keys-after-dead-letter).
CREATE INDEX "{t}_dead_letters_key" ON {dead_letters} (key) WHERE key IS NOT NULL;
