-- skipped: the delivery existed, but the rules at its due time said it may not go out
-- (preference turned off, LINE unfollowed, push endpoint revoked, address undeliverable).
-- Final; ended without a provider call. last_error holds the skip reason code and the
-- decision trail a line saying why and when.
ALTER TABLE notification_deliveries DROP CONSTRAINT notification_deliveries_status_check;
ALTER TABLE notification_deliveries ADD CONSTRAINT notification_deliveries_status_check
    CHECK (status IN ('pending', 'sending', 'sent', 'failed', 'canceled', 'skipped'));
