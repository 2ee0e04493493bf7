-- The due index per channel (issue 19: the console overview at 2.4 M deliveries with 1 M
-- pending took 796 ms, most of it one pass over the old `(next_attempt_at) WHERE pending`
-- index to find each channel's oldest due delivery).
--
-- With the channel leading, "the oldest due pending delivery of channel C" is one probe
-- per channel (the console overview, the backlog gauges), and the sweeper's search for
-- deliveries due long ago with no message is one ordered range scan per channel
-- (notify_store::deliveries::republish_stale). It replaces the old index rather than
-- joining it, so a pending delivery still costs one entry in one due index.
--
-- On a large production table build it first with CREATE INDEX CONCURRENTLY (outside a
-- transaction) under this name; IF NOT EXISTS then makes this migration a no-op for it.
CREATE INDEX IF NOT EXISTS notification_deliveries_channel_due
    ON notification_deliveries (channel, next_attempt_at) WHERE status = 'pending';
DROP INDEX IF EXISTS notification_deliveries_due;
