-- Since this migration's release, the held deliveries that ingest writes in one statement
-- (a group commit of several events, or a fan-out page) share outbox rows by channel,
-- whichever event they belong to, up to NOTIFY_RELAY_DELIVERIES_PER_MESSAGE (50) a row
-- (issue 19). Migration 36's comment says "of the same event"; the column is unchanged,
-- only what it may hold, so this records it where a reader of the schema looks.
COMMENT ON COLUMN outbox.more_delivery_ids IS
    'The deliveries the row names after delivery_id, all of its channel, of one event or of '
    'several written in one statement; NULL when the row names delivery_id alone. The relay '
    'publishes them in version-2 batch messages (notify_broker::DeliveryBatch).';
