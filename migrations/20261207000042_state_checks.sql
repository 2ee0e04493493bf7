-- Every column that holds a state lists exactly the names of its Rust enum, so the
-- database refuses a misspelt state written by hand (SQLSTATE 23514) as the code cannot
-- write one. Already checked since their tables were made, with exactly these names:
--   notification_deliveries.status   notify_core::DeliveryStatus (20261201000023)
--   delivery_attempts.outcome        notify_core::AttemptLabel   (20261130000001)
--   notification_endpoints.status    notify_core::EndpointStatus (20261130000001)
--   webhook_messages.status          notify_core::MessageStatus  (20261201000027)
-- A delivery's fail reason (notify_core::FailReason) has no column of its own: it is the
-- `error_code` of an attempt or the prefix of `last_error`, texts that also hold provider
-- codes, so no list can bound them.
-- New here: the queue of an outbox row's message, a channel's name (notify_core::Channel)
-- or `webhook` (notify_store::webhooks::OUTBOX_CHANNEL). The outbox holds transient rows,
-- so the check validates a short table.
-- notify-store's `state_checks` test compares each list with its enum.
ALTER TABLE outbox ADD CONSTRAINT outbox_channel_check
    CHECK (channel IN ('inapp', 'email', 'push', 'line', 'webhook'));
