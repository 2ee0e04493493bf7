-- Fatigue caps: throttle_at is when a non-critical delivery on a capped channel counts
-- toward the user's per-hour cap (its scheduled time); over_cap is what a type does with a
-- notification over the cap: defer it to the next free slot, or drop it (skip reason
-- throttled).
ALTER TABLE notification_deliveries ADD COLUMN throttle_at timestamptz;
CREATE INDEX notification_deliveries_throttle ON notification_deliveries (user_id, throttle_at)
    WHERE throttle_at IS NOT NULL;
ALTER TABLE notification_types
    ADD COLUMN over_cap text NOT NULL DEFAULT 'defer' CHECK (over_cap IN ('defer', 'drop'));
