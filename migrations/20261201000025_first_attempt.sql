-- When a delivery was first claimed for a provider call. A LINE retry key lives 24 hours
-- from the first request that carried it, so the retry horizon counts from here, not
-- from the delivery's creation (a scheduled send or an escalation is created days before
-- its first call). Not indexed: set in the claim's own row update.
ALTER TABLE notification_deliveries ADD COLUMN first_attempt_at timestamptz;
