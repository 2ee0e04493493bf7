-- Why each delivery or skip came out as it did (preference level applied, quiet hours),
-- one decision per line; and when quiet hours deferred a delivery's first attempt.
ALTER TABLE notification_deliveries
    ADD COLUMN deferred_until timestamptz,
    ADD COLUMN decision       text NOT NULL DEFAULT '';
ALTER TABLE delivery_skips ADD COLUMN decision text NOT NULL DEFAULT '';

-- channel = '*' is the user's switch for one type on every channel.
ALTER TABLE notification_preferences DROP CONSTRAINT notification_preferences_channel_check;
ALTER TABLE notification_preferences ADD CONSTRAINT notification_preferences_channel_check
    CHECK (channel IN ('inapp', 'email', 'push', 'line', '*'));
ALTER TABLE notification_preferences ADD CONSTRAINT notification_preferences_not_both_wild
    CHECK (NOT (type = '*' AND channel = '*'));
