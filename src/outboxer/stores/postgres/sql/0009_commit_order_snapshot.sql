-- outboxer schema version 9 (PostgreSQL): the commit-order gate also waits for younger writers.
-- A transaction gets its xid at its first write, so one that began writing after another (a
-- younger xid) could enqueue a key's message before it and still be running when the other's
-- later message of that key passed the gate (only older xids were waited for): published
-- [2, 1] (docs/guarantees.md). The column keeps its name; its value is now the larger of the
-- writer's xid and its statement snapshot's xmax (one past the latest xid to complete before
-- the statement began), and the ordered claim takes a row once no xid below it still runs
-- (`txid <= pg_snapshot_xmin(...)`; for a row of before, holding its writer's xid, that is the
-- test of before: the writer has ended when its row is seen). So a row also waits for every
-- writer older than a transaction that had completed by then. That narrows the gap, it does not
-- close it (a writer younger than every completed transaction still escapes; about 1 in 4 of
-- the overtaken messages of before are left in a stress: benchmarks/commit_order.py). Only the
-- default changes: no table rewrite, but ALTER TABLE waits for the open writers of the outbox
-- and holds the new ones behind it (docs/operations.md).
ALTER TABLE {outbox} ALTER COLUMN txid
    SET DEFAULT greatest(pg_current_xact_id(), pg_snapshot_xmax(pg_current_snapshot()));
