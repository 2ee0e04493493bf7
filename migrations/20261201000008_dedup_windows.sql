-- Per-type dedup window: an event_key repeated within the same window bucket (aligned to
-- the Unix epoch in UTC: [k*W, (k+1)*W) seconds) is the same event; in the next bucket it
-- is a new one. The stored event_key is then '<caller key>|dedup@<bucket start>' and the
-- caller's key is kept in caller_key.
ALTER TABLE notification_types
    ADD COLUMN dedup_window_s integer NOT NULL DEFAULT 0 CHECK (dedup_window_s >= 0);
ALTER TABLE notification_events ADD COLUMN caller_key text;
CREATE INDEX notification_events_caller_key ON notification_events (caller_key, created_at)
    WHERE caller_key IS NOT NULL;
