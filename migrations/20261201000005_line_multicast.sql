-- A topic event may ask for LINE multicast: its LINE deliveries are batches of up to 500
-- LINE user ids (address = the ids, comma-separated; provider line_multicast), one call and
-- one retry key per batch. LINE gives no per-recipient result for multicast.
ALTER TABLE notification_events ADD COLUMN line_multicast boolean NOT NULL DEFAULT false;
