-- The sweeper republishes a pending delivery that has been due for a while with no outbox
-- row (its message was lost, or still waits in a long queue). republish_count spaces those
-- republishes out (NOTIFY_REPUBLISH_AFTER, then twice that, four times ... up to a day),
-- so a backlog that merely sits in the queue gains a bounded number of duplicates; a claim
-- resets it.
ALTER TABLE notification_deliveries ADD COLUMN republish_count integer NOT NULL DEFAULT 0;
