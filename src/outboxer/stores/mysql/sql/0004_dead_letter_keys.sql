-- outboxer schema version 4: find a key's dead letters fast, for relays that keep a key on
-- hold while its dead letter waits for an operator (--hold-keys-after-dead-letter).
ALTER TABLE {dead_letters} ADD KEY `{t}_dead_letters_key` (`key`, direction);
