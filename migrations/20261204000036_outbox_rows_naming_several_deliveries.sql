-- One outbox row per broker message instead of one per delivery, for the rows a writer
-- hands to its relay (issue 19: a 1,000,000-subscriber fan-out wrote, then deleted,
-- 1,000,000 outbox rows; the relay's DELETE of a 2,000-row page took 85 ms and its claims
-- scanned the dead rows for up to 2 s, so the relay fell behind the fan-out).
--
-- `more_delivery_ids`: the deliveries the row's message names after `delivery_id`, all of
-- the same event and channel (NULL: the row names `delivery_id` alone, as every row
-- written before this migration does). The relay publishes such a row as one version-2
-- batch message (notify_broker::DeliveryBatch), which every worker since version 2 reads.
-- Adding a nullable column with no default rewrites nothing.
ALTER TABLE outbox ADD COLUMN more_delivery_ids uuid[];

-- The stale sweeper (deliveries::lease::republish_stale) looks a delivery up in these
-- arrays too; they are few (one row per up to 50 deliveries) and short-lived.
CREATE INDEX outbox_several ON outbox (id) WHERE more_delivery_ids IS NOT NULL;
