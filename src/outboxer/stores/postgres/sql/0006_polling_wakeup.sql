-- outboxer schema version 6 (PostgreSQL): no NOTIFY doorbell (docs/adr/0007-polling-wakeup.md).
-- PostgreSQL serializes the commits of all transactions that issued a NOTIFY (one global lock
-- on the notification queue, held until the commit is flushed), so the trigger of version 1 made
-- every writing application queue its commits behind one another: with enqueue, writes stopped
-- scaling at 4 connections. Relays now poll adaptively instead (a short wait while work was
-- recent, at most --poll-interval when idle), which costs the writers nothing.
-- On a live outbox: DROP TRIGGER briefly takes the table's ACCESS EXCLUSIVE lock, so it waits for
-- the writing transactions running at that moment (and new ones wait behind it).
DROP TRIGGER IF EXISTS "{t}_notify" ON {outbox};
DROP FUNCTION IF EXISTS {notify_fn}();
