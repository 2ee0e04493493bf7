-- Scheduled sends (issue 17): the due time a CreateEvent asked for (send_at, or the
-- planning instant plus delay). NULL = sent at once. The deliveries themselves wait in
-- notification_deliveries (next_attempt_at) and the outbox (available_at) until then.
ALTER TABLE notification_events ADD COLUMN send_at timestamptz;
